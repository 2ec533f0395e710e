package gendurable_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// blocker is a job that runs until its context ends (reporting the cause) or it is released.
type blocker struct {
	started chan int64
	causes  chan error
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{started: make(chan int64, 100), causes: make(chan error, 100), release: make(chan struct{})}
}

func (b *blocker) job(queue string) gendurable.Job[struct{}] {
	return gendurable.Job[struct{}]{Name: "blocker", Queue: queue, MaxAttempts: 1,
		Perform: func(ctx *gendurable.Ctx, _ struct{}) error {
			b.started <- ctx.ID
			select {
			case <-ctx.Done():
				b.causes <- context.Cause(ctx)
				return context.Cause(ctx)
			case <-b.release:
				return nil
			}
		}}
}

func TestCancelRunnableAndParkedInstances(t *testing.T) {
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{taskFSM("tasks")},
		Queues: map[string]gendurable.QueueConfig{"tasks": {}}})
	start(t, cl)
	ctx := context.Background()

	// Nobody works "idle": the instance stays available.
	res, err := cl.Insert(ctx, taskFSM("idle").With(task{Mode: "done"}), nil)
	require.NoError(t, err)
	require.NoError(t, cl.Cancel(ctx, res.ID, "the customer gave up"))
	in, err := cl.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusCancelled, in.Status)
	require.NotNil(t, in.FinalizedAt)
	require.Equal(t, "cancel", in.Errors[len(in.Errors)-1].Kind)
	require.Equal(t, "the customer gave up", in.Errors[len(in.Errors)-1].Error)
	a, err := cl.Await(ctx, res.ID, time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitCancelled, a.Status)
	require.ErrorContains(t, a.Err(), "the customer gave up")

	require.ErrorIs(t, cl.Cancel(ctx, res.ID, ""), gendurable.ErrWrongStatus)
	require.ErrorIs(t, cl.Cancel(ctx, 1<<40, ""), gendurable.ErrNotFound)

	// A parked instance with signals in its inbox: the inbox goes with it.
	id := insertTask(t, cl, "park", 1)
	a, err = cl.Await(ctx, id, 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitAwaiting, a.Status)
	_, err = cl.Signal(ctx, gendurable.ByID(id), "unrelated", map[string]int{"n": 1})
	require.NoError(t, err)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, id))
	require.NoError(t, cl.Cancel(ctx, id, ""))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, id))
	_, err = cl.Signal(ctx, gendurable.ByID(id), "go", nil)
	require.ErrorIs(t, err, gendurable.ErrNoTarget)
}

// A running step sees its context cancelled (at once on its own client, by the heartbeat on
// another), its late outcome is dropped, and the gate slot it held is given back.
func TestCancelRunningStep(t *testing.T) {
	for _, where := range []string{"same client", "other client"} {
		t.Run(where, func(t *testing.T) {
			e := newEnv(t)
			b := newBlocker()
			var stale atomic.Int64
			hook := func(ev gendurable.Event) {
				if ev.Name == gendurable.EventOutcomeStale {
					stale.Add(1)
				}
			}
			worker := e.client(t, &gendurable.Config{Name: "worker", Machines: []gendurable.Machine{b.job("jobs")},
				Queues: map[string]gendurable.QueueConfig{"jobs": {}}, Lease: 600 * time.Millisecond, Hooks: []func(gendurable.Event){hook},
				ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"api": {Limit: 1}}})
			start(t, worker)
			op := worker
			if where == "other client" {
				op = e.client(t, &gendurable.Config{Name: "operator"})
			}
			ctx := context.Background()
			res, err := op.Insert(ctx, b.job("jobs").With(struct{}{}), &gendurable.InsertOpts{ConcurrencyKey: "api:acme"})
			require.NoError(t, err)
			require.Equal(t, res.ID, <-b.started)
			require.Equal(t, 1, e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`))

			require.NoError(t, op.Cancel(ctx, res.ID, "stop it"))
			select {
			case cause := <-b.causes:
				if where == "same client" {
					require.ErrorIs(t, cause, gendurable.ErrCancelled)
				} else {
					require.ErrorIs(t, cause, gendurable.ErrLeaseLost)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("the running step's context was not cancelled")
			}
			eventually(t, 3*time.Second, "the late outcome dropped", func() bool { return stale.Load() == 1 })
			in, err := op.Get(ctx, res.ID)
			require.NoError(t, err)
			require.Equal(t, gendurable.StatusCancelled, in.Status)
			require.Empty(t, in.LockedBy)
			require.Zero(t, e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`), "the gate slot was not given back")

			// The slot is free: the next instance of the key runs.
			next, err := op.Insert(ctx, b.job("jobs").With(struct{}{}), &gendurable.InsertOpts{ConcurrencyKey: "api:acme"})
			require.NoError(t, err)
			select {
			case id := <-b.started:
				require.Equal(t, next.ID, id)
			case <-time.After(3 * time.Second):
				t.Fatal("the gate stayed held after the cancel")
			}
			close(b.release)
		})
	}
}

