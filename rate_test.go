package gendurable_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// rateJob records the database time its step starts at, on a pool of its own (autocommit).
func rateJob(e *env, name, queue string) gendurable.Job[string] {
	return gendurable.Job[string]{Name: name, Queue: queue, Perform: func(ctx *gendurable.Ctx, tag string) error {
		_, err := e.pool.Exec(ctx, expand(`INSERT INTO {schema}.t_starts (id, tag, at) VALUES ($1, $2, clock_timestamp())`, e.schema), ctx.ID, tag)
		return err
	}}
}

func createStarts(t *testing.T, e *env) {
	e.exec(t, `CREATE TABLE {schema}.t_starts (id bigint, tag text, at timestamptz)`)
}

// logGrants logs every grant of a rate-limited row, with its pick's transaction time
// (oracle.LogGrants).
func logGrants(t *testing.T, e *env) {
	t.Helper()
	require.NoError(t, oracle.LogGrants(context.Background(), e.pool, e.schema))
}

// ratedEnv is a test's env with its starts and grants logged (createStarts, logGrants), and a
// job of queue "r" that records its start.
func ratedEnv(t *testing.T) (*env, gendurable.Job[string]) {
	t.Helper()
	e := newEnv(t)
	createStarts(t, e)
	logGrants(t, e)
	return e, rateJob(e, "rated", "r")
}

// insertRated inserts n instances of job under rate limit "api" through cl.
func insertRated(t *testing.T, cl *gendurable.Client, job gendurable.Job[string], n int) {
	t.Helper()
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With("x"), Opts: &gendurable.InsertOpts{RateLimit: "api"}}
	}
	_, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
}

// checkGrants checks the grants logged since since (logGrants), each stamped with its pick's
// transaction time, the clock the bucket counts in: no window of them holds more than burst +
// allowed × its length in seconds (oracle.RateExcess). It returns how many there were and the
// seconds from the first to the last.
func checkGrants(t *testing.T, e *env, since time.Time, burst, allowed int) (n int, last float64) {
	t.Helper()
	at, err := oracle.GrantTimes(context.Background(), e.pool, e.schema, "tx_at >= $1", since)
	require.NoError(t, err)
	if len(at) == 0 {
		return 0, 0
	}
	worst, end := oracle.RateExcess(at, allowed, 1000, burst)
	require.LessOrEqual(t, worst, 0.0, "grants up to %d overdraw the bucket by %.6f tokens", end, worst)
	return len(at), float64(at[len(at)-1]) / 1e6
}

func TestRateLimitConservesTokensAcrossEightClients(t *testing.T) {
	t.Parallel()
	e, job := ratedEnv(t)
	const allowed, burst = 20, 10 // 20 per second, 10 at once
	limits := map[string]gendurable.Rate{"api": {Allowed: allowed, Period: time.Second, Burst: burst}}
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: []gendurable.Machine{job}, RateLimits: limits})
	insertRated(t, ins, job, 300)
	for i := range 8 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprint("c", i), Machines: []gendurable.Machine{job}, RateLimits: limits,
			PollInterval: 20 * time.Millisecond, Queues: map[string]gendurable.QueueConfig{"r": {Concurrency: 10}}})
		start(t, cl)
	}
	time.Sleep(3 * time.Second)
	n, last := checkGrants(t, e, time.Time{}, burst, allowed)
	t.Logf("%d grants in %.2fs: burst %d + %d/s", n, last, burst, allowed)
	require.GreaterOrEqual(t, float64(n), burst+allowed*last-allowed*0.15, "the limit was not used in full")
	require.Less(t, n, 300, "the backlog outlasted the run")
}

