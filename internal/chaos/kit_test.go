package chaos

// The reliability suite's shared parts for the multi-process tests (T1, T1b, T1c, T4, T16, T17):
// a crew of worker processes to kill, pause and restart, and the checks that read the
// oracle's logs. Sizes: oracle.Size (GD_CHAOS=full for the full size); seeds: oracle.Seed.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// t1Cfg is the worker configuration of T1 (docs/reliability.md): the crash set, lease 2s,
// heartbeat 500ms, reaper every 250ms, poll 100ms, 8 steps at once, steps of 5ms; set changes the
// rest.
func (e *env) t1Cfg(name string, set ...func(*workerCfg)) workerCfg {
	t1 := func(c *workerCfg) {
		c.LeaseMS, c.HeartbeatMS, c.ReaperMS, c.PollMS, c.Conc, c.StepMS = 2000, 500, 250, 100, 8, 5
	}
	return e.crashCfg(name, append([]func(*workerCfg){t1}, set...)...)
}

const (
	t1Lease  = 2000 * time.Millisecond
	t1Reaper = 250 * time.Millisecond
)

// crew is a set of worker processes that a test kills, pauses and restarts.
type crew struct {
	t   *testing.T
	e   *env
	cfg workerCfg
	// vary, if set, changes worker i's configuration in every incarnation.
	vary func(i int, c *workerCfg)
	// name gives worker i's name in its gen-th incarnation.
	name    func(i, gen int) string
	workers []*worker
	// all is every worker the crew started, the killed ones too.
	all  []*worker
	gens []int
	// killed and paused are the pids SIGKILLed and SIGSTOPped: their effects may repeat.
	killed, paused map[int]bool
	kills, pauses  int
	lastKill       time.Time
}

// newCrew starts n workers configured by cfg; name(i, gen) names them (nil: "w<i>" in every
// incarnation, so a restart takes over its predecessor's worker-id prefix).
func newCrew(t *testing.T, e *env, n int, name func(i, gen int) string, cfg workerCfg) *crew {
	t.Helper()
	return newVariedCrew(t, e, n, name, cfg, nil)
}

// newVariedCrew is newCrew with vary(i, cfg) changing worker i's configuration.
func newVariedCrew(t *testing.T, e *env, n int, name func(i, gen int) string, cfg workerCfg, vary func(i int, c *workerCfg)) *crew {
	t.Helper()
	if name == nil {
		name = func(i, _ int) string { return fmt.Sprint("w", i) }
	}
	c := &crew{t: t, e: e, cfg: cfg, vary: vary, name: name, workers: make([]*worker, n), gens: make([]int, n),
		killed: map[int]bool{}, paused: map[int]bool{}}
	for i := range c.workers {
		c.workers[i] = c.spawn(i)
	}
	return c
}

// spawn starts worker i under its name in its current incarnation.
func (c *crew) spawn(i int) *worker {
	c.t.Helper()
	cfg := c.cfg
	cfg.Name = c.name(i, c.gens[i])
	if c.vary != nil {
		c.vary(i, &cfg)
	}
	w := startWorker(c.t, cfg)
	c.all = append(c.all, w)
	return w
}

// doneAt is when a worker's commit finished instance id, as the worker marked it
// (workerCfg.Marks), if one did.
func (c *crew) doneAt(id int64) (time.Time, bool) {
	for _, w := range c.all {
		if at, ok := w.doneAt(id); ok {
			return at, true
		}
	}
	return time.Time{}, false
}

// kill SIGKILLs worker i and restarts it at once under its next name.
func (c *crew) kill(i int) {
	c.t.Helper()
	c.killed[c.workers[i].pid()] = true
	c.workers[i].kill()
	c.kills++
	c.lastKill = time.Now()
	c.gens[i]++
	c.workers[i] = c.spawn(i)
}

// pause SIGSTOPs worker i until resume.
func (c *crew) pause(i int) {
	c.t.Helper()
	c.paused[c.workers[i].pid()] = true
	c.pauses++
	c.workers[i].pause(c.t)
}

func (c *crew) resume(i int) {
	c.t.Helper()
	c.workers[i].resume(c.t)
}

// faulted says whether pid was killed or paused.
func (c *crew) faulted(pid int) bool { return c.killed[pid] || c.paused[pid] }

