package chaos

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/faultproxy"
	"github.com/stretchr/testify/require"
)

// viaProxy starts a fault proxy in front of the server of dbURL and returns it with dbURL
// rewritten to go through it; the proxy is closed when the test ends.
func viaProxy(t *testing.T, dbURL string) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	p, err := faultproxy.New(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port()))
	return p, u.String()
}

// T9a of the reliability plan: every 2s the engine's backends (found by application_name
// gd-…) are terminated with pg_terminate_backend, during a run of 2,000 steps (CI; 10,000 with
// GD_CHAOS=full) by two worker processes. Pass: all done within 2 minutes, I1-I8.
func TestSessionKills(t *testing.T) {
	// A cluster of its own, offered a fixed load it carries with room to spare: it runs beside
	// the others (make chaos runs one test at a time).
	t.Parallel()
	seed, _ := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	cluster, db := privateCluster(t, nil)
	n := oracle.Size(2000, 10000) / 5
	db.insert(t, n, 5)
	cfg := func(name string) workerCfg {
		return chaosCfg(cluster.URL, cluster.URL, db.schema, name, func(c *workerCfg) {
			c.StepMS, c.Conc, c.Seed, c.Quiet, c.App = 80, 4, seed, true, "gd-t9a-"+name
		})
	}
	workers := []*worker{startWorker(t, cfg("w0")), startWorker(t, cfg("w1"))}
	kills, rounds := 0, 0
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for db.done(t) < n {
		require.True(t, time.Now().Before(deadline), "not all done within 2 minutes")
		select {
		case <-tick.C:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		var k int
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name LIKE 'gd-%' AND pid <> pg_backend_pid()`).Scan(&k))
		kills += k
		rounds++
	}
	t.Logf("%d instances done in %v; %d backends terminated in %d rounds", n, time.Since(began), kills, rounds)
	require.Positive(t, kills)
	var reports []workerReport
	for _, w := range workers {
		reports = append(reports, w.stop(t))
	}
	st := sum(reports...)
	violations, dup := db.check(t, n)
	oracle.Report(t, oracle.Summary{Test: "T9a", Seed: seed, Instances: n, ConnectionsCut: kills, Violations: violations,
		Lost: n - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(st.steps()) / time.Since(began).Seconds(), Seconds: time.Since(began).Seconds()})
	t.Logf("stale outcomes %d, failed commit tries %d (unknown outcome %d)", st.stale(), st.CommitFailed, st.Unknown)
}

// T9b e1 of the reliability plan: two worker processes reach Postgres through the fault proxy,
// which resets every connection every U(50, 500)ms for 10s (CI; 60s with GD_CHAOS=full) while
// instances keep arriving. Resets land during COMMITs whose acknowledgement is lost: the worker
// cannot know whether its outcome committed (pgconn.SafeToRetry false). Pass: I1-I8 hold (the
// retry of a commit that did land finds its rows fenced and reports them stale), and at least
// one such unknown-outcome commit was seen.
func TestConnectionResetsLoseCommitAcks(t *testing.T) {
	seed, rng := oracle.Seed(t)
	began := time.Now()
	cluster, db := privateCluster(t, nil)
	proxy, via := viaProxy(t, cluster.URL)
	faultFor := time.Duration(oracle.Size(10, 60)) * time.Second
	cfg := func(name string) workerCfg {
		return chaosCfg(via, cluster.URL, db.schema, name, func(c *workerCfg) {
			c.StepMS, c.Conc, c.Seed, c.Quiet, c.App = 10, 8, seed, true, "gd-t9b-"+name
		})
	}
	workers := []*worker{startWorker(t, cfg("w0")), startWorker(t, cfg("w1"))}
	// Open-loop arrivals: 25 instances every 250ms (500 steps/s offered) for the whole window.
	n := 0
	resets := 0
	end := time.Now().Add(faultFor)
	nextInsert, nextReset := time.Now(), time.Now()
	for now := time.Now(); now.Before(end); now = time.Now() {
		if !now.Before(nextInsert) {
			db.insert(t, 25, 5)
			n += 25
			nextInsert = nextInsert.Add(250 * time.Millisecond)
		}
		if !now.Before(nextReset) {
			resets += proxy.ResetAll()
			nextReset = now.Add(time.Duration(50+rng.IntN(451)) * time.Millisecond)
		}
		time.Sleep(min(time.Until(nextInsert), time.Until(nextReset), 10*time.Millisecond))
	}
	t.Logf("%d connections reset in %v; %d instances inserted", resets, faultFor, n)
	db.waitDone(t, n, 2*time.Minute)
	var reports []workerReport
	for _, w := range workers {
		reports = append(reports, w.stop(t))
	}
	st := sum(reports...)
	t.Logf("stale outcomes %d, failed commit tries %d, of which unknown outcome %d", st.stale(), st.CommitFailed, st.Unknown)
	violations, dup := db.check(t, n)
	require.GreaterOrEqual(t, st.Unknown, 1, "no commit with an unknown outcome was observed: raise the fault rate")
	oracle.Report(t, oracle.Summary{Test: "T9b-e1", Seed: seed, Instances: n, ConnectionsCut: resets, Faults: st.Unknown,
		Violations: violations, Lost: n - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(st.steps()) / time.Since(began).Seconds(), Seconds: time.Since(began).Seconds()})
}

// T9b e2 of the reliability plan, a partition: worker A reaches Postgres through the fault
// proxy, worker B directly. Mid-run A's path is blackholed for 10s: its heartbeats and outcomes
// stall, its leases expire, B's reaper releases its claims and B finishes them; after the heal
// A's buffered commits arrive and are fenced out. Pass: I1-I8 (no rewind), outcome.stale ≥ 1 on
// A, A's statements gave up within the blackhole (it is not pinned by its hung connections), and
// every instance A held is done within lease + reaper + 2s of the moment its lease ran out
// (blackhole start + lease).
func TestPartitionedWorkerIsFencedOut(t *testing.T) {
	seed, _ := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	cluster, db := privateCluster(t, nil)
	proxy, via := viaProxy(t, cluster.URL)
	n := oracle.Size(300, 1000)
	db.insert(t, n, 5)
	const lease, reaper, hole = 2 * time.Second, 250 * time.Millisecond, 10 * time.Second
	set := func(c *workerCfg) {
		leaseMS(int(lease.Milliseconds()))(c)
		c.ReaperMS, c.StepMS, c.Conc, c.Seed, c.Quiet = int(reaper.Milliseconds()), 10, 8, seed, true
	}
	// A's steps take a second: whenever it holds claims, it is running steps for them, whose
	// outcomes it must then try to commit through the dark path.
	a := startWorker(t, chaosCfg(via, cluster.URL, db.schema, "A", set, func(c *workerCfg) { c.App, c.StepMS = "gd-t9b-a", 1000 }))
	b := startWorker(t, chaosCfg(cluster.URL, cluster.URL, db.schema, "B", set, func(c *workerCfg) {
		c.App, c.Conc = "gd-t9b-b", 16
	}))
	db.waitProgress(t, n, 0.5, 2*time.Minute)
	// A's rows go back to available between its steps (every outcome here is a Next) until its
	// next pick: cut it off while it holds claims, not in such a gap.
	eventually(t, 30*time.Second, "A holding claims", func() bool {
		return db.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND starts_with(locked_by, 'A:')`) > 0
	})

	dbT0 := db.now(t)
	t0 := time.Now()
	proxy.Blackhole(hole)
	// What A holds: statements it had on the server when the path went dark finish there.
	eventually(t, 10*time.Second, "A's statements on the server finished", func() bool {
		return db.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gd-t9b-a' AND state = 'active'`) == 0
	})
	var held []int64
	rows, err := db.pool.Query(ctx, expand(`SELECT id FROM {schema}.instances WHERE status = 'executing'
		AND starts_with(locked_by, 'A:')`, db.schema))
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		held = append(held, id)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, held, "A held no claims when it was cut off")
	due := lease + (lease + reaper + 2*time.Second)
	eventually(t, due+5*time.Second, "A's instances done by B", func() bool {
		return db.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'done'`, held) == len(held)
	})
	took := time.Since(t0)
	t.Logf("A held %d claims; all done by B %v after the blackhole began (bound %v)", len(held), took, due)
	require.LessOrEqual(t, took, due, "A's instances were not taken over within lease + reaper + 2s of its leases' end")
	require.Positive(t, db.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND errors @> '[{"kind":"lease"}]'`, held),
		"B's reaper released A's claims")

	db.waitDone(t, n, 2*time.Minute)
	// Stop A only once it talks to the database again: its drain then commits what it holds,
	// and the outcomes of the claims B took over are fenced out.
	eventually(t, hole+30*time.Second, "A back on the database after the heal", func() bool {
		return db.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'gd-t9b-a'
			AND state_change > $1::timestamptz + $2 * interval '1 millisecond'`, dbT0, hole.Milliseconds()) > 0
	})
	sa, sb := a.stop(t), b.stop(t)
	t.Logf("A: stale %d, failed commit tries %d; B: stale %d", sa.stale(), sa.CommitFailed, sb.stale())
	// A was running steps for the claims it held when the path went dark: their outcomes' commits
	// failed in the dark (each try gives up within a lease), and once back, B had taken them over.
	require.GreaterOrEqual(t, sa.stale(), 1, "A's late outcomes were not dropped as stale")
	require.GreaterOrEqual(t, sa.CommitFailed, 1, "A's commits hung for the whole blackhole instead of giving up")
	violations, dup := db.check(t, n)
	oracle.Report(t, oracle.Summary{Test: "T9b-e2", Seed: seed, Instances: n, Faults: 1, Violations: violations,
		Lost: n - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(sa.steps()+sb.steps()) / time.Since(began).Seconds(), Seconds: time.Since(began).Seconds()})
}
