package gendurable_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/bridge"
	"github.com/stretchr/testify/require"
)

// A running client that works the queue runs what it inserts at once: the row is inserted
// already claimed (no pick's update: its updated_at is its inserted_at), while a free slot
// remains; with every slot busy, the row goes in available and is picked in its turn.
func TestInsertStartsTheStepWithoutAPick(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan int, 10)
	job := gendurable.Job[counter]{Name: "held", Perform: func(_ *gendurable.Ctx, c counter) error {
		started <- c.N
		<-release
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, PollInterval: time.Minute,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 2}}})
	start(t, cl)
	// An idle queue's picks hold its free slots while in flight (an Insert meanwhile goes in
	// available): they come 10, 20, 40, ... ms apart after the start. Each insert below goes
	// where the idle runner will not pick for half a second (a pick of the started step's slot
	// does not come before that either: the step holds it).
	eng, _ := bridge.Engine(cl)
	quiet := func() {
		eventually(t, 30*time.Second, "an idle gap of half a second", func() bool { return eng.QuietFor("default") >= 500*time.Millisecond })
	}
	claimedAtInsert := func(id int64) bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances
			WHERE id = $1 AND status = 'executing' AND attempt = 1 AND updated_at = inserted_at`, id) == 1
	}
	var ids []int64
	for i := range 2 {
		quiet()
		r, err := cl.Insert(ctx, job.With(counter{N: i}), nil)
		require.NoError(t, err)
		require.True(t, claimedAtInsert(r.ID), "instance %d was not claimed by its insert", i)
		ids = append(ids, r.ID)
		<-started
	}
	// Both slots are busy: the third waits, available, for a pick.
	third, err := cl.Insert(ctx, job.With(counter{N: 2}), nil)
	require.NoError(t, err)
	ids = append(ids, third.ID)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'available'`, third.ID))
	close(release)
	require.Equal(t, 2, <-started)
	eventually(t, 10*time.Second, "all three done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'done'`, ids) == 3
	})
	// A client that does not run the queue inserts rows for others to pick.
	other, err := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}}).Insert(ctx, job.With(counter{N: 3}), nil)
	require.NoError(t, err)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND updated_at > inserted_at OR status = 'available'`, other.ID))
}

// Inserts racing with each other, with picks and with Stop never run more steps at once than
// the queue's Concurrency, and never lose one: Stop waits for the inserts that claim their own
// row, so that when it returns no row is left claimed (executing) until its lease runs out; what
// was inserted while the client stopped is left available, and a second client finishes it.
// Every instance is done exactly once.
func TestInsertsClaimedRacingStopLoseNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const conc, writers, each = 4, 16, 40
	var steps atOnce
	var mu sync.Mutex
	runs := map[int]int{}
	job := gendurable.Job[counter]{Name: "brief", Perform: func(_ *gendurable.Ctx, c counter) error {
		defer steps.enter()()
		mu.Lock()
		runs[c.N]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return nil
	}}
	// The default lease: a claim's lease running out on a loaded machine (or a Stop past its
	// deadline, which cancels the steps still running and hands their claims back) runs a step
	// again by design, and this test counts runs.
	cfg := &gendurable.Config{Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: conc}}}
	first := e.client(t, cfg)
	require.NoError(t, first.Start(ctx))
	var wg sync.WaitGroup
	var inserted atomic.Int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, err := first.Insert(ctx, job.With(counter{N: w*each + i}), nil)
				if err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				inserted.Add(1)
			}
		}()
	}
	eventually(t, 10*time.Second, "a third inserted", func() bool { return inserted.Load() >= writers*each/3 })
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, first.Stop(stopCtx))
	require.NoError(t, stopCtx.Err(), "Stop reached its deadline: it cancelled running steps instead of draining them")
	wg.Wait()
	require.LessOrEqual(t, steps.most.Load(), int64(conc), "more steps ran at once than the queue's Concurrency")
	// No reaper runs now: a claim the stop left behind would still be here.
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' OR locked_by IS NOT NULL`),
		"the stopped client left instances claimed")
	second := e.client(t, cfg)
	start(t, second)
	eventually(t, 30*time.Second, "every instance done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == writers*each
	})
	require.Equal(t, writers*each, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, writers*each)
	for n, k := range runs {
		require.Equal(t, 1, k, "instance %d ran %d times", n, k)
	}
	require.LessOrEqual(t, steps.most.Load(), int64(conc))
}

