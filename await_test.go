package gendurable_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// task is a one-step machine whose state says how it ends.
type task struct {
	Mode  string `json:"mode"` // done, fail, park, slow
	Value int    `json:"value,omitempty"`
}

func taskFSM(queue string) gendurable.FSM[task] {
	return gendurable.FSM[task]{
		Name: "task", Start: "run", Queue: queue,
		Steps: map[string]gendurable.StepFunc[task]{
			"run": func(ctx *gendurable.Ctx, s task) (gendurable.Outcome, error) {
				switch s.Mode {
				case "fail":
					return gendurable.Stop(errors.New("refused by the test")), nil
				case "park":
					return gendurable.Await([]string{"go"}, "finish", s), nil
				case "slow":
					select {
					case <-time.After(300 * time.Millisecond):
					case <-ctx.Done():
						return gendurable.Outcome{}, context.Cause(ctx)
					}
				}
				return gendurable.Done(task{Mode: s.Mode, Value: s.Value * 2}), nil
			},
			"finish": func(ctx *gendurable.Ctx, s task) (gendurable.Outcome, error) {
				return gendurable.Done(task{Mode: "finished", Value: s.Value}), nil
			},
		},
	}
}

func insertTask(t *testing.T, cl *gendurable.Client, mode string, value int) int64 {
	t.Helper()
	res, err := cl.Insert(context.Background(), taskFSM("tasks").With(task{Mode: mode, Value: value}), nil)
	require.NoError(t, err)
	return res.ID
}

