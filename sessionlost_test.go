package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// A step that writes through Ctx.Tx and whose session is then ended before its commit (an
// operator's watchdog that ends long transactions, PgBouncer's idle_transaction_timeout, a
// statement that crashes its backend, a change of primary) hands its claim back, attempt
// restored, and runs again at once. Each such hand-back counts a recovery, with a "session" error
// in the history, as a claim the reaper releases does: a step that loses its session every time
// fails past ReaperConfig.MaxRecoveries instead of running again for ever with nothing recorded,
// and a child failed so settles its parent's join (TestTransactionalStepWhoseSessionDiesIsHandedBack
// has a step that loses it once and goes on).
func TestLostStepSessionsCountRecoveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, expand(`CREATE TABLE {schema}.lost_effects (id bigint)`, e.schema))
	require.NoError(t, err)

	var mu sync.Mutex
	runs := map[int64]int{}
	// work writes an effect through the step's transaction and, while kill says so, ends that
	// transaction's session from outside, as a watchdog would, before the step returns.
	work := func(ctx *gendurable.Ctx, kill func(run int) bool) error {
		mu.Lock()
		runs[ctx.ID]++
		run := runs[ctx.ID]
		mu.Unlock()
		tx, err := ctx.Tx()
		if err != nil {
			return err
		}
		var pid int32
		if err := tx.QueryRow(ctx, expand(`INSERT INTO {schema}.lost_effects VALUES ($1) RETURNING pg_backend_pid()`, e.schema),
			ctx.ID).Scan(&pid); err != nil {
			return err
		}
		if kill(run) {
			var ended bool
			if err := e.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ended); err != nil {
				return err
			}
			if !ended {
				return fmt.Errorf("the session of backend %d did not end", pid)
			}
		}
		return nil
	}
	always := func(int) bool { return true }
	once := func(run int) bool { return run == 1 }
	doomed := gendurable.Job[int]{Name: "doomed", Perform: func(ctx *gendurable.Ctx, _ int) error { return work(ctx, always) }}
	unlucky := gendurable.Job[int]{Name: "unlucky", Perform: func(ctx *gendurable.Ctx, _ int) error { return work(ctx, once) }}
	type joined struct{ Statuses []string }
	parent := gendurable.FSM[joined]{Name: "waiter", Start: "spawn", Steps: map[string]gendurable.StepFunc[joined]{
		"spawn": func(*gendurable.Ctx, joined) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{{Input: doomed.With(1)}, {Input: unlucky.With(2)}}, "join", joined{}), nil
		},
		"join": func(ctx *gendurable.Ctx, s joined) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				s.Statuses = append(s.Statuses, string(c.Status))
			}
			return gendurable.Done(s), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{doomed, unlucky, parent},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}},
		Reaper: &gendurable.ReaperConfig{MaxRecoveries: 3}})
	start(t, cl)
	d, err := cl.Insert(ctx, doomed.With(0), nil)
	require.NoError(t, err)
	p, err := cl.Insert(ctx, parent.With(joined{}), nil)
	require.NoError(t, err)

	res, err := cl.Await(ctx, d.ID, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitFailed, res.Status, "past MaxRecoveries the instance fails")
	require.ErrorContains(t, res.Err(), "past the limit of 3")
	in, err := cl.Get(ctx, d.ID)
	require.NoError(t, err)
	require.Len(t, in.Errors, 4, "one error per lost session: three recoveries, then the failure")
	for i, er := range in.Errors {
		require.Equal(t, "session", er.Kind, "loss %d", i+1)
		require.Equal(t, 1, er.Attempt, "a lost session costs no attempt (loss %d)", i+1)
		require.Contains(t, er.Error, "lost before its commit was acknowledged")
	}
	require.Contains(t, in.Errors[3].Error, "recovery 4 of this step, past the limit of 3")
	require.Equal(t, 3, in.Recoveries)

	res, err = cl.Await(ctx, p.ID, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, res.Status, "the failed child settled its parent's join")
	var out joined
	require.NoError(t, res.Decode(&out))
	require.Equal(t, []string{"failed", "done"}, out.Statuses)

	mu.Lock()
	defer mu.Unlock()
	effects := map[int64]int{}
	rows, err := e.pool.Query(ctx, expand(`SELECT id, count(*) FROM {schema}.lost_effects GROUP BY id`, e.schema))
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		effects[id] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 4, runs[d.ID], "the doomed step ran once, then once per recovery")
	require.Zero(t, effects[d.ID], "no write of an ended transaction committed")
	// The children: the doomed one ran four times and wrote nothing, the unlucky one (its
	// session ended once) twice, its second write committed.
	var kids []string
	for id, n := range runs {
		if id != d.ID {
			kids = append(kids, fmt.Sprintf("%d runs, %d effects", n, effects[id]))
		}
	}
	require.ElementsMatch(t, []string{"4 runs, 0 effects", "2 runs, 1 effects"}, kids)
}
