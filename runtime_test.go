package gendurable_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// linear is a five-step machine whose state records the path it took.
type path struct {
	I    int      `json:"i"`
	Path []string `json:"path"`
}

func linear(name string, delay time.Duration, onStep func(ctx *gendurable.Ctx)) gendurable.FSM[path] {
	steps := map[string]gendurable.StepFunc[path]{}
	names := []string{"s0", "s1", "s2", "s3", "s4"}
	for i, s := range names {
		steps[s] = func(ctx *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			if onStep != nil {
				onStep(ctx)
			}
			if delay > 0 {
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return gendurable.Outcome{}, context.Cause(ctx)
				}
			}
			p.I++
			p.Path = append(p.Path, s)
			if i == len(names)-1 {
				return gendurable.Done(p), nil
			}
			return gendurable.Next(names[i+1], p), nil
		}
	}
	return gendurable.FSM[path]{Name: name, Start: "s0", Steps: steps, Queue: "work"}
}

func TestClientWorksChainsToCompletion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := linear("linear5", 0, nil)
	var finished atomic.Int64
	cl := e.client(t, &gendurable.Config{
		Machines: []gendurable.Machine{m},
		Queues:   map[string]gendurable.QueueConfig{"work": {Concurrency: 20}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventStepFinished && ev.Outcome == "done" {
				finished.Add(1)
			}
		}},
	})
	start(t, cl)
	ctx := context.Background()
	params := make([]gendurable.InsertManyParams, 500)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: m.With(path{})}
	}
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 60*time.Second, "500 instances done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 500
	})
	// Every instance took the exact path once: state commits atomically with each outcome.
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances
		WHERE result <> '{"i":5,"path":["s0","s1","s2","s3","s4"]}'::jsonb`))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE locked_by IS NOT NULL OR locked_until IS NOT NULL`))
	eventually(t, 5*time.Second, "done events", func() bool { return finished.Load() == 500 })
}

func TestTransactionalStepCommitsWithItsOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE {schema}.ledger (instance bigint, attempt int)`)
	var fail atomic.Bool
	fail.Store(true)
	job := gendurable.Job[counter]{
		Name:        "ledger",
		MaxAttempts: 5,
		Backoff:     func(int) time.Duration { return 0 },
		Perform: func(ctx *gendurable.Ctx, _ counter) error {
			tx, err := ctx.Tx()
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, expand(`INSERT INTO {schema}.ledger VALUES ($1, $2)`, e.schema), ctx.ID, ctx.Attempt); err != nil {
				return err
			}
			if ctx.Attempt == 1 && fail.Load() {
				return errors.New("fail after writing: the write must not commit")
			}
			return nil
		},
	}
	cl := e.client(t, &gendurable.Config{
		Machines: []gendurable.Machine{job},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 4}},
	})
	start(t, cl)
	res, err := cl.Insert(context.Background(), job.With(counter{}), nil)
	require.NoError(t, err)
	eventually(t, 20*time.Second, "job done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 1
	})
	// The first try's write rolled back with its error; the second committed with Done.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.ledger WHERE instance = $1`, res.ID))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.ledger WHERE instance = $1 AND attempt = 2`, res.ID))
}

func TestStaleOutcomeIsDroppedAndTheNewOwnerKeepsTheRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// Worker A runs a step that blocks until released; its lease is taken from it meanwhile.
	release := make(chan struct{})
	var runs atomic.Int64
	blocking := gendurable.FSM[path]{
		Name: "slow", Start: "s0", Queue: "q",
		Steps: map[string]gendurable.StepFunc[path]{
			"s0": func(c *gendurable.Ctx, p path) (gendurable.Outcome, error) {
				if runs.Add(1) == 1 {
					<-release // A: outlives its lease, ignoring its context
					return gendurable.Next("s1", path{I: 100, Path: []string{"A"}}), nil
				}
				return gendurable.Next("s1", path{I: 1, Path: []string{"B"}}), nil
			},
			"s1": func(c *gendurable.Ctx, p path) (gendurable.Outcome, error) {
				return gendurable.Retry(time.Hour), nil // park B's progress visibly at s1
			},
		},
	}
	var stale atomic.Int64
	hook := func(ev gendurable.Event) {
		if ev.Name == gendurable.EventOutcomeStale {
			stale.Add(1)
		}
	}
	a := e.client(t, &gendurable.Config{
		Name: "a", Machines: []gendurable.Machine{blocking}, Hooks: []func(gendurable.Event){hook},
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1}}, Reaper: &gendurable.ReaperConfig{Disabled: true},
		Lease: time.Minute,
	})
	start(t, a)
	res, err := a.Insert(ctx, blocking.With(path{}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "A runs the step", func() bool { return runs.Load() == 1 })

	// A's lease runs out (as if it had stopped heartbeating); B's reaper reclaims the row and B
	// runs the step to s1.
	e.exec(t, `UPDATE {schema}.instances SET locked_until = now() - interval '1 second' WHERE id = $1`, res.ID)
	b := e.client(t, &gendurable.Config{
		Name: "b", Machines: []gendurable.Machine{blocking},
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1}},
		Reaper: &gendurable.ReaperConfig{Interval: 20 * time.Millisecond},
	})
	start(t, b)
	eventually(t, 10*time.Second, "B moves the row to s1", func() bool {
		in, err := b.Get(ctx, res.ID)
		require.NoError(t, err)
		return in.Step == "s1" && in.Attempt >= 1
	})
	lockedByB, err := b.Get(ctx, res.ID)
	require.NoError(t, err)

	// A finishes late: its commit is fenced out and reported.
	close(release)
	eventually(t, 10*time.Second, "outcome.stale", func() bool { return stale.Load() == 1 })
	in, err := b.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, "s1", in.Step)
	require.JSONEq(t, `{"i":1,"path":["B"]}`, string(in.State), "the row keeps B's progress")
	require.Equal(t, "lease", in.Errors[0].Kind)
	require.GreaterOrEqual(t, in.Attempt, lockedByB.Attempt)
}

func TestHeartbeatKeepsALongStepOwned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var runs atomic.Int64
	// A lease of 2s, beats every 100ms: the premise is that some beat lands within each lease,
	// and with both cores busy beside the suite a beat was once held up past a lease of 1s.
	m := linear("long", 0, func(ctx *gendurable.Ctx) {
		if ctx.Step == "s0" {
			runs.Add(1)
			time.Sleep(5 * time.Second) // two and a half leases long
		}
	})
	cfg := &gendurable.Config{
		Machines: []gendurable.Machine{m}, Lease: 2 * time.Second, Heartbeat: 100 * time.Millisecond,
		Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 2}},
		Reaper: &gendurable.ReaperConfig{Interval: 50 * time.Millisecond},
	}
	cl := e.client(t, cfg)
	start(t, cl)
	other := e.client(t, &gendurable.Config{Name: "other", Machines: cfg.Machines, Lease: cfg.Lease,
		Heartbeat: cfg.Heartbeat, Queues: cfg.Queues, Reaper: cfg.Reaper})
	start(t, other)
	res, err := cl.Insert(context.Background(), m.With(path{}), nil)
	require.NoError(t, err)
	eventually(t, 20*time.Second, "done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 1
	})
	require.Equal(t, int64(1), runs.Load(), "a heartbeating step is never reclaimed")
	in, err := cl.Get(context.Background(), res.ID)
	require.NoError(t, err)
	require.Empty(t, in.Errors)
}

func TestStopDrainsThenReleases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	started := map[string]int{}
	job := gendurable.Job[mailArgs]{
		Name: "stopper",
		Perform: func(c *gendurable.Ctx, a mailArgs) error {
			mu.Lock()
			started[a.To]++
			mu.Unlock()
			d := 50 * time.Millisecond
			if a.To == "slow" {
				d = time.Hour
			}
			select {
			case <-time.After(d):
				return nil
			case <-c.Done():
				return context.Cause(c)
			}
		},
	}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 5}}})
	require.NoError(t, cl.Start(ctx))
	fast, err := cl.Insert(ctx, job.With(mailArgs{To: "fast"}), nil)
	require.NoError(t, err)
	slow, err := cl.Insert(ctx, job.With(mailArgs{To: "slow"}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "both started", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return started["fast"] == 1 && started["slow"] == 1
	})
	stopCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	require.NoError(t, cl.Stop(stopCtx))

	// The fast step finished inside the drain and its outcome committed; the slow one was
	// cancelled and its claim handed back untouched (attempt restored, no error recorded).
	in, err := cl.Get(ctx, fast.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, in.Status)
	in, err = cl.Get(ctx, slow.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
	require.Equal(t, 0, in.Attempt)
	require.Empty(t, in.LockedBy)
	require.Empty(t, in.Errors)
}

func TestRowOfAnUnknownMachineIsHandedBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	m := linear("known-elsewhere", 0, nil)
	var unknown atomic.Int64
	// This node works queue "work" but does not know the machine.
	blind := e.client(t, &gendurable.Config{
		Name: "blind", Queues: map[string]gendurable.QueueConfig{"work": {}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventFSMUnknown {
				unknown.Add(1)
			}
		}},
	})
	start(t, blind)
	res, err := blind.Insert(ctx, m.With(path{}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "fsm.unknown", func() bool { return unknown.Load() >= 1 })
	var in *gendurable.Instance
	eventually(t, 10*time.Second, "the claim handed back", func() bool {
		var err error
		in, err = blind.Get(ctx, res.ID)
		require.NoError(t, err)
		return in.Status == gendurable.StatusAvailable
	})
	require.Equal(t, 0, in.Attempt, "handing back does not spend an attempt")
	require.Empty(t, in.Errors)
	require.True(t, in.ScheduledAt.After(time.Now()), "handed back with a delay, so the blind node does not spin on it")

	// A node that knows it completes it.
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() WHERE id = $1`, res.ID)
	knows := e.client(t, &gendurable.Config{Name: "knows", Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"work": {}}, PollInterval: 50 * time.Millisecond})
	start(t, knows)
	eventually(t, 20*time.Second, "done elsewhere", func() bool {
		in, err := knows.Get(ctx, res.ID)
		require.NoError(t, err)
		return in.Status == gendurable.StatusDone
	})
}