func TestAwaitAnswersEachWay(t *testing.T) {
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{taskFSM("tasks")},
		Queues: map[string]gendurable.QueueConfig{"tasks": {Concurrency: 4}}})
	start(t, cl)
	ctx := context.Background()

	t.Run("done", func(t *testing.T) {
		r, err := cl.Await(ctx, insertTask(t, cl, "done", 21), 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, r.Status)
		var out task
		require.NoError(t, r.Decode(&out))
		require.Equal(t, 42, out.Value)
		require.NoError(t, r.Err())
	})
	t.Run("failed", func(t *testing.T) {
		id := insertTask(t, cl, "fail", 0)
		r, err := cl.Await(ctx, id, 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitFailed, r.Status)
		var ie *gendurable.InstanceError
		require.ErrorAs(t, r.Err(), &ie)
		require.Equal(t, id, ie.ID)
		require.Contains(t, ie.Error(), "refused by the test")
		require.Error(t, r.Decode(&task{}), "a failed instance has no result to decode")
	})
	t.Run("awaiting, then through the park", func(t *testing.T) {
		id := insertTask(t, cl, "park", 7)
		r, err := cl.Await(ctx, id, 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitAwaiting, r.Status)
		require.Equal(t, []string{"go"}, r.Instance.AwaitNames)

		got := make(chan *gendurable.AwaitResult, 1)
		go func() {
			r, err := cl.Await(ctx, id, 5*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
			if err != nil {
				t.Error(err)
			}
			got <- r
		}()
		time.Sleep(100 * time.Millisecond)
		select {
		case r := <-got:
			t.Fatalf("UntilTerminal answered %s while the instance was parked", r.Status)
		default:
		}
		_, err = cl.Signal(ctx, gendurable.ByID(id), "go", nil)
		require.NoError(t, err)
		r = <-got
		require.Equal(t, gendurable.AwaitDone, r.Status)
		require.Equal(t, "finish", r.Instance.Step)
	})
	t.Run("busy, then the retry is the same call", func(t *testing.T) {
		id := insertTask(t, cl, "slow", 1)
		r, err := cl.Await(ctx, id, 50*time.Millisecond, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitBusy, r.Status)
		require.Equal(t, id, r.Instance.ID)
		require.False(t, r.Instance.Status.Terminal())
		r, err = cl.Await(ctx, id, 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, r.Status)
	})
	t.Run("not found", func(t *testing.T) {
		r, err := cl.Await(ctx, 1<<40, time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitNotFound, r.Status)
		require.Nil(t, r.Instance)
	})
	t.Run("the caller's context ends first", func(t *testing.T) {
		id := insertTask(t, cl, "park", 0)
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := cl.Await(cctx, id, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

func TestAwaitBadInput(t *testing.T) {
	e := newEnv(t)
	cl := e.client(t, nil)
	for _, tc := range []struct {
		id      int64
		timeout time.Duration
		field   string
	}{
		{1, 0, "timeout"},
		{1, -time.Second, "timeout"},
		{0, time.Second, "id"},
		{-5, time.Second, "id"},
	} {
		_, err := cl.Await(context.Background(), tc.id, tc.timeout, nil)
		var ie *gendurable.InputError
		require.ErrorAs(t, err, &ie, "id %d timeout %v", tc.id, tc.timeout)
		require.Equal(t, tc.field, ie.Field)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	}
}

// A completion on the waiter's own client is pushed: it arrives long before the watcher's tick.
func TestAwaitPushesSameNodeCompletion(t *testing.T) {
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{taskFSM("tasks")},
		Queues:       map[string]gendurable.QueueConfig{"tasks": {Concurrency: 4}},
		PollInterval: 10 * time.Second, AwaitTick: 10 * time.Second})
	start(t, cl)
	for range 20 {
		began := time.Now()
		r, err := cl.Await(context.Background(), insertTask(t, cl, "done", 1), 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, r.Status)
		require.Less(t, time.Since(began), time.Second, "an answer pushed by this client waited for the tick")
	}
}

// A waiter on one client sees an instance settled on another within the tick; a client that was
// never started answers by polling the row itself.
func TestAwaitAcrossClientsAndWithoutStart(t *testing.T) {
	e := newEnv(t)
	worker := e.client(t, &gendurable.Config{Name: "worker", Machines: []gendurable.Machine{taskFSM("tasks")},
		Queues: map[string]gendurable.QueueConfig{"tasks": {Concurrency: 4}}})
	start(t, worker)
	web := e.client(t, &gendurable.Config{Name: "web", AwaitTick: 20 * time.Millisecond})
	start(t, web)
	bare := e.client(t, &gendurable.Config{Name: "bare", AwaitTick: 20 * time.Millisecond})

	for _, cl := range []*gendurable.Client{web, bare} {
		id := insertTask(t, cl, "slow", 5)
		r, err := cl.Await(context.Background(), id, 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, r.Status)
		var out task
		require.NoError(t, r.Decode(&out))
		require.Equal(t, 10, out.Value)
	}
}

// probeCounter counts the await watcher's probe statements (arrays of more than one id) sent
// through a pool, and the probes of a single id, and the most of them in flight at once.
type probeCounter struct {
	n, single, inFlight, maxInFlight atomic.Int64
}

type probeKey struct{}

func (p *probeCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "unnest($1::bigint[], $2::bool[], $3::bool[])") && len(d.Args) > 0 {
		if ids, ok := d.Args[0].([]int64); ok && len(ids) > 1 {
			p.n.Add(1)
		} else if ok && len(ids) == 1 {
			p.single.Add(1)
		}
		now := p.inFlight.Add(1)
		for m := p.maxInFlight.Load(); now > m && !p.maxInFlight.CompareAndSwap(m, now); m = p.maxInFlight.Load() {
		}
		return context.WithValue(ctx, probeKey{}, true)
	}
	return ctx
}

func (p *probeCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(probeKey{}) != nil {
		p.inFlight.Add(-1)
	}
}

// A thousand callers waiting on one client cost one probe statement per tick, and none once
// they are gone. Their first reads are batched too: a burst of callers does not queue a read
// each for the pool's connections (which held callers with short timeouts past them, T16).
func TestAwaitThousandWaitersOneProbePerTick(t *testing.T) {
	e := newEnv(t)
	cfg, err := pgxpool.ParseConfig(durabledbtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 8
	probes := &probeCounter{}
	cfg.ConnConfig.Tracer = probes
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const tick = 50 * time.Millisecond
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, AwaitTick: tick})
	require.NoError(t, err)
	start(t, cl)

	// Nobody works the queue "parked": the instances stay available, so every waiter waits.
	params := make([]gendurable.InsertManyParams, 1000)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: taskFSM("parked").With(task{Mode: "done"})}
	}
	res, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)

	var wg sync.WaitGroup
	answers := make(chan gendurable.AwaitStatus, len(res))
	began := time.Now()
	for _, r := range res {
		wg.Go(func() {
			a, err := cl.Await(context.Background(), r.ID, 3*time.Second, nil)
			if err != nil {
				t.Error(err)
				return
			}
			answers <- a.Status
		})
	}
	time.Sleep(time.Second) // every waiter has registered and made its first read
	before := probes.n.Load()
	time.Sleep(time.Second)
	during := probes.n.Load() - before
	ticks := int64(time.Second / tick)
	require.GreaterOrEqual(t, during, ticks/2, "the watcher probed less than once per tick")
	require.LessOrEqual(t, during, ticks+2, "the watcher probed more than once per tick")
	wg.Wait()
	close(answers)
	for a := range answers {
		require.Equal(t, gendurable.AwaitBusy, a)
	}
	// A deadline read the watcher had already sent may finish after its caller gave up on it
	// (the caller answers busy with the row it read last): let it land, then watch.
	time.Sleep(2 * tick)
	idle := probes.n.Load()
	time.Sleep(5 * tick)
	require.Equal(t, idle, probes.n.Load(), "the watcher probed with nobody waiting")
	// Without the batching, each of the thousand would have read its row on its own at least
	// once: over 1,000 statements, as many at once as the pool has connections. Batched: the
	// ticks' probes, and the hot reads (first and last reads) of whoever registered or reached
	// its deadline since the hot reader's previous statement, never more than one of each in
	// flight. How many hot statements that makes depends on how fast the callers' goroutines
	// start (a busy machine starts them in more, smaller groups), so the count is bounded by the
	// unbatched one, and the flight by the two readers.
	total := probes.n.Load() + probes.single.Load()
	require.Less(t, total, int64(len(res)), "the waiters' reads were not batched")
	require.LessOrEqual(t, probes.maxInFlight.Load(), int64(2), "more than the two readers' statements in flight at once")
	t.Logf("%d probe statements over %v (%d ticks), at most %d in flight", total, time.Since(began).Round(time.Millisecond),
		time.Since(began)/tick, probes.maxInFlight.Load())
}