// A database clock that steps back (time sync correcting a clock that ran ahead) leaves each
// bucket's last write ahead of now(). The limit goes on at its rate from the new clock: it does
// not refuse every grant until the clock has caught up with the write, which counting the step
// as negative refill would (for as long as the clock went back). The step is made on the bucket
// row, 10 minutes ahead, under its row lock: a pick racing it recomputes its writeback on the
// stepped row.
func TestRateLimitGoesOnAfterTheClockStepsBack(t *testing.T) {
	t.Parallel()
	e, job := ratedEnv(t)
	const allowed, burst, jobs = 20, 5, 100
	limits := map[string]gendurable.Rate{"api": {Allowed: allowed, Period: time.Second, Burst: burst}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, RateLimits: limits,
		PollInterval: 20 * time.Millisecond, Queues: map[string]gendurable.QueueConfig{"r": {Concurrency: 10}}})
	insertRated(t, cl, job, jobs)
	ctx := context.Background()
	start(t, cl)
	eventually(t, 30*time.Second, "the first grants", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_grants`) >= 10
	})
	var stepped time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`UPDATE {schema}.buckets SET updated_at = updated_at + interval '10 minutes'
		WHERE key = 'api' RETURNING clock_timestamp()`, e.schema)).Scan(&stepped))
	before := e.count(t, `SELECT count(*) FROM {schema}.t_grants`)
	// Granted at the rate, the rest take (jobs - before - burst) / allowed seconds: about 4.
	eventually(t, 60*time.Second, "every job to start after the clock stepped back", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_starts`) == jobs
	})
	n, last := checkGrants(t, e, stepped, burst, allowed)
	t.Logf("%d grants before the step, %d after it in %.2fs", before, n, last)
	// The bucket allows no more than burst + 20/s: the backlog outlasts the step by seconds.
	require.Positive(t, n, "no grant after the step")
	require.Equal(t, jobs, e.count(t, `SELECT count(*) FROM {schema}.t_grants`), "one grant a job")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.buckets WHERE key = 'api' AND updated_at <= now()`),
		"the bucket's last write is dated by the clock again")
}

func TestRateLimitPartitionsDoNotShareTokens(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createStarts(t, e)
	job := rateJob(e, "tenant", "p")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 2, Period: time.Hour}}})
	ctx := context.Background()
	for _, tenant := range []string{"t1", "t2"} {
		for range 5 {
			_, err := cl.Insert(ctx, job.With(tenant), &gendurable.InsertOpts{RateLimit: "api:" + tenant})
			require.NoError(t, err)
		}
	}
	kit := durabletest.New(t, cl, nil)
	res, err := kit.TryDrain(ctx, &durabletest.DrainOpts{KeepDelays: true})
	require.NoError(t, err)
	require.Equal(t, 4, res.Steps)
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM {schema}.t_starts WHERE tag = 't1'`))
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM {schema}.t_starts WHERE tag = 't2'`))
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM {schema}.buckets`))
}

