package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// T8 of the reliability plan: Postgres restarts mid-run, on a private cluster. Two worker
// processes run linear5 instances (CI 1,000; full 5,000) with PokePostgres and a 5s poll; at 30%
// of the steps the server restarts (pg_ctl restart -m fast), at 60% it is stopped in immediate
// mode (no checkpoint: crash recovery) and started again. 200 Await callers (30s each) wait
// across both on instances that run last. Pass: I1-I8; all done within 60s of the second start
// with no process restarted; every Await caller answered (done, busy or an error) by its
// deadline plus one tick; every loop of each worker (picks, heartbeat, reaper, GC) ticks within
// twice its interval of the second start (a tick is when work that got through began; work in
// flight at the second start ticks then; the heartbeat, which reports only beats that extend
// claims, is judged from the worker's first busy stretch); and pokes work again: 100 fresh inserts, each into an
// idle queue of its own (so only a poke can start it before the 5s poll), start with p50 < 100ms
// and p95 < 1s.
func TestPostgresRestartMidRun(t *testing.T) {
	seed, _ := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	cluster, db := privateCluster(t, nil)
	n := oracle.Size(1000, 5000)
	const awaiters, probes = 200, 100
	const poll, awaitTimeout, tick = 5 * time.Second, 30 * time.Second, 250 * time.Millisecond
	db.insert(t, n-awaiters, 5)
	late := db.insert(t, awaiters, 9) // lowest priority: they run last, after both restarts

	cfg := func(name string) workerCfg {
		return chaosCfg(cluster.URL, cluster.URL, db.schema, name, func(c *workerCfg) {
			c.PollMS, c.Poke, c.StepMS, c.Conc, c.ReaperMS, c.Probes = int(poll.Milliseconds()), "postgres", 10, 8, 500, probes
			c.Seed, c.Conns, c.Quiet, c.Ticks, c.GCMS, c.App = seed, 16, true, true, 1000, "gd-t8-"+name
		})
	}
	workers := []*worker{startWorker(t, cfg("w0")), startWorker(t, cfg("w1"))}

	// The Await callers, on a started client of the test process (its watcher answers them).
	cl, err := gendurable.NewClient(db.pool, &gendurable.Config{Schema: db.schema, AwaitTick: tick,
		Poke: gendurable.PokePostgres(), Machines: []gendurable.Machine{chaosMachine(nil, db.schema, 0, 0, 0)}})
	require.NoError(t, err)
	start(t, cl)
	type answer struct {
		status gendurable.AwaitStatus
		err    error
		took   time.Duration
	}
	answers := make([]answer, awaiters)
	awaitersFrom := time.Now()
	var wg sync.WaitGroup
	for i, id := range late {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			a, err := cl.Await(ctx, id, awaitTimeout, &gendurable.AwaitOpts{UntilTerminal: true})
			answers[i] = answer{err: err, took: time.Since(t0)}
			if err == nil {
				answers[i].status = a.Status
			}
		}()
	}

	db.waitProgress(t, n, 0.3, 2*time.Minute)
	t.Log("30%: pg_ctl restart -m fast")
	require.NoError(t, cluster.Restart(ctx, "fast"))
	db.waitProgress(t, n, 0.6, 2*time.Minute)
	t.Log("60%: pg_ctl stop -m immediate, then start (crash recovery)")
	require.NoError(t, cluster.Stop(ctx, "immediate"))
	require.NoError(t, cluster.Start(ctx))
	secondStart := time.Now()
	db.waitDone(t, n, 60*time.Second)
	recovered := time.Since(secondStart)
	t.Logf("all %d done %v after the second start", n, recovered)

	allDone := time.Now()
	wg.Wait()
	counts := map[string]int{}
	for _, a := range answers {
		key := string(a.status)
		if a.err != nil {
			key = "error"
		}
		counts[key]++
		// The scheduler's wake-up after the grace can lag a little on a loaded machine.
		require.LessOrEqual(t, a.took, awaitTimeout+tick+50*time.Millisecond, "an Await caller was held past its deadline + 1 tick")
	}
	t.Logf("Await answers: %v", counts)
	if allDone.Before(awaitersFrom.Add(awaitTimeout)) {
		// Everything finished while the callers still waited: a read that failed across a
		// restart was retried, never an error.
		require.Equal(t, awaiters, counts[string(gendurable.AwaitDone)], "every caller answered done")
	}

	// Pokes work again: each probe goes to an idle queue of its own, polled every 5s.
	lat := make([]time.Duration, 0, probes)
	probeIDs := make([]int64, probes)
	m := chaosMachine(nil, db.schema, 0, 0, 0)
	for i := range probeIDs {
		r, err := cl.Insert(ctx, m.With(path{}), &gendurable.InsertOpts{Queue: fmt.Sprint("p", i)})
		require.NoError(t, err)
		probeIDs[i] = r.ID
		time.Sleep(10 * time.Millisecond) // separate pokes, not one burst
	}
	eventually(t, 30*time.Second, "every probe started", func() bool {
		return db.count(t, `SELECT count(DISTINCT id) FROM {schema}.t_effects WHERE id = ANY($1) AND step = 's0'`, probeIDs) == probes
	})
	rows, err := db.pool.Query(ctx, expand(`SELECT extract(epoch FROM min(f.at) - i.inserted_at)
		FROM {schema}.instances i JOIN {schema}.t_effects f ON f.id = i.id AND f.step = 's0'
		WHERE i.id = ANY($1) GROUP BY i.id, i.inserted_at`, db.schema), probeIDs)
	require.NoError(t, err)
	for rows.Next() {
		var s float64
		require.NoError(t, rows.Scan(&s))
		lat = append(lat, time.Duration(s*float64(time.Second)))
	}
	require.NoError(t, rows.Err())
	slices.Sort(lat)
	p95 := lat[len(lat)*95/100-1]
	t.Logf("insert→start after recovery: p50 %v, p95 %v, max %v", lat[len(lat)/2], p95, lat[len(lat)-1])
	// A probe only the poll starts waits up to 5s for it (2.5s on average); one a poke starts,
	// milliseconds, and a few hundred at worst on a loaded machine (p95 160ms with both cores
	// otherwise busy).
	require.Less(t, lat[len(lat)/2], 100*time.Millisecond, "pokes do not work after the restarts (LISTEN not re-established)")
	require.Less(t, p95, time.Second, "some pokes do not work after the restarts")
	db.waitDone(t, n+probes, 30*time.Second)

	var reports []workerReport
	for _, w := range workers {
		reports = append(reports, w.stop(t))
	}
	st := sum(reports...)
	// Every loop of every worker came back by itself: its first tick after the second start
	// within twice its interval (the plan's bound; the heartbeat beats every lease/5 = 400ms,
	// the reaper sweeps every 500ms, GC every 1s, and a pick follows within the 5s poll).
	bounds := map[string]time.Duration{
		string(gendurable.EventSchedulerPicked): 2 * poll, string(gendurable.EventHeartbeatBeat): 2 * 400 * time.Millisecond,
		string(gendurable.EventReaperSwept): 2 * 500 * time.Millisecond, string(gendurable.EventGCSwept): 2 * time.Second,
	}
	for i, ws := range reports {
		first := ws.firstTickAfter(secondStart)
		t.Logf("worker %d: first tick after the second start: %v", i, first)
		for name, bound := range bounds {
			d, ok := first[name]
			from := "the second start"
			if name == string(gendurable.EventHeartbeatBeat) {
				// A beat is reported only when it extends claims, and the steps here are short:
				// a worker may hold none at a tick. So the beat is judged from the first time
				// after the second start that the worker ran steps without a break for two
				// intervals (every tick in there has claims to extend); a worker that never did
				// had nothing to beat for.
				busy, found := ws.busyAfter(secondStart, bound)
				if !found {
					t.Logf("worker %d: no steps in flight for %v without a break after the second start", i, bound)
					continue
				}
				d, ok = ws.firstTickAfter(busy)[name]
				from = "its first busy stretch after the second start"
			}
			require.True(t, ok, "worker %d: %s never ticked after %s", i, name, from)
			require.LessOrEqual(t, d, bound, "worker %d: %s came back %v after %s (bound %v)", i, name, d, from, bound)
		}
	}
	violations, dup := db.check(t, n+probes)
	oracle.Report(t, oracle.Summary{Test: "T8", Seed: seed, Instances: n + probes, Restarts: 2,
		Violations: violations, Lost: n + probes - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(st.steps()) / time.Since(began).Seconds(), Seconds: time.Since(began).Seconds()})
	t.Logf("stale outcomes %d, failed commit tries %d (unknown outcome %d)", st.stale(), st.CommitFailed, st.Unknown)
}