// Cancelled children settle their parked parent's join like finished ones.
func TestCancelledChildrenStillJoin(t *testing.T) {
	e := newEnv(t)
	child := gendurable.Job[struct{}]{Name: "held", Queue: "nobody", Perform: func(*gendurable.Ctx, struct{}) error { return nil }}
	var seen []gendurable.Status
	parent := gendurable.FSM[struct{}]{Name: "parent", Start: "fan", Queue: "parents", Steps: map[string]gendurable.StepFunc[struct{}]{
		"fan": func(ctx *gendurable.Ctx, s struct{}) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{{Input: child.With(s)}, {Input: child.With(s)}}, "join", s), nil
		},
		"join": func(ctx *gendurable.Ctx, s struct{}) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				seen = append(seen, c.Status)
			}
			return gendurable.Done(s), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{parent, child},
		Queues: map[string]gendurable.QueueConfig{"parents": {}}})
	start(t, cl)
	ctx := context.Background()
	res, err := cl.Insert(ctx, parent.With(struct{}{}), nil)
	require.NoError(t, err)
	eventually(t, 5*time.Second, "the parent to join", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'joining'`, res.ID) == 1
	})
	var kids []int64
	rows, err := e.pool.Query(ctx, expand(`SELECT id FROM {schema}.instances WHERE parent_id = $1 ORDER BY id`, e.schema), res.ID)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		kids = append(kids, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, kids, 2)

	// Retrying a child while its parent is live would count it twice.
	require.NoError(t, cl.Cancel(ctx, kids[0], ""))
	require.ErrorIs(t, cl.Retry(ctx, kids[0], nil), gendurable.ErrWrongStatus)
	require.NoError(t, cl.Cancel(ctx, kids[1], ""))
	a, err := cl.Await(ctx, res.ID, 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, a.Status)
	require.Equal(t, []gendurable.Status{gendurable.StatusCancelled, gendurable.StatusCancelled}, seen)
}

func TestRetryAFailedInstanceKeepsItsHistory(t *testing.T) {
	e := newEnv(t)
	var fail atomic.Bool
	fail.Store(true)
	m := gendurable.FSM[task]{Name: "flaky", Start: "a", Queue: "tasks", Steps: map[string]gendurable.StepFunc[task]{
		"a": func(ctx *gendurable.Ctx, s task) (gendurable.Outcome, error) {
			s.Value++
			return gendurable.Next("b", s), nil
		},
		"b": func(ctx *gendurable.Ctx, s task) (gendurable.Outcome, error) {
			if fail.Load() {
				return gendurable.Stop(errors.New("the bank is down")), nil
			}
			s.Value += 10
			return gendurable.Done(s), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, Queues: map[string]gendurable.QueueConfig{"tasks": {}}})
	start(t, cl)
	ctx := context.Background()
	res, err := cl.Insert(ctx, m.With(task{}), nil)
	require.NoError(t, err)
	a, err := cl.Await(ctx, res.ID, 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitFailed, a.Status)

	require.ErrorIs(t, cl.Retry(ctx, res.ID, &gendurable.RetryOpts{Step: "nope"}), gendurable.ErrUnknownStep)
	var ie *gendurable.InputError
	require.ErrorAs(t, cl.Retry(ctx, res.ID, &gendurable.RetryOpts{Step: "nope"}), &ie)
	require.Equal(t, "Step", ie.Field)

	fail.Store(false)
	require.NoError(t, cl.Retry(ctx, res.ID, nil)) // from the step it failed at: "a" does not run again
	a, err = cl.Await(ctx, res.ID, 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, a.Status)
	var out task
	require.NoError(t, a.Decode(&out))
	require.Equal(t, 11, out.Value)
	require.Len(t, a.Instance.Errors, 1, "the history of the failed run stays")
	require.Equal(t, "the bank is down", a.Instance.Errors[0].Error)

	require.ErrorIs(t, cl.Retry(ctx, res.ID, nil), gendurable.ErrWrongStatus, "a done instance")
	require.ErrorIs(t, cl.Retry(ctx, 1<<40, nil), gendurable.ErrNotFound)
}

// Cancels racing the workers over gated instances: every instance ends done or cancelled, the
// gate counters end at zero, no inbox is left behind, and nothing deadlocks.
func TestCancelsRacingTheWorkers(t *testing.T) {
	e := newDeadlockFreeEnv(t)
	job := gendurable.Job[int]{Name: "work", Queue: "race", Perform: func(ctx *gendurable.Ctx, n int) error {
		time.Sleep(time.Duration(n%5) * time.Millisecond)
		return nil
	}}
	cfg := &gendurable.Config{Machines: []gendurable.Machine{job}, Queues: map[string]gendurable.QueueConfig{"race": {Concurrency: 16}},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"g": {Limit: 4, Shards: 2}}}
	w1 := e.client(t, &gendurable.Config{Name: "w1", Machines: cfg.Machines, Queues: cfg.Queues, ConcurrencyLimits: cfg.ConcurrencyLimits})
	w2 := e.client(t, &gendurable.Config{Name: "w2", Machines: cfg.Machines, Queues: cfg.Queues, ConcurrencyLimits: cfg.ConcurrencyLimits})
	const n = 400
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(i), Opts: &gendurable.InsertOpts{ConcurrencyKey: "g:" + string(rune('a'+i%3))}}
	}
	res, err := w1.InsertMany(context.Background(), params)
	require.NoError(t, err)
	start(t, w1)
	start(t, w2)
	var wg sync.WaitGroup
	var cancelled, refused atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for _, x := range r.Perm(n)[:n/2] {
				err := w2.Cancel(context.Background(), res[x].ID, "race")
				switch {
				case err == nil:
					cancelled.Add(1)
				case errors.Is(err, gendurable.ErrWrongStatus):
					refused.Add(1)
				default:
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	eventually(t, 30*time.Second, "every instance finished", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status NOT IN ('done', 'cancelled')`) == 0
	})
	require.Equal(t, int(cancelled.Load()), e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'cancelled'`))
	require.Positive(t, cancelled.Load())
	require.Zero(t, e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`), "gate counters drifted")
	// No deadlock between the cancels and the workers: the env's database counts none when the
	// test ends.
}
