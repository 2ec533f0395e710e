package maintenance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// gcEnv is one test's schema, pool and statements.
type gcEnv struct {
	pool   *pgxpool.Pool
	schema string
	st     *store.Store
}

func newGCEnv(t *testing.T) *gcEnv {
	t.Helper()
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	st, err := store.New(schema)
	require.NoError(t, err)
	return &gcEnv{pool: pool, schema: schema, st: st}
}

// newDeadlockFreeGCEnv is newGCEnv in a database of the test's own (oracle.Database), whose
// deadlock count must be zero when the test ends: read once every connection of the test has
// closed, it misses none and holds no other test's.
func newDeadlockFreeGCEnv(t *testing.T) *gcEnv {
	t.Helper()
	dsn := oracle.Database(t, func(n int64) {
		if n != 0 {
			t.Errorf("the test's database counted %d deadlocks", n)
		}
	})
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	schema := durabledbtest.Schema(t, pool)
	st, err := store.New(schema)
	require.NoError(t, err)
	return &gcEnv{pool: pool, schema: schema, st: st}
}

func (e *gcEnv) q(s string) string { return strings.ReplaceAll(s, "{schema}", `"`+e.schema+`"`) }

func (e *gcEnv) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), e.q(sql), args...)
	require.NoError(t, err)
}

func (e *gcEnv) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), e.q(sql), args...).Scan(&n))
	return n
}

// oldFinished inserts n finished rows (done, failed, cancelled in turn) finalized two days ago,
// one millisecond apart, in one statement.
const oldFinished = `
INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, finalized_at, inserted_at, updated_at)
SELECT 'm', 's', 'q', (ARRAY['done', 'failed', 'cancelled']::{schema}.status[])[1 + g % 3], 1, '{}'::jsonb,
       now() - interval '2 days' + g * interval '1 millisecond', now() - interval '3 days', now() - interval '2 days'
FROM generate_series(1, $1::integer) AS g`

func (e *gcEnv) gc(retention time.Duration, batch int) *GC {
	return &GC{Store: e.st, DB: e.pool, Interval: time.Minute, Retention: retention, Batch: batch,
		Budget: 10 * time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Emit: func(durabletype.Event) {}}
}

// planNodes flattens an EXPLAIN (FORMAT JSON) plan.
func planNodes(t *testing.T, raw []byte) []map[string]any {
	t.Helper()
	var doc []map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	var out []map[string]any
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		out = append(out, n)
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	walk(doc[0]["Plan"].(map[string]any))
	return out
}

// requireIndexPlan checks that a GC batch's plan reads instances through
// instances_finished_by_machine and never scans the table.
func requireIndexPlan(t *testing.T, raw []byte) {
	t.Helper()
	usesIndex := false
	for _, n := range planNodes(t, raw) {
		if n["Relation Name"] == "instances" && n["Node Type"] != "ModifyTable" {
			// An index scan without a condition reads the whole index: as bad as a table scan.
			require.Equal(t, "Index Scan", n["Node Type"], "a GC batch scans the instances table:\n%s", raw)
			require.NotEmpty(t, n["Index Cond"], "a GC batch reads a whole index of instances:\n%s", raw)
		}
		if n["Index Name"] == "instances_finished_by_machine" {
			usesIndex = true
		}
	}
	require.True(t, usesIndex, "a GC batch does not use instances_finished_by_machine:\n%s", raw)
}

// explainGeneric explains the GC statement as a prepared statement's generic plan (the plan a
// pooled connection settles on after a few executions), with the named parameters made
// positional.
func explainGeneric(t *testing.T, e *gcEnv) []byte {
	t.Helper()
	ctx := context.Background()
	conn, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	sql := e.st.Statement("gc_instances")
	for i, p := range []string{"machine", "retention_ms", "after_at", "after_id", "batch"} {
		sql = regexp.MustCompile(`@`+p+`\b`).ReplaceAllLiteralString(sql, fmt.Sprintf("$%d", i+1))
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE gd_gc_generic (text, bigint, timestamptz, bigint, bigint) AS "+sql, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE gd_gc_generic") }()
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE gd_gc_generic ('m', 3600000, '-infinity', 0, 1000)",
		pgx.QueryExecModeSimpleProtocol).Scan(&raw))
	return raw
}

