package chaos

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// The deadlock metric works: two transactions that lock two rate buckets in opposite orders (a
// test-only statement; the engine locks buckets in key order) deadlock, and the database's count,
// read by I8 once the test's connections have closed, is exactly 1. Without this, T6's "0
// deadlocks" could be a metric that never moves.
func TestDeadlockMetricNegativeControl(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	ctx := context.Background()
	e.exec(t, `INSERT INTO {schema}.buckets (key, tokens, rate, burst, updated_at) VALUES ('a', 1, 1, 1, now()), ('b', 1, 1, 1, now())`)
	lockBoth := func(first, second string, ready *sync.WaitGroup, both <-chan struct{}) error {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		lock := e.q(`SELECT 1 FROM {schema}.buckets WHERE key = $1 FOR UPDATE`)
		if _, err := tx.Exec(ctx, lock, first); err != nil {
			return err
		}
		ready.Done()
		<-both
		_, err = tx.Exec(ctx, lock, second)
		return err
	}
	var ready sync.WaitGroup
	ready.Add(2)
	both := make(chan struct{})
	errs := make(chan error, 2)
	go func() { errs <- lockBoth("a", "b", &ready, both) }()
	go func() { errs <- lockBoth("b", "a", &ready, both) }()
	ready.Wait()
	close(both)
	var deadlocked int
	for range 2 {
		var pgErr *pgconn.PgError
		if err := <-errs; errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			deadlocked++
		} else {
			require.NoError(t, err)
		}
	}
	require.Equal(t, 1, deadlocked, "one of the two was chosen as the deadlock victim")
	// I8, when the test ends, reads the database's count: exactly this one.
	e.wantDeadlocks = 1
}

// T6: a deadlock hunt. For 10 s (60 s with GD_CHAOS=full), all at once: 8 goroutines insert
// batches of 500 rows drawn from 2,000 correlation keys in shuffled order; parents spawn
// children into the same keys; three worker processes pick rate-limited, partly gated rows
// (multi-key buckets) with GC (retention = lease) and reapers running, and one of them is
// SIGKILLed and restarted every few seconds (startup reclaim). In a database of its own. Pass:
// its deadlock count does not move and no caller sees 40P01; one live instance per key; each
// batch's new ids ascend in key order. Then one InsertMany of 70,000 rows (past the 65,535
// parameter cap) succeeds, its ids in key order too.
func TestDeadlockHunt(t *testing.T) {
	t.Parallel()
	heavy.Lock()
	defer heavy.Unlock()
	seed, _ := oracle.Seed(t)
	e := newEnv(t, 14)
	dsn := e.url
	ctx := context.Background()
	run := 10 * time.Second
	if oracle.Full() {
		run = 60 * time.Second
	}
	machines := stubMachines(e, "t6", 0, 0, seed)
	job, fan := machines[1].(gendurable.Job[string]), machines[2]
	rates := map[string][3]int{"api": {200, 1000, 20}}
	gates := map[string][2]int{"g": {3, 2}}
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: machines})
	cfg := func(i int) workerCfg {
		return workerCfg{Machines: machinesRaces, Conns: 5, FxConns: 3, URL: dsn, Schema: e.schema,
			Name: fmt.Sprint("w", i), Queues: []string{"t6"}, Conc: 8, PollMS: 20,
			LeaseMS: 1000, ReaperMS: 100, GCMS: 100, RetentionMS: 1000, Rates: rates, Gates: gates,
			StepMinMS: 0, StepMaxMS: 5, Seed: seed + uint64(i)}
	}
	workers := make([]*worker, 3)
	for i := range workers {
		workers[i] = startWorker(t, cfg(i))
	}
	key := func(k int) string { return fmt.Sprintf("k%04d", k) }
	deadline := time.Now().Add(run)
	var batches, rows, deadlocks, reinserted atomic.Int64
	var wg sync.WaitGroup
	fail := func(err error) {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			deadlocks.Add(1)
		}
		t.Error(err)
	}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(seed, uint64(g)))
			for time.Now().Before(deadline) {
				perm := rng.Perm(2000)[:500]
				params := make([]gendurable.InsertManyParams, len(perm))
				for i, k := range perm {
					opts := &gendurable.InsertOpts{CorrelationKey: key(k), RateLimit: fmt.Sprint("api:", k%10)}
					if k%3 == 0 {
						opts.ConcurrencyKey = fmt.Sprint("g:", k%5)
					}
					params[i] = gendurable.InsertManyParams{Input: job.With(key(k)), Opts: opts}
				}
				res, err := ins.InsertMany(ctx, params)
				if err != nil {
					fail(err)
					return
				}
				// The new rows' ids ascend in key order.
				type kid struct {
					key string
					id  int64
				}
				var fresh []kid
				for i, r := range res {
					if !r.Duplicate {
						fresh = append(fresh, kid{key(perm[i]), r.ID})
					}
				}
				// A row whose key was taken by an instance that finished while the statement
				// ran is inserted by a second statement (InsertMany retries it), after the
				// others: that, and only that, may break the order. The log shows it: an
				// earlier instance with the same key.
				sort.Slice(fresh, func(a, b int) bool { return fresh[a].key < fresh[b].key })
				for i := 1; i < len(fresh); i++ {
					if fresh[i].id > fresh[i-1].id {
						continue
					}
					late := fresh[i-1]
					if e.count(t, `SELECT count(*) FROM {schema}.t_outcome_log WHERE old_status IS NULL
						AND new_state = to_jsonb($1::text) AND id < $2`, late.key, late.id) == 0 {
						t.Errorf("ids not in key order: %v then %v, and %v had no earlier instance", late, fresh[i], late)
						return
					}
					reinserted.Add(1)
				}
				batches.Add(1)
				rows.Add(int64(len(fresh)))
			}
		}()
	}
	wg.Add(1)
	go func() { // fan-outs into the same keys
		defer wg.Done()
		rng := mrand.New(mrand.NewPCG(seed, 100))
		for time.Now().Before(deadline) {
			var keys []string
			for _, k := range rng.Perm(2000)[:20] {
				keys = append(keys, key(k))
			}
			if _, err := ins.Insert(ctx, fan.(gendurable.FSM[t6FanState]).With(t6FanState{keys}), nil); err != nil {
				fail(err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	kills := 0
	killer := mrand.New(mrand.NewPCG(seed, 200))
	for time.Now().Before(deadline.Add(-3 * time.Second)) {
		time.Sleep(time.Duration(2000+killer.IntN(2000)) * time.Millisecond)
		i := killer.IntN(len(workers))
		workers[i].kill()
		workers[i] = startWorker(t, cfg(i))
		kills++
	}
	wg.Wait()
	for _, w := range workers {
		w.stop(t)
	}
	// A killed worker's claims outlive it until their lease runs out, and no worker is left to
	// reap them: a maintenance node releases them (and credits their gate slots) before the
	// invariants are checked.
	sweeper := e.client(t, &gendurable.Config{Name: "sweeper", Reaper: &gendurable.ReaperConfig{Interval: 100 * time.Millisecond},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"g": {Limit: 3, Shards: 2}}})
	require.NoError(t, sweeper.Start(ctx))
	reapBy := time.Now().Add(30 * time.Second)
	for e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`) > 0 {
		require.True(t, time.Now().Before(reapBy), "claims of killed workers were never released")
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, sweeper.Stop(ctx))
	require.Zero(t, deadlocks.Load(), "a caller saw 40P01")
	t.Logf("%d batches, %d new rows (%d re-inserted after their key's instance finished), %d kills",
		batches.Load(), rows.Load(), reinserted.Load(), kills)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (SELECT machine, correlation_key FROM {schema}.instances
		WHERE correlation_key IS NOT NULL AND status IN ('available', 'executing', 'awaiting', 'joining')
		GROUP BY 1, 2 HAVING count(*) > 1) d`), "two live instances with one key")

	// 70,000 rows in one statement.
	big := make([]gendurable.InsertManyParams, 70_000)
	perm := mrand.New(mrand.NewPCG(seed, 300)).Perm(len(big))
	for i, k := range perm {
		big[i] = gendurable.InsertManyParams{Input: job.With("big"), Opts: &gendurable.InsertOpts{Queue: "big",
			CorrelationKey: fmt.Sprintf("big%06d", k)}}
	}
	res, err := ins.InsertMany(ctx, big)
	require.NoError(t, err)
	require.Len(t, res, len(big))
	byKey := make([]int64, len(big))
	for i, r := range res {
		require.False(t, r.Duplicate)
		byKey[perm[i]] = r.ID
	}
	require.True(t, slices.IsSorted(byKey), "ids follow key order")
	require.Equal(t, len(big), e.count(t, `SELECT count(*) FROM {schema}.instances WHERE queue = 'big'`))

	e.check(t, oracle.Opts{Terminal: []string{"done", "failed", "available", "awaiting", "joining"}},
		oracle.Summary{Seed: seed, Instances: int(rows.Load()) + len(big), Kills: kills})
}

