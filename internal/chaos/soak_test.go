package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// twoStep is the soak's machine: step a, then step b finishes, each moving the counter "i" and
// the path on (I3, I5).
func twoStep() gendurable.FSM[path] {
	return gendurable.FSM[path]{Name: "two", Start: "a", Queue: "soak", Steps: map[string]gendurable.StepFunc[path]{
		"a": func(_ *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			p.I, p.Path = p.I+1, append(p.Path, "a")
			return gendurable.Next("b", p), nil
		},
		"b": func(_ *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			p.I, p.Path = p.I+1, append(p.Path, "b")
			return gendurable.Done(p), nil
		},
	}}
}

// soakMeter collects what the soak measures per window from the client's events.
type soakMeter struct {
	mu        sync.Mutex
	completed int
	picks     []time.Duration
}

func (m *soakMeter) hook(ev gendurable.Event) {
	switch {
	case ev.Name == gendurable.EventStepFinished && ev.Outcome == "done":
		m.mu.Lock()
		m.completed++
		m.mu.Unlock()
	case ev.Name == gendurable.EventSchedulerPicked:
		m.mu.Lock()
		m.picks = append(m.picks, ev.Duration)
		m.mu.Unlock()
	}
}

// take returns and resets the window's completions and pick latencies.
func (m *soakMeter) take() (int, []time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, p := m.completed, m.picks
	m.completed, m.picks = 0, nil
	return c, p
}

func soakPercentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// soakWindow is one window's record.
type soakWindow struct {
	rate          float64 // completed per second
	p50, p99      time.Duration
	live, dead    int64 // instances: live and dead tuples (pg_stat_user_tables)
	rows          int   // instances rows (count)
	engineBytes   int64 // engine tables with their indexes and toast
	instanceBytes int64
	// The most the window's once-a-second samples saw: the engine's size, and the instance
	// row versions (live and dead tuples) the table held at once.
	peakBytes, peakVersions int64
}

// soakClient starts a client for the soak in schema with the GC settings, hooked to meter.
func soakClient(t *testing.T, pool *pgxpool.Pool, schema string, lease, retention time.Duration, meter *soakMeter) *gendurable.Client {
	t.Helper()
	hooks := []func(gendurable.Event){}
	if meter != nil {
		hooks = append(hooks, meter.hook)
	}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{twoStep()},
		Queues: map[string]gendurable.QueueConfig{"soak": {Concurrency: 16}}, Lease: lease, PollInterval: 100 * time.Millisecond,
		Reaper: &gendurable.ReaperConfig{Interval: time.Second},
		GC:     &gendurable.GCConfig{Interval: time.Second, Retention: retention, Batch: 1000},
		Hooks:  hooks})
	require.NoError(t, err)
	require.NoError(t, cl.Start(context.Background()))
	return cl
}

func stopClient(t *testing.T, cl *gendurable.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.Stop(ctx))
}

// insertSoak inserts n two-step instances in one statement.
func insertSoak(ctx context.Context, cl *gendurable.Client, n int) error {
	m := twoStep()
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: m.With(path{})}
	}
	_, err := cl.InsertMany(ctx, params)
	return err
}