// A large history (300,000 finished rows; a million with GD_CHAOS=full): every batch reads them
// through the finalized index, the last batch costs what the first did, and nothing young, live
// or still needed by a live parent's join is deleted. Inboxes of deleted instances go with them.
func TestGCOfALargeHistoryCostsTheSamePerBatch(t *testing.T) {
	history := oracle.Size(300_000, 1_000_000)
	e := newGCEnv(t)
	ctx := context.Background()
	began := time.Now()
	e.exec(t, oldFinished, history)
	// Young finished rows, live rows (with signals) and a fan-out: a live parent on its second
	// wave, a finished parent, and children whose parent row is gone.
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, finalized_at)
		SELECT 'm', 's', 'q', 'done', 1, '{}', now() FROM generate_series(1, 500)`)
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, signalled)
		SELECT 'm', 's', 'q', (ARRAY['available', 'awaiting']::{schema}.status[])[1 + g % 2], 1, '{}', true
		FROM generate_series(1, 500) AS g`)
	e.exec(t, `INSERT INTO {schema}.signals (instance_id, name)
		SELECT id, 'x' FROM {schema}.instances WHERE status IN ('available', 'awaiting')
		UNION ALL
		SELECT id, 'late' FROM {schema}.instances WHERE status = 'failed' AND id % 100 = 2`)
	e.exec(t, `WITH live AS (
		  INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, spawn_wave, pending_children, join_due)
		  VALUES ('parent', 'join', 'q', 'joining', 1, '{}', 2, 1, true) RETURNING id
		), gone AS (
		  INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, spawn_wave, finalized_at)
		  VALUES ('parent', 'join', 'q', 'done', 1, '{}', 1, now() - interval '2 days') RETURNING id
		)
		INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, parent_id, parent_wave, finalized_at)
		SELECT 'child', 's', 'q', 'done', 1, ('{"keep":' || (w = 2 AND p = 'live')::text || '}')::jsonb, pid, w, now() - interval '2 days'
		FROM (SELECT id AS pid, 'live' AS p FROM live UNION ALL SELECT id, 'gone' FROM gone
		      UNION ALL SELECT -1, 'missing') AS ps, generate_series(1, 2) AS w, generate_series(1, 5)`)
	e.exec(t, `ANALYZE {schema}.instances`)
	e.exec(t, `ANALYZE {schema}.signals`)
	total := e.count(t, `SELECT count(*) FROM {schema}.instances`)
	keptChildren := 5 // the live parent's second wave
	doomed := history + 1 + 3*2*5 - keptChildren
	t.Logf("set-up: %d rows in %v", total, time.Since(began))

	requireIndexPlan(t, explainGeneric(t, e))
	// A transaction elsewhere holds a snapshot older than every delete (an analytics query, a
	// forgotten session): the deleted rows stay visible to it, so no scan can skip their index
	// entries as dead. Only the cursor keeps a batch from stepping over the sweep's own work.
	old, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = old.Rollback(ctx) }()
	_, err = old.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
	require.NoError(t, err)
	require.NoError(t, old.QueryRow(ctx, e.q(`SELECT count(*) FROM {schema}.signals`)).Scan(new(int)))
	var times []time.Duration
	var firstBuffers, lastBuffers []int
	full := doomed / 1000
	g := e.gc(time.Hour, 1000)
	plans := 0
	mPlans := 0
	g.beforeBatch = func(machine string, from store.GCCursor) {
		plans++
		// The plan of every batch, with the cursor it starts from.
		var raw []byte
		require.NoError(t, e.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+e.st.Statement("gc_instances"),
			e.st.GCInstancesArgs(machine, time.Hour, 1000, from)).Scan(&raw))
		requireIndexPlan(t, raw)
		if machine != "m" { // the history's machine; the others' few rows take a batch each
			return
		}
		i := mPlans
		mPlans++
		// The pages the batch touches (deterministic, unlike its time on a shared machine): the
		// first ten batches and the last ten full ones, run and rolled back before they run.
		if i < 10 {
			firstBuffers = append(firstBuffers, batchBuffers(t, e, from))
		} else if i >= full-10 && i < full {
			lastBuffers = append(lastBuffers, batchBuffers(t, e, from))
		}
	}
	g.afterBatch = func(machine string, _ int, took time.Duration) {
		if machine == "m" {
			times = append(times, took)
		}
	}
	var swept durabletype.Event
	g.Emit = func(ev durabletype.Event) { swept = ev }
	sweepStart := time.Now()
	res, err := g.Sweep(ctx)
	require.NoError(t, err)
	t.Logf("sweep: %d rows in %d batches, %v", res.Instances, res.Batches, time.Since(sweepStart))
	require.Equal(t, doomed, res.Instances)
	// Machine m: full batches, then the short one that ends its sweep; child and parent: one
	// short batch each.
	require.Equal(t, history/1000+1+2, res.Batches)
	require.Equal(t, res.Batches, plans, "every batch's plan was checked")
	require.Equal(t, durabletype.EventGCSwept, swept.Name)
	require.Equal(t, doomed, swept.Count)
	require.Positive(t, swept.Duration)
	requireIndexPlan(t, explainGeneric(t, e))

	// Flat: the last ten full batches against the first ten, in pages touched and in time.
	require.Len(t, lastBuffers, 10)
	fb, lb := medianInt(firstBuffers), medianInt(lastBuffers)
	t.Logf("pages per batch of 1,000: first ten median %d, last ten median %d", fb, lb)
	require.Less(t, lb, fb+fb/2, "batches touched more pages as the sweep went on")
	ft := times[:full]
	first, last := median(ft[:10]), median(ft[full-10:])
	t.Logf("time per batch of 1,000: first ten median %v, last ten median %v, slowest %v", first, last, slices.Max(ft))
	require.Less(t, last, 4*first+10*time.Millisecond, "batches got slower as the sweep went on")

	require.Equal(t, total-doomed, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	require.Equal(t, 500, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE finalized_at > now() - interval '1 hour'`), "young rows kept")
	require.Equal(t, 500, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status IN ('available', 'awaiting') AND machine = 'm'`), "live rows kept")
	require.Equal(t, keptChildren, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'child'`))
	require.Equal(t, keptChildren, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE state = '{"keep":true}'`),
		"only the children the live parent's join still reads are kept")
	require.Equal(t, 500, e.count(t, `SELECT count(*) FROM {schema}.signals`), "the live rows' inboxes are kept, the others' gone")

	// Nothing more to do.
	res, err = g.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Instances)
}