func TestWeightedHeadOfLineIsNotStarved(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createStarts(t, e)
	logGrants(t, e)
	job := rateJob(e, "weighted", "w")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 10, Period: time.Second}},
		Queues:     map[string]gendurable.QueueConfig{"w": {Concurrency: 30}}, PollInterval: 20 * time.Millisecond})
	ctx := context.Background()
	// In urgency order: a row of weight 5, a heavy row of weight 8, then twenty light rows.
	ins := func(tag string, prio, weight int) {
		_, err := cl.Insert(ctx, job.With(tag), &gendurable.InsertOpts{RateLimit: "api", Weight: weight, Priority: prio})
		require.NoError(t, err)
	}
	ins("first", 1, 5)
	ins("heavy", 2, 8)
	for range 20 {
		ins("light", 3, 1)
	}
	start(t, cl)
	eventually(t, 20*time.Second, "all ran", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 22
	})
	// With 10 tokens, first (5) ran at once; heavy (8) did not fit yet, and the light rows behind
	// it waited for it rather than taking the tokens it was waiting for: none was granted by a
	// pick before heavy's. (A light row may be granted by heavy's own pick, if the bucket refilled
	// past 8 by the time it ran; then which step starts first is the executors' race.)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.t_grants l, {schema}.t_grants h, {schema}.t_starts ls, {schema}.t_starts hs
		WHERE ls.id = l.id AND hs.id = h.id AND ls.tag = 'light' AND hs.tag = 'heavy' AND l.tx_at < h.tx_at`))
	require.Equal(t, 22, e.count(t, `SELECT count(*) FROM {schema}.t_grants`))
}

func TestColdBucketAdmitsWithZeroLag(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createStarts(t, e)
	job := rateJob(e, "cold", "c")
	var throttled atomic.Int64
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 5, Period: time.Hour}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventRateLimitThrottled {
				throttled.Add(1)
			}
		}}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	for round := range 3 {
		for range 2 {
			_, err := cl.Insert(ctx, job.With(fmt.Sprint(round)), &gendurable.InsertOpts{RateLimit: "api:tenant"})
			require.NoError(t, err)
		}
		res, err := kit.TryDrain(ctx, &durabletest.DrainOpts{KeepDelays: true})
		require.NoError(t, err)
		require.Equal(t, 2, res.Steps, "round %d: admitted at once", round)
		// GC sweeps the bucket (or it never existed): the next round's bucket is cold again.
		e.exec(t, `DELETE FROM {schema}.buckets`)
	}
	require.Zero(t, throttled.Load(), "no false throttling of a cold bucket")
}

func TestUnknownRateLimitStallsVisiblyAndTheQueueGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createStarts(t, e)
	job := rateJob(e, "u", "u")
	var unknown atomic.Int64
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 5, Period: time.Second}},
		Queues:     map[string]gendurable.QueueConfig{"u": {}},
		Reaper:     &gendurable.ReaperConfig{Interval: 50 * time.Millisecond},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventRateLimitUnknown && ev.Key == "nope" {
				unknown.Store(int64(ev.Count))
			}
		}}})
	ctx := context.Background()
	stalled, err := cl.Insert(ctx, job.With("stalled"), &gendurable.InsertOpts{RateLimit: "nope:x"})
	require.NoError(t, err)
	start(t, cl)
	canary, err := cl.Insert(ctx, job.With("canary"), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the canary ran and the stall was reported", func() bool {
		in, _ := cl.Get(ctx, canary.ID)
		return in.Status == gendurable.StatusDone && unknown.Load() == 1
	})
	in, err := cl.Get(ctx, stalled.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status, "stalled, not lost")
}

// GC prunes the buckets that have been full for a minute, by the rate and burst they were
// written with and by the configured ones: not a drained one, not one that refilled by its old
// rate but not by the slower rate configured since, and not a drained one of a limit this node
// does not know (another node may use it: pruning it would hand that node a full burst).
func TestBucketGCPrunesOnlyBucketsFullForAMinute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var buckets atomic.Int64
	cl := e.client(t, &gendurable.Config{
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 10, Period: time.Second}, "slow": {Allowed: 1, Period: time.Hour}},
		GC:         &gendurable.GCConfig{Interval: 50 * time.Millisecond},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventGCSwept {
				buckets.Add(int64(ev.Buckets))
			}
		}}})
	e.exec(t, `INSERT INTO {schema}.buckets (key, tokens, rate, burst, updated_at) VALUES
		('api:full', 10, 10, 10, now() - interval '61 seconds'),
		('api:recent', 10, 10, 10, now() - interval '30 seconds'),
		('api:busy', 0, 0.001, 10, now()),
		('slow:x', 0, 10, 1, now() - interval '2 minutes'),
		('removed:full', 1, 1, 1, now() - interval '2 minutes'),
		('removed:x', 0, 0.001, 10, now())`)
	start(t, cl)
	eventually(t, 10*time.Second, "two buckets pruned", func() bool { return buckets.Load() == 2 })
	var left []string
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`SELECT array_agg(key ORDER BY key) FROM {schema}.buckets`, e.schema)).Scan(&left))
	require.Equal(t, []string{"api:busy", "api:recent", "removed:x", "slow:x"}, left)
}

func TestInvalidRateConfigAndOptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for field, limits := range map[string]map[string]gendurable.Rate{
		"RateLimits[a:b]":         {"a:b": {Allowed: 1, Period: time.Second}},
		"RateLimits[x].Allowed":   {"x": {Allowed: 0, Period: time.Second}},
		"RateLimits[y].Period":    {"y": {Allowed: 1}},
		"RateLimits[z].Burst":     {"z": {Allowed: 1, Period: time.Second, Burst: -2}},
		"RateLimits[neg].Allowed": {"neg": {Allowed: -1, Period: time.Second}},
	} {
		_, err := gendurable.NewClient(e.pool, &gendurable.Config{RateLimits: limits})
		var ce *gendurable.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
	}
	cl := e.client(t, nil)
	ctx := context.Background()
	for _, opts := range []*gendurable.InsertOpts{
		{Weight: 2},
		{RateLimit: "api", Weight: -1},
		{RateLimit: string(make([]byte, 600))},
	} {
		_, err := cl.Insert(ctx, noop.With(counter{}), opts)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	}
	// Bad options on Next route to Handle.
	m := gendurable.FSM[counter]{Name: "badrate", Start: "a", MaxAttempts: 1, Steps: map[string]gendurable.StepFunc[counter]{
		"a": func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
			return gendurable.Next("b", counter{}, gendurable.Weight(0), gendurable.RateLimit("api")), nil
		},
		"b": func(*gendurable.Ctx, counter) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	cl2 := e.client(t, &gendurable.Config{Name: "two", Machines: []gendurable.Machine{m}})
	r, err := cl2.Insert(ctx, m.With(counter{}), nil)
	require.NoError(t, err)
	kit := durabletest.New(t, cl2, nil)
	kit.Drain(ctx)
	in := kit.RequireFailed(ctx, r.ID)
	require.Equal(t, "outcome", in.Errors[0].Kind)
}