// killLoop SIGKILLs a random worker (restarting it at once) every interval() until done() holds,
// and fails the test at the deadline. done is polled in between, so the loop ends within a
// few milliseconds of it.
func (c *crew) killLoop(rng *rand.Rand, deadline time.Duration, interval func() time.Duration, done func() bool) {
	c.t.Helper()
	end := time.Now().Add(deadline)
	next := time.Now().Add(interval())
	for !done() {
		if time.Now().After(end) {
			c.t.Fatalf("not done within %v (%d kills)", deadline, c.kills)
		}
		if time.Now().After(next) {
			c.kill(rng.IntN(len(c.workers)))
			next = time.Now().Add(interval())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// claimEnds sorts the claims taken by owners LIKE ownerLike, each as (instance, step, attempt),
// by how the database shows them ended: lost, when the instance's next committed transition was
// not that claim's outcome (a machine whose every outcome moves the step on or finishes, like
// linear5 and fan) but a release by the reaper or startup reclaim, or there was none; or ended by
// the claim's own outcome (any other next transition). It counts the claims of each key: a
// release gives the attempt back, so the same owner may claim the same key again.
func claimEnds(t *testing.T, e *env, ownerLike string) (lost, ended map[staleClaim]int) {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), expand(`SELECT id, new_step, attempt,
		       next_seq IS NULL OR (next_status = 'available' AND next_step = new_step)
		FROM (SELECT id, attempt, locked_by, new_status, old_status, new_step,
		             lead(new_status) OVER w AS next_status, lead(new_step) OVER w AS next_step, lead(seq) OVER w AS next_seq
		      FROM {schema}.t_outcome_log WINDOW w AS (PARTITION BY id ORDER BY seq)) c
		WHERE new_status = 'executing' AND old_status IS DISTINCT FROM 'executing' AND locked_by LIKE $1`, e.schema), ownerLike)
	require.NoError(t, err)
	defer rows.Close()
	lost, ended = map[staleClaim]int{}, map[staleClaim]int{}
	for rows.Next() {
		var id int64
		var step string
		var attempt int32
		var isLost bool
		require.NoError(t, rows.Scan(&id, &step, &attempt, &isLost))
		if isLost {
			lost[staleClaim{id, step, int64(attempt)}]++
		} else {
			ended[staleClaim{id, step, int64(attempt)}]++
		}
	}
	require.NoError(t, rows.Err())
	return lost, ended
}

// lostClaimIDs lists the instances that had a claim lost (see claimEnds), by any owner.
func lostClaimIDs(t *testing.T, e *env) map[int64]bool {
	t.Helper()
	lost, _ := claimEnds(t, e, "%")
	ids := map[int64]bool{}
	for c := range lost {
		ids[c.ID] = true
	}
	return ids
}

// unexplainedDuplicates counts the repeated effects no fault explains: for each (id, step)
// with k effect rows where the step runs x times in a fault-free run (1, or runs[machine] for a
// machine that runs each step more than once), at least k-x must be explained, either by runs
// in processes that were killed or paused, or by lost leases. A worker whose heartbeats time out
// under load loses its claim to the reaper, and the step runs again (at-least-once, as
// documented): the release is recorded in the instance's error history (kind "lease", with the
// step and the attempt), and gives the attempt back, so the rerun records its effect under the
// same attempt as the lost run. A release explains one repeat among the effects of its step and
// attempt, a faulted run one repeat; the larger of the two counts is taken, since a killed
// worker's lease is released too.
func unexplainedDuplicates(t *testing.T, e *env, faulted func(pid int) bool, runs map[string]int) int {
	t.Helper()
	machines, times := []string{}, []int32{}
	for m, x := range runs {
		machines, times = append(machines, m), append(times, int32(x))
	}
	rows, err := e.pool.Query(context.Background(), expand(`WITH per_attempt AS (
			SELECT f.id, f.step, count(*) AS k,
			       (SELECT count(*) FROM {schema}.instances AS i,
			               jsonb_array_elements(coalesce(i.errors, '[]'::jsonb)) AS x(e)
			        WHERE i.id = f.id AND x.e->>'kind' = 'lease' AND x.e->>'step' = f.step
			          AND (x.e->>'attempt')::int = f.attempt) AS leases
			FROM {schema}.t_effects AS f
			GROUP BY f.id, f.step, f.attempt
		)
		SELECT f.id, f.step, array_agg(f.pid), coalesce(min(r.times), 1),
		       (SELECT coalesce(sum(least(a.k - 1, a.leases)), 0)::bigint FROM per_attempt AS a
		        WHERE a.id = f.id AND a.step = f.step)
		FROM {schema}.t_effects f
		JOIN {schema}.instances i ON i.id = f.id
		LEFT JOIN unnest($1::text[], $2::int[]) AS r(machine, times) ON r.machine = i.machine
		GROUP BY f.id, f.step HAVING count(*) > coalesce(min(r.times), 1)`, e.schema), machines, times)
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id int64
		var step string
		var pids []int32
		var expected int
		var leases int64
		require.NoError(t, rows.Scan(&id, &step, &pids, &expected, &leases))
		fromFaulted := 0
		for _, p := range pids {
			if faulted(int(p)) {
				fromFaulted++
			}
		}
		if max(fromFaulted, int(leases)) < len(pids)-expected {
			n++
			t.Errorf("unexplained repeat of %d/%s by pids %v (%d repeats explained by lost leases)", id, step, pids, leases)
		}
	}
	require.NoError(t, rows.Err())
	return n
}

