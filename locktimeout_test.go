package gendurable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A lock_timeout on the application's role (a common guard) cuts an outcome's wait for a row
// lock short with lock_not_available (55P03): here a transaction of the test's holds the
// executing row while its step finishes. That is a transient wait, not the outcome's fault: the
// committer retries it, and once the lock is gone the instance moves on, its step run once,
// neither failed ("rejected") nor left to the reaper ("lease").
func TestOutcomeRetriedAfterALockTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool := durabledbtest.Pool(t, 8, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["lock_timeout"] = "50ms" })

	var runs atomic.Int32
	started, release := make(chan int64, 1), make(chan struct{})
	m := gendurable.FSM[int]{Name: "held", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
		"a": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			runs.Add(1)
			started <- ctx.ID
			<-release
			return gendurable.Next("b", s+1), nil
		},
		"b": func(_ *gendurable.Ctx, s int) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
	}}
	failed := make(chan error, 100)
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 2}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventCommitFailed {
				select {
				case failed <- ev.Err:
				default:
				}
			}
		}}})
	require.NoError(t, err)
	start(t, cl)
	r, err := cl.Insert(ctx, m.With(0), nil)
	require.NoError(t, err)
	var id int64
	select {
	case id = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the step did not start")
	}
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, expand(`SELECT 1 FROM {schema}.instances WHERE id = $1 FOR UPDATE`, e.schema), id)
	require.NoError(t, err)
	close(release)
	select {
	case err := <-failed:
		require.ErrorContains(t, err, "lock timeout", "the outcome's first try waited on the held row")
	case <-time.After(10 * time.Second):
		t.Fatal("the outcome's commit never failed on the held row")
	}
	require.NoError(t, tx.Commit(ctx))

	res, err := cl.Await(ctx, r.ID, 30*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, res.Status)
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, in.Errors, "no error recorded: neither a rejection nor a lost lease")
	require.Equal(t, int32(1), runs.Load(), "the step ran once")
}

// A client's Start writes its row in the node registry. If that waits past the role's
// lock_timeout (an operator's migration holding the table for a moment, say), Start tries again
// instead of failing: a database busy or locked for a moment does not stop a node from starting.
// Before, Start returned the lock timeout (55P03).
func TestStartOutlastsABriefLockOnTheRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool := durabledbtest.Pool(t, 8, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["lock_timeout"] = "50ms" })
	job := gendurable.Job[int]{Name: "j", Perform: func(*gendurable.Ctx, int) error { return nil }}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 1}}})
	require.NoError(t, err)

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, expand(`LOCK TABLE {schema}.nodes IN ACCESS EXCLUSIVE MODE`, e.schema))
	require.NoError(t, err)
	waited := make(chan struct{})
	go func() {
		// Start's wait for the lock shows in pg_locks as a lock on the table not granted.
		defer close(waited)
		for until := time.Now().Add(20 * time.Second); time.Now().Before(until); time.Sleep(5 * time.Millisecond) {
			var n int
			err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`,
				expand(`{schema}.nodes`, e.schema)).Scan(&n)
			if err != nil || n > 0 {
				return
			}
		}
	}()
	started := make(chan error, 1)
	go func() { started <- cl.Start(ctx) }()
	<-waited
	// Held a little longer than one wait, then released.
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-started, "Start failed on a lock held for a moment")
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, cl.Stop(stopCtx))
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.nodes`, e.schema)).Scan(&n))
	require.Zero(t, n, "Stop deletes the row Start wrote")
}