// batchBuffers runs one GC batch from cur under EXPLAIN (ANALYZE, BUFFERS) and rolls it back:
// the shared buffers it touched.
func batchBuffers(t *testing.T, e *gcEnv, cur store.GCCursor) int {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+e.st.Statement("gc_instances"),
		e.st.GCInstancesArgs("m", time.Hour, 1000, cur)).Scan(&raw))
	top := planNodes(t, raw)[0]
	return int(top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64))
}

func medianInt(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// A sweep stops once its budget is spent (after the batch in hand) and the next one carries on.
func TestGCSweepStopsAtItsBudget(t *testing.T) {
	t.Parallel()
	e := newGCEnv(t)
	e.exec(t, oldFinished, 250)
	g := e.gc(time.Hour, 100)
	g.Budget = time.Nanosecond
	res, err := g.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.Batches)
	require.Equal(t, 100, res.Instances)
	g.Budget = time.Minute
	res, err = g.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 150, res.Instances)
	require.Equal(t, 2, res.Batches)
}

// Sweepers racing on their own connections delete every row exactly once and never deadlock
// (in the test's own database: newDeadlockFreeGCEnv).
func TestGCRacingSweepersDeleteEachRowOnce(t *testing.T) {
	t.Parallel()
	const rows, sweepers = 60_000, 4
	e := newDeadlockFreeGCEnv(t)
	ctx := context.Background()
	e.exec(t, oldFinished, rows)
	e.exec(t, `INSERT INTO {schema}.signals (instance_id, name) SELECT id, 'late' FROM {schema}.instances WHERE id % 7 = 0`)
	e.exec(t, `ANALYZE {schema}.instances`)

	conns := make([]*pgx.Conn, sweepers)
	for i := range conns {
		c, err := pgx.Connect(ctx, e.pool.Config().ConnConfig.ConnString())
		require.NoError(t, err)
		conns[i] = c
	}
	deleted := make([]int, sweepers)
	batches := make([]int, sweepers)
	errs := make([]error, sweepers)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := e.gc(time.Hour, 250)
			g.DB = conns[i]
			<-startGate
			res, err := g.Sweep(ctx)
			deleted[i], batches[i], errs[i] = res.Instances, res.Batches, err
		}()
	}
	close(startGate)
	wg.Wait()
	for i, c := range conns {
		require.NoError(t, errs[i])
		require.NoError(t, c.Close(ctx))
	}
	sum := 0
	for _, n := range deleted {
		sum += n
	}
	t.Logf("deleted per sweeper: %v, batches: %v", deleted, batches)
	require.Equal(t, rows, sum, "every row deleted exactly once")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.signals`))
}

// Under a statement_timeout that a full batch outlasts (here each row's delete sleeps 2 ms, a
// trigger of the test's, and the GC's sessions time out after 300 ms), a cancelled batch is
// tried again at half the size until one fits, and the GC keeps that size: the sweep deletes
// every row past retention instead of failing every time, and the next sweep starts where the
// last one ended instead of being cancelled down from the configured batch again.
func TestGCBatchShrinksUnderAStatementTimeout(t *testing.T) {
	t.Parallel()
	e := newGCEnv(t)
	e.exec(t, oldFinished, 600)
	timed := e.slowRows(t, "DELETE")

	g := e.gc(time.Hour, 1000)
	g.DB = timed
	var cancels atomic.Int32
	g.Logger = slog.New(countHandler{match: "cancelled a maintenance statement", n: &cancels})
	res, err := g.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 600, res.Instances)
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	// 250 rows take at least 500 ms: from 1,000, at least three halvings, to 125 or fewer.
	found := g.batch.n
	require.LessOrEqual(t, found, 125)
	require.GreaterOrEqual(t, int(cancels.Load()), 3)
	t.Logf("%d cancelled batches; the batch is now %d", cancels.Load(), found)

	// 300 more rows: the next sweep's first statement asks for the batch the last sweep found,
	// not for 1,000 again (which would be cancelled at 1,000, 500 and 250).
	e.exec(t, oldFinished, 300)
	first, seen := 0, false
	g.beforeBatch = func(string, store.GCCursor) {
		if !seen {
			first, seen = g.batch.n, true
		}
	}
	res, err = g.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 300, res.Instances)
	require.Equal(t, found, first, "the sweep started from the batch the last one found")
	require.LessOrEqual(t, g.batch.n, found)
	g.beforeBatch = nil

	// The slow spell passes (the trigger goes): full batches now run in a fraction of the time
	// the cancelled ones ran, and the batch doubles back to its configured size, batch by batch,
	// rather than delete 125 rows a statement for ever.
	// (A batch that ran slow on a busy machine does not grow: sweeps go on until one has.)
	e.exec(t, `DROP TRIGGER slow_row ON {schema}.instances`)
	var sizes []int
	g.afterBatch = func(string, int, time.Duration) { sizes = append(sizes, g.batch.n) } // the next batch
	cancels.Store(0)
	for sweep := 0; g.batch.n < 1000 && sweep < 10; sweep++ {
		e.exec(t, oldFinished, 3000)
		res, err = g.Sweep(context.Background())
		require.NoError(t, err)
		require.Equal(t, 3000, res.Instances)
	}
	require.Zero(t, cancels.Load())
	require.Equal(t, 1000, g.batch.n, "back to the configured batch; batches %v", sizes)
	for i := 1; i < len(sizes); i++ {
		require.Contains(t, []int{sizes[i-1], 2 * sizes[i-1], 1000}, sizes[i], "one doubling a batch at most: %v", sizes)
	}
}

// A shrunk batch doubles after a full batch that ran in under a quarter of the cancelled
// statement's time, or, failing that, once per regrowAfter without a cancellation; never past
// the configured size, and not after a batch that was not full (nothing is known of its time).
func TestShrunkBatchGrowsBack(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	now := time.Now()
	b := &shrinking{n: 100, def: 1000, limit: 400 * time.Millisecond, cut: now}
	b.began = now.Add(-50 * time.Millisecond)
	b.ran(100, log, "t")
	require.Equal(t, 200, b.n, "a full batch in an eighth of the limit")
	b.began = time.Now().Add(-150 * time.Millisecond)
	b.ran(200, log, "t")
	require.Equal(t, 200, b.n, "a full batch near half the limit stays")
	b.began = time.Now().Add(-time.Millisecond)
	b.ran(199, log, "t")
	require.Equal(t, 200, b.n, "a batch that was not full says nothing")
	b.cut = time.Now().Add(-regrowAfter)
	b.began = time.Now().Add(-150 * time.Millisecond)
	b.ran(200, log, "t")
	require.Equal(t, 400, b.n, "no cancellation for a period: one doubling")
	b.ran(400, log, "t")
	require.Equal(t, 400, b.n, "and the period starts again")
	b.n, b.began = 800, time.Now()
	b.ran(800, log, "t")
	require.Equal(t, 1000, b.n, "never past the configured size")
}

// slowRows makes every row that a statement of kind event (UPDATE or DELETE) touches in the
// instances table cost at least 2 ms (a trigger), and returns a pool whose sessions time out
// statements after 300 ms: a batch of 250 rows or more is always cancelled, one of 125 fits.
func (e *gcEnv) slowRows(t *testing.T, event string) *pgxpool.Pool {
	t.Helper()
	e.exec(t, `CREATE FUNCTION {schema}.slow_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_catalog.pg_sleep(0.002); RETURN coalesce(NEW, OLD); END $$`)
	e.exec(t, `CREATE TRIGGER slow_row BEFORE `+event+` ON {schema}.instances FOR EACH ROW EXECUTE FUNCTION {schema}.slow_row()`)
	return durabledbtest.Pool(t, 2, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["statement_timeout"] = "300ms" })
}

// countHandler is a slog handler that counts the records whose message contains match.
type countHandler struct {
	match string
	n     *atomic.Int32
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// The reaper's statements shrink their batches the same way under a statement_timeout that a
// full batch outlasts (each row's update sleeps 2 ms here): 600 expired claims are all released,
// and 600 parked instances whose deadline passed all wake, in one sweep each, instead of none,
// sweep after sweep.
func TestReaperBatchesShrinkUnderAStatementTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, rows, after string
		batch             func(*Reaper) int
	}{
		{"release of expired claims",
			`INSERT INTO {schema}.instances (machine, step, queue, status, attempt, max_attempts, state, locked_by, locked_until)
			 SELECT 'm', 's', 'q', 'executing', 1, 3, '{}'::jsonb, 'gone-worker', now() - interval '1 minute'
			 FROM generate_series(1, 600)`,
			`SELECT count(*) FROM {schema}.instances WHERE status = 'available' AND recoveries = 1`,
			func(r *Reaper) int { return r.batch.n }},
		{"firing of await deadlines",
			`INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, await_names, await_deadline)
			 SELECT 'm', 's', 'q', 'awaiting', 3, '{}'::jsonb, '{go}', now() - interval '1 minute'
			 FROM generate_series(1, 600)`,
			`SELECT count(*) FROM {schema}.instances WHERE status = 'available' AND await_deadline IS NULL`,
			func(r *Reaper) int { return r.deadlines.n }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newGCEnv(t)
			e.exec(t, tc.rows)
			timed := e.slowRows(t, "UPDATE")
			var cancels atomic.Int32
			r := &Reaper{Store: e.st, DB: timed, Interval: time.Second, MaxRecoveries: 3,
				Logger: slog.New(countHandler{match: "cancelled a maintenance statement", n: &cancels}),
				Emit:   func(durabletype.Event) {}, Wake: func(string) {}}
			n, err := r.Sweep(context.Background())
			require.NoError(t, err)
			require.Equal(t, 600, n)
			require.Equal(t, 600, e.count(t, tc.after))
			require.LessOrEqual(t, tc.batch(r), 125, "250 rows take at least 500 ms")
			require.GreaterOrEqual(t, int(cancels.Load()), 3)
		})
	}
}