// The committer sends one outcome statement at a time, but one that cannot finish (here it waits
// on a row lock another transaction holds) does not hold back the outcomes behind it: they go
// beside it after a short wait, and the blocked one commits once the lock is gone.
func TestAStuckOutcomeStatementDoesNotHoldBackOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// Instance A's row is locked while its step runs, so its outcome statement waits.
	running, locked := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	job := gendurable.Job[counter]{Name: "quick", Perform: func(*gendurable.Ctx, counter) error {
		if first.CompareAndSwap(false, true) {
			close(running)
			<-locked
		}
		return nil
	}}
	cl := e.client(t, &gendurable.Config{
		Machines: []gendurable.Machine{job},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 4}},
	})
	a, err := cl.Insert(ctx, job.With(counter{}), nil)
	require.NoError(t, err)
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	start(t, cl)
	<-running
	_, err = tx.Exec(ctx, expand(`SELECT 1 FROM {schema}.instances WHERE id = $1 FOR UPDATE`, e.schema), a.ID)
	require.NoError(t, err)
	var xid string
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid))
	close(locked)
	eventually(t, 10*time.Second, "A's outcome statement waits on the row lock", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND transactionid::text = $1 AND NOT granted`, xid) > 0
	})
	// Outcomes that finish meanwhile commit while A's statement is still waiting.
	var later []int64
	for range 20 {
		r, err := cl.Insert(ctx, job.With(counter{}), nil)
		require.NoError(t, err)
		later = append(later, r.ID)
		time.Sleep(5 * time.Millisecond)
	}
	eventually(t, 10*time.Second, "the later instances done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'done'`, later) == len(later)
	})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'executing'`, a.ID),
		"A's outcome cannot have committed while its row was locked")
	require.NoError(t, tx.Rollback(ctx))
	eventually(t, 10*time.Second, "A done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, a.ID) == 1
	})
}

// A step's transaction whose session dies before its outcome commits (a primary that changed, a
// terminated backend) hands its claim back at once: the step runs again as soon as the database
// answers, long before its lease (a minute here) could have run out, and only the second try's
// write commits.
func TestTransactionalStepWhoseSessionDiesIsHandedBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE {schema}.ledger (instance bigint, attempt int, try int)`)
	var tries atomic.Int64
	job := gendurable.Job[counter]{
		Name: "ledger",
		Perform: func(c *gendurable.Ctx, _ counter) error {
			try := tries.Add(1)
			tx, err := c.Tx()
			if err != nil {
				return err
			}
			if _, err := tx.Exec(c, expand(`INSERT INTO {schema}.ledger VALUES ($1, $2, $3)`, e.schema), c.ID, c.Attempt, try); err != nil {
				return err
			}
			if try == 1 {
				// The server ends the transaction's session before the engine commits it.
				pid := tx.Conn().PgConn().PID()
				e.exec(t, `SELECT pg_terminate_backend($1)`, pid)
				eventually(t, 10*time.Second, "the backend gone", func() bool {
					return e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == 0
				})
			}
			return nil
		},
	}
	cl := e.client(t, &gendurable.Config{
		Machines: []gendurable.Machine{job},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 2}},
		Lease:    time.Minute,
	})
	start(t, cl)
	res, err := cl.Insert(ctx, job.With(counter{}), nil)
	require.NoError(t, err)
	// Done well within the lease: only the hand-back, not the reaper, can have made it runnable.
	eventually(t, 50*time.Second, "job done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, res.ID) == 1
	})
	require.EqualValues(t, 2, tries.Load())
	// The first try's write was lost with its session; the second's committed, on the same
	// attempt (a hand-back is not a failure: it counts a recovery), and no lease ran out.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.ledger WHERE instance = $1`, res.ID))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.ledger WHERE instance = $1 AND try = 2 AND attempt = 1`, res.ID))
	in, err := cl.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, 1, in.Recoveries)
	require.Len(t, in.Errors, 1, "the lost session, and no lease error")
	require.Equal(t, "session", in.Errors[0].Kind)
	require.Equal(t, 1, in.Errors[0].Attempt)
}
