package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// stubMachines are the worker machines, for inserting and for in-process pickers.
func stubMachines(e *env, queue string, stepMin, stepMax int, seed uint64) []gendurable.Machine {
	w := &racesWorker{cfg: workerCfg{Schema: e.schema, StepMinMS: stepMin, StepMaxMS: stepMax}, queue: queue,
		side: e.side, schema: e.q("{schema}"), rng: rand.New(rand.NewPCG(seed, 99))}
	return w.machines()
}

// T3: concurrency gates across four worker processes never over-admit, measured two ways: a
// sampler reads the executing rows per key every 5 ms, and every step records itself in
// t_inflight for its whole run (the effect level). Keys: eight of gate "stripe" (limit 5, 2
// shards) and four ungated ones (K = 1); 10 % of transitions switch key, 5 % release it. One
// worker is SIGKILLed mid-run (its claims leak until the reaper credits them back) and
// restarted. Pass: at most 5 per gated key and 1 per ungated key in every sample, at both
// levels, and in the exact peak the steps' rows give; some gated key's peak is 5 (the gate is
// live); counters back to 0; the oracle's invariants.
func TestGateNeverOverAdmitsAcrossProcesses(t *testing.T) {
	t.Parallel()
	heavy.Lock()
	defer heavy.Unlock()
	seed, _ := oracle.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	e := newEnv(t, 8)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE {schema}.t_inflight (key text, id bigint, pid int)`)
	// The exact peak of steps in flight per key, from the rows rather than a sampler that a
	// loaded machine makes miss moments: every insert into t_inflight counts its key's rows of
	// live processes, its key's inserts serialized by a lock held to their commit, so that each
	// counts every earlier one. (A step's row goes before its outcome commits, so before its slot
	// can admit another: a row counted is an execution admitted.)
	e.exec(t, `CREATE TABLE {schema}.t_dead (pid int PRIMARY KEY);
		CREATE TABLE {schema}.t_peak (key text PRIMARY KEY, n int NOT NULL);
		CREATE FUNCTION {schema}.t_count_peak() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN
		  PERFORM pg_advisory_xact_lock(hashtext(NEW.key));
		  INSERT INTO `+e.q("{schema}")+`.t_peak
		  SELECT NEW.key, count(*) FROM `+e.q("{schema}")+`.t_inflight AS f
		  WHERE f.key = NEW.key AND NOT EXISTS (SELECT 1 FROM `+e.q("{schema}")+`.t_dead AS d WHERE d.pid = f.pid)
		  ON CONFLICT (key) DO UPDATE SET n = greatest(t_peak.n, excluded.n);
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_count_peak AFTER INSERT ON {schema}.t_inflight FOR EACH ROW EXECUTE FUNCTION {schema}.t_count_peak()`)
	var gated, ungated []string
	for i := range 8 {
		gated = append(gated, fmt.Sprint("stripe:t", i))
	}
	for i := range 4 {
		ungated = append(ungated, fmt.Sprint("solo", i))
	}
	keys := append(slices.Clone(gated), ungated...)
	n := oracle.Size(400, 4000)
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: stubMachines(e, "t3", 0, 0, seed)})
	walk := stubMachines(e, "t3", 0, 0, seed)[0].(gendurable.FSM[walkState])
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		k := keys[rng.IntN(len(keys))]
		params[i] = gendurable.InsertManyParams{Input: walk.With(walkState{Key: k, Keys: keys}),
			Opts: &gendurable.InsertOpts{ConcurrencyKey: k}}
	}
	_, err := ins.InsertMany(ctx, params)
	require.NoError(t, err)

	cfg := func(i int) workerCfg {
		return workerCfg{Machines: machinesRaces, Conns: 5, FxConns: 3, URL: e.url, Schema: e.schema,
			Name: fmt.Sprint("w", i), Queues: []string{"t3"}, Conc: 16,
			PollMS: 50, LeaseMS: 5000, ReaperMS: 200, GCMS: 200, RetentionMS: 3_600_000,
			Gates: map[string][2]int{"stripe": {5, 2}}, StepMinMS: 5, StepMaxMS: 30, Seed: seed + uint64(i)}
	}
	workers := make([]*worker, 4)
	for i := range workers {
		workers[i] = startWorker(t, cfg(i))
	}

	// The sampler, on a connection of its own.
	var mu sync.Mutex
	killed := map[int]bool{}
	maxExec, maxInflight := map[string]int{}, map[string]int{}
	dead := func() []any {
		mu.Lock()
		defer mu.Unlock()
		pids := []int32{} // not nil: pgx sends a nil slice as NULL, and "<> ALL(NULL)" passes no row
		for p := range killed {
			pids = append(pids, int32(p))
		}
		return []any{pids}
	}
	stopSampler := sampler(t, e, dead, `SELECT 'x' || concurrency_key, count(*) FROM {schema}.instances
		WHERE status = 'executing' AND concurrency_key IS NOT NULL GROUP BY 1
		UNION ALL SELECT 'f' || key, count(*) FROM {schema}.t_inflight WHERE pid <> ALL($1) GROUP BY 1`, func(v []any) {
		k, c := v[0].(string), int(v[1].(int64))
		mu.Lock()
		defer mu.Unlock()
		if k[0] == 'x' {
			maxExec[k[1:]] = max(maxExec[k[1:]], c)
		} else {
			maxInflight[k[1:]] = max(maxInflight[k[1:]], c)
		}
	})

	done := func() int { return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) }
	eventually(t, 3*time.Minute, "30 % done", func() bool { return done() >= n*3/10 })
	victim := rng.IntN(len(workers))
	workers[victim].kill()
	// Its steps' rows stay in t_inflight, and their slots stay taken until the claims are
	// reclaimed (a lease later): from now on they are not counted.
	e.exec(t, `INSERT INTO {schema}.t_dead (pid) VALUES ($1)`, workers[victim].pid())
	mu.Lock()
	killed[workers[victim].pid()] = true
	mu.Unlock()
	workers[victim] = startWorker(t, cfg(victim)) // its startup reclaim takes the stale claims
	eventually(t, 3*time.Minute, "all done", func() bool { return done() == n })
	eventually(t, 30*time.Second, "gate counters back to 0", func() bool {
		return e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`) == 0
	})
	samples := stopSampler()
	for _, w := range workers {
		w.stop(t)
	}

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d samples; most executing per key %v; most in flight per key %v", samples, maxExec, maxInflight)
	for k, m := range maxExec {
		limit := 1
		if strings.HasPrefix(k, "stripe:") {
			limit = 5
		}
		require.LessOrEqual(t, m, limit, "key %s: %d executing at once", k, m)
		require.LessOrEqual(t, maxInflight[k], limit, "key %s: %d steps in flight at once", k, maxInflight[k])
	}
	peak := map[string]int{}
	rows, err := e.side.Query(ctx, e.q(`SELECT key, n FROM {schema}.t_peak`))
	require.NoError(t, err)
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		peak[k] = n
	}
	require.NoError(t, rows.Err())
	t.Logf("peak in flight per key, from the rows: %v", peak)
	for _, k := range ungated {
		require.LessOrEqual(t, peak[k], 1, "key %s: %d steps in flight at once", k, peak[k])
	}
	// Whether a key ever has five of its rows running at once depends on the random walk (at CI
	// size a key holds about 33 of the 400 instances): the gate is live when some key reached its
	// limit, and none went past it.
	live := 0
	for _, k := range gated {
		require.LessOrEqual(t, peak[k], 5, "key %s: %d steps in flight at once", k, peak[k])
		if peak[k] == 5 {
			live++
		}
	}
	require.Positive(t, live, "the gate is live: some key reached its limit of 5")
	require.Greater(t, samples, oracle.Size(1000, 10_000)/2)
	e.check(t, oracle.Opts{N: n, Effects: true, Counter: true, Path: linearPath},
		oracle.Summary{Seed: seed, Instances: n, Kills: 1})
}