// Await answers within its timeout + AwaitTick even when the database cannot: here every
// connection of the pool is taken. A waiter on a started client and one on a client that was
// never started (which reads the row itself) both get an error that says so, in time; a waiter
// whose row was read before the stall gets busy with that row, in time.
func TestAwaitAnswersByTheDeadlineWhenTheDatabaseIsSlow(t *testing.T) {
	e := newEnv(t)
	cfg, err := pgxpool.ParseConfig(durabledbtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const tick = 25 * time.Millisecond
	quiet := &gendurable.Config{Schema: e.schema, AwaitTick: tick, Reaper: &gendurable.ReaperConfig{Disabled: true},
		GC: &gendurable.GCConfig{Disabled: true}}
	started, err := gendurable.NewClient(pool, quiet)
	require.NoError(t, err)
	start(t, started)
	bare, err := gendurable.NewClient(pool, quiet)
	require.NoError(t, err)
	id := insertTask(t, started, "done", 1) // nobody works the queue

	var held []*pgxpool.Conn
	for range cfg.MaxConns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		held = append(held, c)
	}
	var releaseOnce sync.Once
	release := func() {
		releaseOnce.Do(func() {
			for _, c := range held {
				c.Release()
			}
		})
	}
	// A waiter that waits for a connection would wait for this.
	time.AfterFunc(3*time.Second, release)
	for name, cl := range map[string]*gendurable.Client{"started": started, "bare": bare} {
		for _, timeout := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
			began := time.Now()
			_, err := cl.Await(context.Background(), id, timeout, nil)
			took := time.Since(began)
			require.ErrorIs(t, err, context.DeadlineExceeded, "%s client, timeout %v", name, timeout)
			// The bound is timeout + tick; a second tick allows for the scheduler on a busy
			// machine. Unbounded, it would wait for the connections (as long as they are held).
			require.Less(t, took, timeout+2*tick, "%s client, timeout %v", name, timeout)
		}
	}
	release()

	// A waiter whose row was read before the database stalled answers busy with that row, on
	// time: its first read wants the row whole for this.
	for name, cl := range map[string]*gendurable.Client{"started": started, "bare": bare} {
		const timeout = 300 * time.Millisecond
		before := pool.Stat().AcquireCount()
		type result struct {
			r    *gendurable.AwaitResult
			err  error
			took time.Duration
		}
		done := make(chan result, 1)
		go func() {
			began := time.Now()
			r, err := cl.Await(context.Background(), id, timeout, nil)
			done <- result{r, err, time.Since(began)}
		}()
		eventually(t, 5*time.Second, "the waiter's first read", func() bool {
			st := pool.Stat()
			return st.AcquireCount() > before && st.AcquiredConns() == 0
		})
		var stalled []*pgxpool.Conn
		for range cfg.MaxConns {
			c, err := pool.Acquire(context.Background())
			require.NoError(t, err)
			stalled = append(stalled, c)
		}
		res := <-done
		for _, c := range stalled {
			c.Release()
		}
		require.NoError(t, res.err, "%s client", name)
		require.Equal(t, gendurable.AwaitBusy, res.r.Status, "%s client", name)
		require.Equal(t, id, res.r.Instance.ID)
		require.Less(t, res.took, timeout+2*tick, "%s client", name)
	}

	r, err := started.Await(context.Background(), id, 100*time.Millisecond, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitBusy, r.Status, "answers again once the database does")
}

// The path records every step that moved an instance on or finished it.
func TestInstancePathRecordsTheStepsTaken(t *testing.T) {
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{linear("linear5", 0, nil)},
		Queues: map[string]gendurable.QueueConfig{"work": {}}})
	start(t, cl)
	res, err := cl.Insert(context.Background(), linear("linear5", 0, nil).With(path{}), nil)
	require.NoError(t, err)
	r, err := cl.Await(context.Background(), res.ID, 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, r.Status)
	require.Equal(t, []string{"s0", "s1", "s2", "s3", "s4"}, r.Instance.Path)
	d, err := cl.Inspect(context.Background(), res.ID, nil)
	require.NoError(t, err)
	require.Equal(t, r.Instance.Path, d.Instance.Path)
}