// Children of many parents finishing at once, their outcomes batched by several committers on
// several clients: every batch settles the joins of a mix of parents. The settling must lock
// those parents in one order (their ids), or two batches lock two parents in opposite orders
// and deadlock. In a database of its own, so that its deadlock count is this test's alone.
func TestSettlingJoinsOfManyParentsDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	heavy.Lock()
	defer heavy.Unlock()
	e := newEnv(t, 40)
	ctx := context.Background()
	kid := gendurable.Job[int]{Name: "kid", Queue: "kids", Perform: func(*gendurable.Ctx, int) error { return nil }}
	type famState struct {
		N int `json:"n"`
	}
	parents, children := oracle.Size(15, 100), 60
	fam := gendurable.FSM[famState]{Name: "fam", Start: "spawn", Queue: "fam", Steps: map[string]gendurable.StepFunc[famState]{
		"spawn": func(ctx *gendurable.Ctx, f famState) (gendurable.Outcome, error) {
			kids := make([]gendurable.Child, children)
			for i := range kids {
				kids[i] = gendurable.Child{Input: kid.With(i)}
			}
			return gendurable.Spawn(kids, "join", f), nil
		},
		"join": func(ctx *gendurable.Ctx, f famState) (gendurable.Outcome, error) {
			f.N = len(ctx.Children)
			return gendurable.Done(f), nil
		},
	}}
	machines := []gendurable.Machine{fam, kid}
	for i := range 3 {
		start(t, e.client(t, &gendurable.Config{Name: fmt.Sprint("c", i), Machines: machines, PollInterval: 20 * time.Millisecond,
			Queues: map[string]gendurable.QueueConfig{"fam": {Concurrency: 4}, "kids": {Concurrency: 32}}}))
	}
	params := make([]gendurable.InsertManyParams, parents)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: fam.With(famState{})}
	}
	_, err := e.client(t, &gendurable.Config{Machines: machines}).InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 2*time.Minute, "every parent joined", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'fam' AND status = 'done'`) == parents
	})
	require.Equal(t, parents, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'fam' AND (result->>'n')::int = $1`, children))
	e.check(t, oracle.Opts{N: parents * (children + 1)}, oracle.Summary{Instances: parents * (children + 1)})
}