// T3, rate limits: eight pickers (four worker processes and four clients here) race over one
// token bucket. From a log of the claims stamped with their pick's transaction time (the clock
// the bucket counts in; the oracle's log stamps the moment of the row's update, up to a
// statement's run later): every window W holds at most burst + rate × |W| grants, exactly, and
// the limit is used (the grants reach 90 % of what it allows). Then a cold key (no bucket) admits
// at its first pick.
func TestRateLimitConservationAcrossProcesses(t *testing.T) {
	t.Parallel()
	heavy.Lock()
	defer heavy.Unlock()
	seed, _ := oracle.Seed(t)
	e := newEnv(t, 16)
	ctx := context.Background()
	allowed, periodMS, burst := 50, 1000, 100 // CI: 50/s
	run := 6 * time.Second
	if oracle.Full() {
		allowed, periodMS, burst, run = 100, 60_000, 100, 2*time.Minute
	}
	rate := float64(allowed) / (float64(periodMS) / 1000)
	backlog := int(float64(burst)+rate*run.Seconds()) * 2
	rates := map[string]gendurable.Rate{"api": {Allowed: allowed, Period: time.Duration(periodMS) * time.Millisecond, Burst: burst}}
	machines := stubMachines(e, "rate", 1, 2, seed)
	job := machines[1].(gendurable.Job[string])
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: machines, RateLimits: rates})
	logRateGrants(t, e)
	var workers []*worker
	for i := range 4 {
		workers = append(workers, startWorker(t, workerCfg{Machines: machinesRaces, Conns: 5, FxConns: 3,
			URL: e.url, Schema: e.schema, Name: fmt.Sprint("r", i),
			Queues: []string{"rate"}, Conc: 8, PollMS: 20, LeaseMS: 10_000, ReaperMS: 500, StepMinMS: 1, StepMaxMS: 2,
			Rates: map[string][3]int{"api": {allowed, periodMS, burst}}, Seed: seed + uint64(i)}))
	}
	var stops []func()
	for i := range 4 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprint("local", i), Machines: machines, RateLimits: rates,
			PollInterval: 20 * time.Millisecond, Queues: map[string]gendurable.QueueConfig{"rate": {Concurrency: 8}}})
		stops = append(stops, start(t, cl))
	}
	// The backlog goes in once every picker runs, its statements prepared by its idle picks. In
	// before them, it left the full bucket to the first process's cold picks while the others
	// were starting, and on a loaded machine the bucket's refill could stop at its cap for a
	// while: the grants fell short of what the limit allowed with no fault of the engine.
	params := make([]gendurable.InsertManyParams, backlog)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With("x"), Opts: &gendurable.InsertOpts{RateLimit: "api"}}
	}
	_, err := ins.InsertMany(ctx, params)
	require.NoError(t, err)
	time.Sleep(run)
	for _, w := range workers {
		w.stop(t)
	}
	for _, stop := range stops {
		stop()
	}
	at := grantTimes(t, e, "true")
	worst := checkRateWindows(t, at, allowed, periodMS, burst)
	span := float64(at[len(at)-1]-at[0]) / 1e6
	allowedGrants := float64(burst) + rate*span
	t.Logf("%d grants in %.2fs (allowed %.0f); worst window excess %.2f tokens", len(at), span, allowedGrants, worst)
	require.GreaterOrEqual(t, float64(len(at)), 0.9*allowedGrants-1, "the limit was not used")
	require.Less(t, len(at), backlog, "the backlog outlasted the run")

	// A cold key: no bucket exists, so it holds its full burst and admits at once, though the
	// backlog's bucket is empty.
	e.exec(t, `UPDATE {schema}.instances SET status = 'available', locked_by = NULL, locked_until = NULL WHERE status = 'executing'`)
	e.exec(t, `DELETE FROM {schema}.instances WHERE status = 'available'`)
	cold, err := ins.Insert(ctx, job.With("cold"), &gendurable.InsertOpts{RateLimit: "api:cold"})
	require.NoError(t, err)
	kit := e.client(t, &gendurable.Config{Name: "cold", Machines: machines, RateLimits: rates, PollInterval: time.Hour,
		Queues: map[string]gendurable.QueueConfig{"rate": {Concurrency: 1}}})
	stopKit := start(t, kit) // its first pick (at start) must take the row
	eventually(t, 5*time.Second, "the cold key's row done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, cold.ID) == 1
	})
	stopKit()
	e.check(t, oracle.Opts{}, oracle.Summary{Seed: seed, Instances: len(at)})
}

// logRateGrants logs every grant of a rate-limited row in e's schema (oracle.LogGrants).
func logRateGrants(t *testing.T, e *env) {
	t.Helper()
	require.NoError(t, oracle.LogGrants(context.Background(), e.pool, e.schema))
}

// grantTimes returns the times of the grants logged that match where (oracle.GrantTimes); there
// must be some.
func grantTimes(t *testing.T, e *env, where string, args ...any) []int64 {
	t.Helper()
	at, err := oracle.GrantTimes(context.Background(), e.side, e.schema, where, args...)
	require.NoError(t, err)
	require.NotEmpty(t, at, "no grants")
	return at
}

// checkRateWindows requires that no window of the grants at times at overdraws a bucket of
// allowed tokens a period of periodMS and burst (oracle.RateExcess), and returns the worst
// window's excess, in tokens (at most 0).
func checkRateWindows(t *testing.T, at []int64, allowed, periodMS, burst int) float64 {
	t.Helper()
	worst, end := oracle.RateExcess(at, allowed, periodMS, burst)
	require.LessOrEqual(t, worst, 0.0, "grants up to %d overdraw the bucket by %.6f tokens", end, worst)
	return worst
}