// verdict runs the oracle, fills the summary's outcome figures from it, reports the summary
// (one chaos-summary line for `make chaos`) and fails the test on any violation.
func verdict(t *testing.T, e *env, o oracle.Opts, s oracle.Summary) {
	t.Helper()
	ctx := context.Background()
	violations, err := oracle.Check(ctx, e.pool, e.schema, o)
	require.NoError(t, err)
	tally, err := oracle.Count(ctx, e.pool, e.schema)
	require.NoError(t, err)
	s.Violations = len(violations)
	s.Lost = max(o.N, tally.Instances) - tally.Finished
	s.DuplicateTerminal = tally.DuplicateTerminal
	if s.Instances == 0 {
		s.Instances = tally.Instances
	}
	e.summary = &s // reported with I8, when the test ends
	for _, v := range violations {
		t.Errorf("invariant violated: %s", v)
	}
	require.Zero(t, s.Lost, "instances lost")
	require.Zero(t, s.DuplicateTerminal, "duplicate terminal transitions")
}

// throughput is committed steps per second in [from, to), over the span from the window's first
// committed step to its last (so that neither the wait for the first pick nor an idle tail
// counts).
func throughput(t *testing.T, e *env, from, to time.Time) float64 {
	t.Helper()
	var first, last *time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`SELECT min(at), max(at) FROM {schema}.t_outcome_log
		WHERE old_status = 'executing' AND (new_step <> old_step OR new_status IN ('done', 'failed', 'awaiting', 'joining'))
		  AND at >= $1 AND at < $2`, e.schema), from, to).Scan(&first, &last))
	if first == nil || !last.After(*first) {
		return 0
	}
	n, err := oracle.Steps(context.Background(), e.pool, e.schema, *first, last.Add(time.Microsecond))
	require.NoError(t, err)
	return float64(n) / last.Sub(*first).Seconds()
}

// percentile returns the p-th percentile (0 < p ≤ 1) of xs (nearest rank); 0 for none.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// oracleEnv is a reliability test's start: its own schema with the oracle installed, and the
// database's deadlock count before the test (invariant I8).
func oracleEnv(t *testing.T) (*env, context.Context) {
	t.Helper()
	return newEnv(t, 16), context.Background()
}

// sampler runs query (one statement: one snapshot) every 5ms until stop is called, with the
// arguments args gives for that sample (nil: none), passing each row's values to each; stop
// returns how many samples it took. A sample that fails fails the test and ends the sampling,
// but for one that ran out of its second (a machine busy with the test's processes): it is
// skipped, and the next one is taken. Its callers require a number of samples.
func sampler(t *testing.T, e *env, args func() []any, query string, each func(vals []any)) (stop func() int) {
	t.Helper()
	stopAll := sampleEvery(t, e, args, query, each, func(err error) bool {
		if pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) {
			return true
		}
		t.Error(err)
		return false
	})
	return func() int { n, _ := stopAll(); return n }
}

// sampleEvery is sampler with a say on failures: a sample that fails (each up to a second) is
// passed to failed, and the sampling goes on while failed returns true (a sample of a database
// changing primaries skips the samples it cannot take: the next one reconnects). stop returns
// how many samples it took and how many failed.
func sampleEvery(t *testing.T, e *env, args func() []any, query string, each func(vals []any),
	failed func(error) bool) (stop func() (samples, failures int)) {
	t.Helper()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	var samples, failures atomic.Int64
	sample := func() error {
		var a []any
		if args != nil {
			a = args()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		rows, err := e.side.Query(ctx, e.q(query), a...)
		if err != nil {
			return err
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return err
			}
			each(vals)
		}
		rows.Close()
		return rows.Err()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			if err := sample(); err != nil {
				failures.Add(1)
				if !failed(err) {
					return
				}
				continue
			}
			samples.Add(1)
		}
	}()
	var once sync.Once
	stop = func() (int, int) {
		once.Do(func() { close(quit); wg.Wait() })
		return int(samples.Load()), int(failures.Load())
	}
	t.Cleanup(func() { stop() }) // before the database goes, if the test ends early
	return stop
}

// busyBackends is the FROM clause of the backends of the connections named $1 that run a
// statement (or, with written, also hold an open transaction that wrote or locked rows: one with
// a transaction id).
func busyBackends(written bool) string {
	q := `FROM pg_stat_activity WHERE application_name = $1 AND (state = 'active'`
	if written {
		q += ` OR state LIKE 'idle in transaction%' AND backend_xid IS NOT NULL`
	}
	return q + `)`
}

// idle waits up to limit for no backend of the connections named app to be busy (busyBackends),
// and says whether that came.
func idle(t *testing.T, e *env, app string, written bool, limit time.Duration) bool {
	t.Helper()
	for end := time.Now().Add(limit); e.count(t, `SELECT count(*) `+busyBackends(written), app) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}
