package gendurable_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// sampler calls read every few milliseconds until stop is closed and keeps what it returns; a
// read that fails fails the test and ends the sampling.
func sampler[T any](t *testing.T, stop <-chan struct{}, read func() (T, error)) (func() []T, *sync.WaitGroup) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var samples []T
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := read()
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return func() []T { mu.Lock(); defer mu.Unlock(); return slices.Clone(samples) }, &wg
}

// sampleMaxPerKey samples the executing rows per concurrency key every few milliseconds until
// stop is closed, and returns the largest count seen for any key and how many samples it took.
func sampleMaxPerKey(t *testing.T, e *env, stop <-chan struct{}) (func() (int, int), *sync.WaitGroup) {
	sampled, wg := sampler(t, stop, func() (int, error) {
		var m int
		err := e.pool.QueryRow(context.Background(), expand(`SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n
			FROM {schema}.instances WHERE status = 'executing' AND concurrency_key IS NOT NULL GROUP BY concurrency_key) s`, e.schema)).Scan(&m)
		return m, err
	})
	return func() (int, int) {
		samples := sampled()
		most := 0
		for _, m := range samples {
			most = max(most, m)
		}
		return most, len(samples)
	}, wg
}

// runKeyed inserts n jobs, the i-th under concurrency key key(i) with the key as its argument,
// and waits until all are done while sampling the executing rows per key; it returns the most
// seen for one key and how many samples it took.
func runKeyed(t *testing.T, e *env, ins *gendurable.Client, job gendurable.Job[string], n int, key func(int) string) (int, int) {
	t.Helper()
	stop := make(chan struct{})
	maxSeen, wg := sampleMaxPerKey(t, e, stop)
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		k := key(i)
		params[i] = gendurable.InsertManyParams{Input: job.With(k), Opts: &gendurable.InsertOpts{ConcurrencyKey: k}}
	}
	_, err := ins.InsertMany(context.Background(), params)
	require.NoError(t, err)
	eventually(t, 2*time.Minute, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	close(stop)
	wg.Wait()
	return maxSeen()
}