// T11 of the reliability plan, the bloat soak, on a private cluster with autovacuum at its
// defaults (the CI variant wakes it every second instead of every minute): open-loop arrivals
// of a two-step machine at 70% of the capacity measured first (CI: 40%; at most 500
// instances/s), GC on with a short retention, windows recording throughput, pick
// latency (p50, p99, from scheduler.picked) and the engine tables' live and dead tuples and
// sizes. Pass (relative, as in the plan): the mean throughput of the last 5 windows ≥ 90% of
// windows 2-6 (window 1 is warm-up; in CI, where neighbours hold the worker back for a window
// now and then, the engine keeps up instead: what the load left unfinished when it stopped
// drains within a window); the pick latency's p99 ≤ 2× its early value (the plan
// compares the last window with window 2; one window's p99 swings threefold with the load of a
// shared 2-core machine while the tables stay flat, so the means of the same windows as the
// throughput's are compared, with a 20ms floor: below it a 2-core machine's p99 is noise, and
// the size criterion is what catches bloat first — a CI run with vacuum asleep grew the table
// 3.7x while its late p99 mean reached 42ms); finished rows never kept past retention + 2 × GC
// interval beyond one GC batch, and (the full run, alone on its machine) instance rows never above
// rate × (retention + 2 × GC interval) × 1.2 (in CI, the neighbours' load can hold the worker
// below the offered rate for a while, and the backlog that builds up is the load's, not bloat:
// a run beside the whole suite drained 282/s of an offered 460/s for ten seconds, then caught
// up); the engine's relations at the end ≤ 1.5× their size
// at 30% of the run (the plan's minute 10 of 35; CI bounds the size per row version held, see
// sizeBound); finished rows older than retention + 10s never above 2 × the GC batch. Then I1-I8,
// and vacuum reclaims the dead tuples the run left once GC has emptied the table (autovacuum off
// fails there).
//
// CI: 10 windows of 5s, retention 5s. GD_CHAOS=full: windows of 60s, retention 60s, until
// 1,000,000 instances completed (the plan's size; about 34 minutes at 500/s), at most 40.
func TestBloatSoak(t *testing.T) {
	// A cluster of its own, offered a fixed load it carries with room to spare: it runs beside
	// the others (make chaos runs one test at a time).
	t.Parallel()
	seed, _ := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	full := oracle.Full()
	windows, window := 10, 5*time.Second
	lease, retention := 2*time.Second, 5*time.Second
	const gcInterval, gcBatch = time.Second, 1000
	maxCompleted := 1 << 62
	if full {
		windows, window = 40, time.Minute // until the millionth completion: about 34 at 500/s
		lease, retention = 10*time.Second, time.Minute
		maxCompleted = 1_000_000
	}
	// Autovacuum at its defaults, but for the CI variant's clock: 50s of load would end before
	// its first round at the default naptime (1 minute), so the compressed run wakes it every
	// second (the same ratio of vacuum rounds to GC retentions as the full run, roughly).
	settings := map[string]string{"autovacuum_naptime": "1s"}
	if full {
		settings = nil
	}
	_, db := privateCluster(t, settings)

	// Capacity: how fast one client drains a backlog here (a schema of its own, dropped after).
	calSchema := durabledbtest.Schema(t, db.pool)
	cal := soakClient(t, db.pool, calSchema, lease, retention, nil)
	backlog := oracle.Size(3000, 20000)
	t0 := time.Now()
	require.NoError(t, insertSoak(ctx, cal, backlog))
	eventually(t, 5*time.Minute, "the calibration backlog drained", func() bool {
		// Nothing left to run (GC deletes what finished more than a retention ago).
		var n int
		require.NoError(t, db.pool.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.instances WHERE status <> 'done'`, calSchema)).Scan(&n))
		return n == 0
	})
	capacity := float64(backlog) / time.Since(t0).Seconds()
	stopClient(t, cal)
	// The plan offers 70% of the measured capacity. The CI variant runs while `go test ./...`
	// tests other packages on the same two cores, so the capacity it measured is not what it
	// keeps: it offers 40%, enough to churn the tables, with headroom for the neighbours.
	share := 0.4
	if full {
		share = 0.7
	}
	rate := min(500, share*capacity)
	t.Logf("capacity %.0f instances/s (%.0f steps/s); offered load %.0f instances/s", capacity, 2*capacity, rate)

	meter := &soakMeter{}
	cl := soakClient(t, db.pool, db.schema, lease, retention, meter)
	defer stopClient(t, cl)
	liveBound := int(rate * (retention + 2*gcInterval).Seconds() * 1.2)
	oldBound := 2 * gcBatch

	load := startOpenLoad(cl, rate)

	// sample counts the instance rows, the finished ones kept past retention + 2 GC intervals
	// (stale: GC's next sweeps delete them) and those kept past retention + 10s (old).
	sample := func() (rows, stale, old int) {
		require.NoError(t, db.pool.QueryRow(ctx, expand(`SELECT count(*),
			count(*) FILTER (WHERE finalized_at < now() - $1 * interval '1 millisecond'),
			count(*) FILTER (WHERE finalized_at < now() - $2 * interval '1 millisecond')
			FROM {schema}.instances`, db.schema), (retention+2*gcInterval).Milliseconds(),
			(retention+10*time.Second).Milliseconds()).Scan(&rows, &stale, &old))
		return rows, stale, old
	}
	// footprint reads the engine's size and the instance row versions the table holds now (its
	// live and dead tuples, as the statistics count them).
	footprint := func() (bytes, versions int64) {
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT
			coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint,
			coalesce(sum(s.n_live_tup + s.n_dead_tup) FILTER (WHERE c.relname = 'instances'), 0)::bigint
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
			WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname NOT LIKE 't\_%'`, db.schema).Scan(&bytes, &versions))
		return bytes, versions
	}
	relations := func(w *soakWindow) {
		rows, err := db.pool.Query(ctx, `SELECT c.relname, pg_total_relation_size(c.oid), coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
			WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname NOT LIKE 't\_%'`, db.schema)
		require.NoError(t, err)
		var parts []string
		for rows.Next() {
			var name string
			var size, live, dead int64
			require.NoError(t, rows.Scan(&name, &size, &live, &dead))
			w.engineBytes += size
			if name == "instances" {
				w.instanceBytes, w.live, w.dead = size, live, dead
			}
			parts = append(parts, fmt.Sprintf("%s %dkB live %d dead %d", name, size/1024, live, dead))
		}
		require.NoError(t, rows.Err())
		t.Logf("  relations: %s", strings.Join(parts, "; "))
	}

	var rec []soakWindow
	maxRows, maxStale, maxOld, completed := 0, 0, 0, 0
	meter.take()
	for k := 1; k <= windows && completed < maxCompleted; k++ {
		end := time.Now().Add(window)
		var peakBytes, peakVersions int64
		for time.Now().Before(end) {
			rows, stale, old := sample()
			maxRows, maxStale, maxOld = max(maxRows, rows), max(maxStale, stale), max(maxOld, old)
			bytes, versions := footprint()
			peakBytes, peakVersions = max(peakBytes, bytes), max(peakVersions, versions)
			time.Sleep(min(time.Second, time.Until(end)))
		}
		c, picks := meter.take()
		completed += c
		w := soakWindow{rate: float64(c) / window.Seconds(), p50: soakPercentile(picks, 50), p99: soakPercentile(picks, 99)}
		w.rows, _, _ = sample()
		relations(&w)
		w.peakBytes, w.peakVersions = max(peakBytes, w.engineBytes), max(peakVersions, w.live+w.dead)
		rec = append(rec, w)
		t.Logf("window %d: %.0f completed/s, pick p50 %v p99 %v (%d picks), %d rows (max so far %d), instances %dkB, engine %dkB",
			k, w.rate, w.p50, w.p99, len(picks), w.rows, maxRows, w.instanceBytes/1024, w.engineBytes/1024)
		require.NoError(t, load.err())
	}
	inserted, err := load.stop()
	require.NoError(t, err)
	// What the load left unfinished, and how long the engine takes to finish it (CI's
	// throughput criterion, below).
	stoppedAt := time.Now()
	stoppedDB := db.now(t) // the same, by the database's clock
	left := db.count(t, `SELECT count(*) FROM {schema}.instances WHERE status <> 'done'`)
	eventually(t, 2*time.Minute, "the soak's backlog drained", func() bool {
		return db.count(t, `SELECT count(*) FROM {schema}.instances WHERE status <> 'done'`) == 0
	})
	drained := time.Since(stoppedAt)

	mean := func(ws []soakWindow) float64 {
		s := 0.0
		for _, w := range ws {
			s += w.rate
		}
		return s / float64(len(ws))
	}
	n := len(rec)
	require.GreaterOrEqual(t, n, 6, "too few windows")
	early, late := mean(rec[1:6]), mean(rec[n-5:])
	meanP99 := func(ws []soakWindow) time.Duration {
		var s time.Duration
		for _, w := range ws {
			s += w.p99
		}
		return s / time.Duration(len(ws))
	}
	p99Early, p99Late := meanP99(rec[1:6]), meanP99(rec[n-5:])
	steadyAt := max(1, n*3/10) - 1 // the plan's minute 10 of 35
	steady := rec[steadyAt]
	// The size bound. The full run, alone on its machine, keeps the plan's: the size at the end
	// against the size at 30%. A table's size is the most row versions it ever had to hold at
	// once (live rows, and dead ones until vacuum reclaims them) and the CI variant's 50 seconds
	// beside the whole suite are too short for that to settle by 30%: a neighbour that takes
	// the cores for a few seconds late in the run delays vacuum, and the table grows to hold the
	// dead versions it has not reclaimed yet (a run whose 30% sample fell just after vacuum
	// truncated the table ended 1.59x above it, with 1.38x the row versions). So CI bounds the
	// size per row version held: the end against the most the first 30% reached, scaled by how
	// many more versions the table held at once later. Space that is never reused still grows
	// past it; dead versions that are never reclaimed (vacuum asleep, a horizon held) are what
	// the reclaim check below fails on.
	sizeBound := 1.5 * float64(steady.engineBytes)
	if !full {
		var earlyBytes, earlyVersions, versions int64
		for k, w := range rec {
			if k <= steadyAt {
				earlyBytes, earlyVersions = max(earlyBytes, w.peakBytes), max(earlyVersions, w.peakVersions)
			}
			versions = max(versions, w.peakVersions)
		}
		sizeBound = 1.5 * float64(earlyBytes) * max(1, float64(versions)/float64(max(1, earlyVersions)))
		t.Logf("size bound %dkB: 1.5 × %dkB (the most by 30%%) × %d/%d (the most row versions the instances table held at once over the run, and by 30%%)",
			int64(sizeBound)/1024, earlyBytes/1024, versions, earlyVersions)
	}
	t.Logf("throughput: windows 2-6 %.0f/s, last 5 %.0f/s; %d instances unfinished when the load stopped, drained in %v; pick p99 (mean of windows): 2-6 %v, last 5 %v; engine size at 30%% %dkB, end %dkB; max rows %d (bound %d); max finished rows older than retention+2 GC intervals %d (bound %d), than retention+10s %d (bound %d)",
		early, late, left, drained.Round(time.Millisecond), p99Early, p99Late, steady.engineBytes/1024, rec[n-1].engineBytes/1024, maxRows, liveBound, maxStale, gcBatch, maxOld, oldBound)
	if full {
		require.GreaterOrEqual(t, late, 0.9*early, "throughput degraded")
	} else {
		// In CI the neighbours' load takes the cores for seconds at a time, and a window in
		// which the worker fell behind the offered load pulls the last windows' mean down
		// until it catches up (one at 182/s of an offered 288, the run's end before the
		// catch-up). What bloat would do is take the capacity below the offered load for good:
		// a backlog that grows window after window and takes longer than a window to drain
		// once the load stops (at 90% of the offered rate, 5s of arrivals over the run).
		require.LessOrEqual(t, drained, window, "the engine fell behind the offered load: its backlog took more than a window to drain")
	}
	require.LessOrEqual(t, p99Late, 2*max(p99Early, 20*time.Millisecond), "pick latency degraded")
	require.LessOrEqual(t, maxStale, gcBatch, "finished rows outlived retention + 2 × GC interval")
	if full {
		require.LessOrEqual(t, maxRows, liveBound, "instance rows grew past rate × (retention + 2 × GC interval) × 1.2")
	}
	require.LessOrEqual(t, float64(rec[n-1].engineBytes), sizeBound, "the engine's relations bloated")
	require.LessOrEqual(t, maxOld, oldBound, "GC fell behind")

	soakJudge(t, db, "T11", seed, inserted, 2*late, 2*early, began)

	// Vacuum reclaims what the run left dead. Once every instance is done, GC deletes them all
	// after retention; then an autovacuum that ended after the load stopped has left the
	// instances table fewer dead tuples than wake it (50 + 20% of the tuples its last vacuum
	// counted, the defaults), and if more remain, it wakes and vacuums again. Dead versions
	// nothing can reclaim (autovacuum off, a transaction holding the horizon) stay above it.
	reclaimWait := 2 * time.Minute
	if full {
		reclaimWait = 5 * time.Minute // retention and the default naptime are a minute each
	}
	eventually(t, reclaimWait, "GC to delete every instance", func() bool {
		return db.count(t, `SELECT count(*) FROM {schema}.instances`) == 0
	})
	var dead int64
	var wakes float64
	eventually(t, reclaimWait, "autovacuum to reclaim the dead tuples of the emptied instances table", func() bool {
		var vacuumed bool
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT s.n_dead_tup, 50 + 0.2 * greatest(c.reltuples, 0),
			coalesce(s.last_autovacuum > $2, false)
			FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
			WHERE s.schemaname = $1 AND s.relname = 'instances'`, db.schema, stoppedDB).Scan(&dead, &wakes, &vacuumed))
		return vacuumed && float64(dead) <= wakes
	})
	t.Logf("after the run: the instances table emptied and vacuumed, %d dead tuples (autovacuum wakes at %.0f)", dead, wakes)
}

// soakJudge waits for every instance of a soak to finish, checks I1-I8 and reports the summary
// line (throughput and baseline in steps/s).
func soakJudge(t *testing.T, db *chaosDB, test string, seed uint64, inserted int, throughput, baseline float64, began time.Time) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 2*time.Minute, "every instance done", func() bool {
		return db.count(t, `SELECT count(*) FROM {schema}.instances WHERE status <> 'done'`) == 0
	})
	v, err := oracle.Check(ctx, db.pool, db.schema, oracle.Opts{N: inserted, Counter: true, Path: []string{"a", "b"}})
	require.NoError(t, err)
	require.Empty(t, v)
	require.Zero(t, db.deadlocks(t), "I8 no deadlocks: the server logged some")
	dup := db.count(t, `SELECT coalesce(sum(k - 1), 0) FROM (SELECT count(*) AS k FROM {schema}.t_outcome_log
		WHERE new_status = 'done' AND old_status IS DISTINCT FROM new_status GROUP BY id) c`)
	done := db.count(t, `SELECT count(DISTINCT id) FROM {schema}.t_outcome_log WHERE new_status = 'done'`)
	oracle.Report(t, oracle.Summary{Test: test, Seed: seed, Instances: inserted, Violations: len(v), Lost: inserted - done,
		DuplicateTerminal: dup, Deadlocks: db.deadlocks(t), Throughput: throughput, Baseline: baseline,
		Seconds: time.Since(began).Seconds()})
}

// openLoad is an open-loop arrival process: a batch of two-step instances every 100ms on
// schedule, rate a second, whatever the engine does.
type openLoad struct {
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	inserted int
	fail     error
}

func startOpenLoad(cl *gendurable.Client, rate float64) *openLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &openLoad{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		next, owed := time.Now(), 0.0
		for ctx.Err() == nil {
			owed += rate / 10
			if k := int(owed); k > 0 {
				// Not cancelled by stop: an insert cancelled in flight can still commit on the
				// server after the client gave up on it, and its rows would appear after the
				// count. stop waits for it instead.
				if err := insertSoak(context.WithoutCancel(ctx), cl, k); err != nil {
					if ctx.Err() == nil {
						l.mu.Lock()
						l.fail = err
						l.mu.Unlock()
					}
					return
				}
				l.mu.Lock()
				l.inserted += k
				l.mu.Unlock()
				owed -= float64(k)
			}
			next = next.Add(100 * time.Millisecond)
			select {
			case <-time.After(time.Until(next)):
			case <-ctx.Done():
			}
		}
	}()
	return l
}

// err is the insert error that stopped the load, if any.
func (l *openLoad) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fail
}

// stop ends the load and returns how many instances it inserted.
func (l *openLoad) stop() (int, error) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inserted, l.fail
}

// T11b of the reliability plan, the long snapshot (brandur.org/postgres-queues): at steady state
// under open-loop load, a REPEATABLE READ transaction elsewhere holds its snapshot open, so
// vacuum and the indexes' dead-entry cleanup can remove nothing newer than it while the queue
// turns its rows over. The degradation is allowed, and measured: throughput, pick latency, the
// backlog and the dead tuples, window by window. Pass: within 2 minutes of the snapshot's end,
// a window's throughput is back to 90% of the baseline and the backlog back to its baseline
// (plus one second of arrivals); then I1-I8.
//
// CI: windows of 5s, 3 of baseline, a 20s snapshot, 150 instances/s. GD_CHAOS=full: windows of
// 30s, 4 of baseline, the plan's 5 minutes, 500 instances/s (the plan's load).
func TestLongSnapshotDuringSoak(t *testing.T) {
	// A cluster of its own, offered a fixed load it carries with room to spare: it runs beside
	// the others (make chaos runs one test at a time).
	t.Parallel()
	seed, _ := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	window, baseWindows, hold, rate := 5*time.Second, 3, 20*time.Second, 150.0
	lease, retention := 2*time.Second, 5*time.Second
	if oracle.Full() {
		window, baseWindows, hold, rate = 30*time.Second, 4, 5*time.Minute, 500
		lease, retention = 10*time.Second, time.Minute
	}
	_, db := privateCluster(t, map[string]string{"autovacuum_naptime": "1s"})
	meter := &soakMeter{}
	cl := soakClient(t, db.pool, db.schema, lease, retention, meter)
	defer stopClient(t, cl)
	load := startOpenLoad(cl, rate)
	meter.take()

	type sample struct {
		rate    float64
		p99     time.Duration
		backlog int // rows not finished
		dead    int64
	}
	measure := func(phase string, k int) sample {
		time.Sleep(window)
		c, picks := meter.take()
		s := sample{rate: float64(c) / window.Seconds(), p99: soakPercentile(picks, 99)}
		s.backlog = db.count(t, `SELECT count(*) FROM {schema}.instances WHERE status IN ('available', 'executing')`)
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'instances'`, db.schema).Scan(&s.dead))
		t.Logf("%s window %d: %.0f completed/s, pick p99 %v, backlog %d, dead tuples %d", phase, k, s.rate, s.p99, s.backlog, s.dead)
		require.NoError(t, load.err())
		return s
	}

	// Window 1 is warm-up; the baseline is the mean of the rest.
	measure("warm-up", 1)
	var baseline float64
	baseBacklog := 0
	for k := 1; k <= baseWindows; k++ {
		s := measure("baseline", k)
		baseline += s.rate / float64(baseWindows)
		baseBacklog = max(baseBacklog, s.backlog)
	}

	// The long snapshot: a REPEATABLE READ transaction that has read once and then idles.
	conn, err := db.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	var seen int
	require.NoError(t, tx.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.instances`, db.schema)).Scan(&seen))
	var during []sample
	for k := 1; k <= int(hold/window); k++ {
		during = append(during, measure("snapshot held", k))
	}
	require.NoError(t, tx.Rollback(ctx))
	closed := time.Now()

	// Recovery: a window back at 90% of the baseline with the backlog drained, within 2 minutes.
	drained := baseBacklog + int(rate)
	recovered := time.Duration(-1)
	for k := 1; time.Since(closed) < 2*time.Minute; k++ {
		s := measure("after", k)
		if s.rate >= 0.9*baseline && s.backlog <= drained {
			recovered = time.Since(closed)
			break
		}
	}
	inserted, err := load.stop()
	require.NoError(t, err)
	var worst sample
	worstRate := baseline
	for _, s := range during {
		worstRate = min(worstRate, s.rate)
		worst.p99, worst.backlog, worst.dead = max(worst.p99, s.p99), max(worst.backlog, s.backlog), max(worst.dead, s.dead)
	}
	t.Logf("baseline %.0f completed/s (backlog ≤ %d); snapshot held %v: worst window %.0f/s, pick p99 up to %v, backlog up to %d, dead tuples up to %d; recovered %v after it closed",
		baseline, baseBacklog, hold, worstRate, worst.p99, worst.backlog, worst.dead, recovered.Round(time.Second))
	require.GreaterOrEqual(t, recovered, time.Duration(0),
		"throughput did not return to 90%% of %.0f/s with the backlog at most %d within 2 minutes of the snapshot's end", baseline, drained)
	soakJudge(t, db, "T11b", seed, inserted, 2*worstRate, 2*baseline, began)
}