// An Insert that claims its own row while the client stops: Stop waits for it, and the row runs
// in the drain instead of staying claimed until its lease runs out; if Stop's context ends
// first, the row is handed back (available, unclaimed) as the Insert returns. The insert is held
// in flight by a lock on the instances table.
func TestStopWaitsForAnInsertThatClaimsItsRow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		stopFor time.Duration
		want    string
	}{
		{name: "drained", stopFor: 30 * time.Second, want: "done"},
		{name: "handed back", stopFor: 300 * time.Millisecond, want: "available"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			job := gendurable.Job[counter]{Name: "late", Perform: func(*gendurable.Ctx, counter) error { return nil }}
			cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, PollInterval: time.Minute, Lease: time.Minute,
				Reaper: &gendurable.ReaperConfig{Disabled: true},
				Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 2}}})
			require.NoError(t, cl.Start(ctx))
			eng, _ := bridge.Engine(cl)
			eventually(t, 30*time.Second, "an idle gap of a second", func() bool { return eng.QuietFor("default") >= time.Second })
			tx, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, expand(`LOCK TABLE {schema}.instances IN SHARE MODE`, e.schema))
			require.NoError(t, err)
			inserted := make(chan error, 1)
			var id atomic.Int64
			go func() {
				r, err := cl.Insert(ctx, job.With(counter{N: 1}), nil)
				id.Store(r.ID)
				inserted <- err
			}()
			eventually(t, 10*time.Second, "the insert waiting on the lock", func() bool {
				return e.count(t, `SELECT count(*) FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_class c ON c.oid = l.relation
					JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
					WHERE NOT l.granted AND c.relname = 'instances' AND n.nspname = $1`, e.schema) > 0
			})
			stopped := make(chan error, 1)
			go func() {
				stopCtx, cancel := context.WithTimeout(ctx, c.stopFor)
				defer cancel()
				stopped <- cl.Stop(stopCtx)
			}()
			eventually(t, 10*time.Second, "the client stopping", func() bool { return !eng.Running() })
			if c.want == "available" {
				// Stop gives up waiting for the insert once its context ends.
				select {
				case err := <-stopped:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("Stop did not return at its deadline")
				}
			}
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, <-inserted)
			if c.want == "done" {
				require.NoError(t, <-stopped)
			}
			var status string
			var lockedBy *string
			require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT status::text, locked_by FROM {schema}.instances WHERE id = $1`, e.schema),
				id.Load()).Scan(&status, &lockedBy))
			require.Equal(t, c.want, status)
			require.Nil(t, lockedBy, "the stopped client left its claim on the row")
		})
	}
}

// A pick in flight holds the slots it asked for: an Insert meanwhile finds none free and inserts
// its row available, so the client never holds more claims than its Concurrency. (The pick is
// held in flight by a lock on the gate counters it must write.)
func TestAnInsertDoesNotTakeTheSlotsOfAPickInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var steps atOnce
	job := gendurable.Job[counter]{Name: "slot", Perform: func(*gendurable.Ctx, counter) error {
		defer steps.enter()()
		time.Sleep(20 * time.Millisecond)
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"g": {Limit: 100}},
		Queues:            map[string]gendurable.QueueConfig{"default": {Concurrency: 2}}})
	start(t, cl)
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, expand(`LOCK TABLE {schema}.gates IN EXCLUSIVE MODE`, e.schema))
	require.NoError(t, err)
	gated, err := cl.InsertMany(ctx, []gendurable.InsertManyParams{
		{Input: job.With(counter{N: 1}), Opts: &gendurable.InsertOpts{ConcurrencyKey: "g:a", Priority: 9}},
		{Input: job.With(counter{N: 2}), Opts: &gendurable.InsertOpts{ConcurrencyKey: "g:a", Priority: 9}},
	})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the pick waiting on the gate counters", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_class c ON c.oid = l.relation
			JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE NOT l.granted AND c.relname = 'gates' AND n.nspname = $1`, e.schema) > 0
	})
	// More urgent than the waiting rows: nothing is ahead of it, only the slots are taken.
	plain, err := cl.Insert(ctx, job.With(counter{N: 3}), &gendurable.InsertOpts{Priority: 1})
	require.NoError(t, err)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'available'`, plain.ID),
		"an Insert claimed a slot the pick in flight holds")
	require.NoError(t, tx.Rollback(ctx))
	ids := []int64{gated[0].ID, gated[1].ID, plain.ID}
	eventually(t, 10*time.Second, "all three done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'done'`, ids) == 3
	})
	require.LessOrEqual(t, steps.most.Load(), int64(2))
}

// atOnce counts the steps running at once and the most there ever were.
type atOnce struct{ running, most atomic.Int64 }

// enter counts a step in; the function it returns counts it out.
func (a *atOnce) enter() func() {
	now := a.running.Add(1)
	for m := a.most.Load(); now > m && !a.most.CompareAndSwap(m, now); m = a.most.Load() {
	}
	return func() { a.running.Add(-1) }
}