func TestGateNeverOverAdmitsAcrossEightClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var running sync.Map // key -> *atomic.Int64
	var overs atomic.Int64
	job := gendurable.Job[string]{Name: "gated", Queue: "g", Perform: func(ctx *gendurable.Ctx, key string) error {
		v, _ := running.LoadOrStore(key, new(atomic.Int64))
		n := v.(*atomic.Int64).Add(1)
		if n > 3 {
			overs.Add(1)
		}
		time.Sleep(time.Duration(5+ctx.ID%7) * time.Millisecond)
		v.(*atomic.Int64).Add(-1)
		return nil
	}}
	limits := map[string]gendurable.ConcurrencyLimit{"tenant": {Limit: 3, Shards: 2}}
	for i := range 8 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprint("c", i), Machines: []gendurable.Machine{job},
			ConcurrencyLimits: limits, Queues: map[string]gendurable.QueueConfig{"g": {Concurrency: 10}}})
		start(t, cl)
	}
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: []gendurable.Machine{job}, ConcurrencyLimits: limits})
	m, samples := runKeyed(t, e, ins, job, oracle.Size(600, 1200), func(i int) string { return fmt.Sprintf("tenant:%d", i%20) })
	t.Logf("%d samples, most executing per key %d", samples, m)
	require.Greater(t, samples, 30)
	require.LessOrEqual(t, m, 3, "a key had more than Limit executing rows")
	require.Equal(t, 3, m, "the gate is live: some key reached its limit")
	require.Zero(t, overs.Load(), "a step ran while 3 others of its key ran")
	require.Equal(t, 0, e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`), "counters end at zero")
	require.LessOrEqual(t, e.count(t, `SELECT count(*) FROM {schema}.gates`), 40, "at most shards × keys counters")
}

func TestConcurrencyKeyIsMutualExclusion(t *testing.T) {
	t.Parallel()
	e := newDeadlockFreeEnv(t)
	var overs atomic.Int64
	var running sync.Map
	job := gendurable.Job[string]{Name: "excl", Queue: "x", Perform: func(ctx *gendurable.Ctx, key string) error {
		v, _ := running.LoadOrStore(key, new(atomic.Int64))
		if v.(*atomic.Int64).Add(1) > 1 {
			overs.Add(1)
		}
		time.Sleep(2 * time.Millisecond)
		v.(*atomic.Int64).Add(-1)
		return nil
	}}
	var contended atomic.Int64
	for i := range 4 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprint("c", i), Machines: []gendurable.Machine{job},
			Queues: map[string]gendurable.QueueConfig{"x": {Concurrency: 8}},
			Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
				if ev.Name == gendurable.EventConcurrencyContended {
					contended.Add(1)
				}
			}}})
		start(t, cl)
	}
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: []gendurable.Machine{job}})
	m, _ := runKeyed(t, e, ins, job, oracle.Size(300, 600), func(i int) string { return fmt.Sprint("acct-", i%6) })
	require.Equal(t, 1, m)
	require.Zero(t, overs.Load())
	t.Logf("contended picks: %d", contended.Load())
	// No deadlock among the racing picks: the env's database counts none when the test ends.
}

func TestSwitchingToAColdGateAdmitsInTheSamePick(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type s struct{ N int }
	m := gendurable.FSM[s]{Name: "switcher", Start: "free", Steps: map[string]gendurable.StepFunc[s]{
		"free": func(ctx *gendurable.Ctx, v s) (gendurable.Outcome, error) {
			return gendurable.Next("gated", s{N: 1}, gendurable.ConcurrencyKey("pool:new")), nil
		},
		"gated": func(ctx *gendurable.Ctx, v s) (gendurable.Outcome, error) {
			return gendurable.Next("other", s{N: 2}, gendurable.ConcurrencyKey("solo")), nil
		},
		"other": func(ctx *gendurable.Ctx, v s) (gendurable.Outcome, error) {
			return gendurable.Next("last", s{N: 3}, gendurable.ReleaseConcurrencyKey()), nil
		},
		"last": func(ctx *gendurable.Ctx, v s) (gendurable.Outcome, error) { return gendurable.Done(v), nil },
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"pool": {Limit: 2, Shards: 2}}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	var ids []int64
	for range 5 {
		r, err := cl.Insert(ctx, m.With(s{}), nil)
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	res := kit.Drain(ctx)
	require.Equal(t, 20, res.Steps, "no step waited on a cold gate: one drain ran everything")
	for _, id := range ids {
		in := kit.RequireDone(ctx, id, nil)
		require.Empty(t, in.Errors)
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE concurrency_key IS NOT NULL`), "released at the end")
	require.Equal(t, 0, e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`))
	require.Positive(t, e.count(t, `SELECT count(*) FROM {schema}.gates WHERE key = 'pool:new'`), "the cold gate was minted in the pick")
}

func TestSaturatedKeyDoesNotStarveTheWorkBehindIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var order []string
	var mu sync.Mutex
	job := gendurable.Job[string]{Name: "tag", Queue: "mixed", Perform: func(ctx *gendurable.Ctx, tag string) error {
		mu.Lock()
		order = append(order, tag)
		mu.Unlock()
		if tag == "hot" {
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"hot": {Limit: 1}},
		Queues:            map[string]gendurable.QueueConfig{"mixed": {Concurrency: 5}}})
	ctx := context.Background()
	// 60 rows of a capped key first (older, same priority), then 20 free rows.
	var params []gendurable.InsertManyParams
	for range 60 {
		params = append(params, gendurable.InsertManyParams{Input: job.With("hot"), Opts: &gendurable.InsertOpts{ConcurrencyKey: "hot"}})
	}
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	params = nil
	for range 20 {
		params = append(params, gendurable.InsertManyParams{Input: job.With("free")})
	}
	_, err = cl.InsertMany(ctx, params)
	require.NoError(t, err)
	start(t, cl)
	eventually(t, 30*time.Second, "the free rows done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE state = '"free"' AND status = 'done'`) == 20
	})
	// While the capped key runs one row at a time (20 ms each, 1.2 s in all), the free rows
	// behind it ran in the first picks: they did not wait for the capped backlog to drain.
	mu.Lock()
	defer mu.Unlock()
	hotBefore := 0
	for _, tag := range order {
		if tag == "free" {
			break
		}
		hotBefore++
	}
	require.LessOrEqual(t, hotBefore, 2, "free work waited behind a saturated key: %v", order)
}

func TestGateNamesCaptureTheirKeysOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// With a gate "stripe" (Limit 2): "stripe" and "stripe:acme" are gated, each its own
	// semaphore of 2; "stripes:acme" is not the gate's (its part before ':' is "stripes"): K = 1.
	var mu sync.Mutex
	running := map[string]int{}
	most := map[string]int{}
	release := make(chan struct{})
	job := gendurable.Job[string]{Name: "cap", Queue: "cap", Perform: func(ctx *gendurable.Ctx, key string) error {
		mu.Lock()
		running[key]++
		most[key] = max(most[key], running[key])
		mu.Unlock()
		select {
		case <-release:
		case <-time.After(300 * time.Millisecond):
		}
		mu.Lock()
		running[key]--
		mu.Unlock()
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"stripe": {Limit: 2}},
		Queues:            map[string]gendurable.QueueConfig{"cap": {Concurrency: 20}}})
	ctx := context.Background()
	var params []gendurable.InsertManyParams
	for _, key := range []string{"stripe", "stripe:acme", "stripes:acme"} {
		for range 4 {
			params = append(params, gendurable.InsertManyParams{Input: job.With(key), Opts: &gendurable.InsertOpts{ConcurrencyKey: key}})
		}
	}
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	start(t, cl)
	eventually(t, 30*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 12
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"stripe": 2, "stripe:acme": 2, "stripes:acme": 1}, most)
}

func TestReconcilerRepairsLeakedCounters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := gendurable.Job[string]{Name: "j", Perform: func(*gendurable.Ctx, string) error { return nil }}
	var swept atomic.Int64
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"api": {Limit: 4, Shards: 2}},
		GC:                &gendurable.GCConfig{Interval: 50 * time.Millisecond},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventGCSwept {
				swept.Add(int64(ev.Gates))
			}
		}}})
	// A leak (a counter debited with no execution behind it), a counter of a gate no longer
	// configured, and a shard beyond the configured count.
	e.exec(t, `INSERT INTO {schema}.gates (key, shard, held, capacity) VALUES ('api:x', 0, 2, 2), ('gone:y', 0, 0, 5), ('api:x', 7, 0, 1)`)
	start(t, cl)
	eventually(t, 10*time.Second, "repaired", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.gates`) == 1 &&
			e.count(t, `SELECT held FROM {schema}.gates WHERE key = 'api:x' AND shard = 0`) == 0
	})
	eventually(t, 5*time.Second, "gc.swept reported it", func() bool { return swept.Load() >= 3 })
	// The repaired gate admits again.
	r, err := cl.Insert(context.Background(), job.With("x"), &gendurable.InsertOpts{ConcurrencyKey: "api:x"})
	require.NoError(t, err)
	kit := durabletest.New(t, cl, nil)
	kit.Drain(context.Background())
	kit.RequireDone(context.Background(), r.ID, nil)
}

func TestInvalidGateConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for field, limits := range map[string]map[string]gendurable.ConcurrencyLimit{
		"ConcurrencyLimits[a:b]":       {"a:b": {Limit: 1}},
		"ConcurrencyLimits[]":          {"": {Limit: 1}},
		"ConcurrencyLimits[x].Limit":   {"x": {Limit: 0}},
		"ConcurrencyLimits[y].Shards":  {"y": {Limit: 2, Shards: 3}},
		"ConcurrencyLimits[z].Shards":  {"z": {Limit: 2, Shards: -1}},
		"ConcurrencyLimits[neg].Limit": {"neg": {Limit: -5}},
	} {
		_, err := gendurable.NewClient(e.pool, &gendurable.Config{ConcurrencyLimits: limits})
		var ce *gendurable.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
	}
	cl := e.client(t, nil)
	_, err := cl.Insert(context.Background(), noop.With(counter{}), &gendurable.InsertOpts{ConcurrencyKey: string(make([]byte, 600))})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
}
