package store

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// newTestStore returns a Store on a schema of the test's own (dropped after it) in a pool of conns
// connections, with the pool and the schema's name.
func newTestStore(t *testing.T, conns int32) (*Store, *pgxpool.Pool, string) {
	t.Helper()
	pool := durabledbtest.Pool(t, conns)
	schema := durabledbtest.Schema(t, pool)
	s, err := New(schema)
	require.NoError(t, err)
	return s, pool, schema
}

// explainPick runs a pick under EXPLAIN ANALYZE in a transaction that is rolled back.
func explainPick(t *testing.T, s *Store, db DB, stmt string, args pgx.NamedArgs) string {
	t.Helper()
	return explainAnalyze(t, db, "ANALYZE, COSTS OFF", s.sql(stmt), args)
}

// explainAnalyze runs sql under EXPLAIN (options) in a transaction that is rolled back.
// readyIndexPages vacuums and analyzes the instances table and returns the pages of its pick
// index of untagged rows.
func readyIndexPages(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `VACUUM ANALYZE "`+schema+`".instances`)
	require.NoError(t, err)
	var pages int
	require.NoError(t, pool.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE oid = $1::regclass`,
		`"`+schema+`".instances_ready_untagged`).Scan(&pages))
	return pages
}

func explainAnalyze(t *testing.T, db DB, options, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN ("+options+") "+sql, args...)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// Rows without a rate limit pay nothing for the rate-limit machinery: with no limits configured
// the pick has none of it, and with limits configured its bucket reads never run for them.
func TestRateLimitCostsNothingWhenUnused(t *testing.T) {
	s, pool, _ := newTestStore(t, 2)
	ctx := context.Background()
	rows := make([]InsertRow, 200)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1}
	}
	_, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	base := pgx.NamedArgs{"queue": "q", "limit": 50, "owner": "o#1", "lease": time.Minute.Milliseconds(), "horizon": int64(0),
		"mv_names": []string{}, "mv_versions": []int32{}}

	plain := explainPick(t, s, pool, "pick", base)
	require.NotContains(t, plain, "buckets", "the plain pick reads no bucket")

	base["g_names"], base["g_limits"], base["g_shards"] = []string{}, []int32{}, []int32{}
	base["r_names"], base["r_rates"], base["r_bursts"] = []string{"api"}, []float64{1}, []float64{1}
	base["g_hint"], base["r_hint"] = []string{}, []string{"api"}
	for _, stmt := range []string{"pick_rated", "pick_admitted"} {
		admitted := explainPick(t, s, pool, stmt, base)
		for _, line := range strings.Split(admitted, "\n") {
			switch {
			case strings.Contains(line, "Scan") && strings.Contains(line, "on buckets"):
				require.Contains(t, line, "never executed", "%s read a bucket for rows with no limit:\n%s", stmt, admitted)
			case strings.Contains(line, "Insert on buckets"):
				require.Contains(t, line, "rows=0", "%s wrote a bucket for rows with no limit:\n%s", stmt, admitted)
			}
		}
		require.Contains(t, admitted, "rows=50", "the pick still claimed its batch")
		base["limit"] = 50
	}
}

// Every pick claims its rows by primary key, whatever the configuration: no variant's plan reads
// the instances table whole (a hash join over it cost 10 ms a pick at 20,000 rows), neither the
// plan for the arguments at hand nor the generic plan cached for any arguments, and not even a
// plan made while the table held 20 rows (a cached plan outlives the table's growth until the
// next ANALYZE).
func TestEveryPickClaimsByPrimaryKey(t *testing.T) {
	for _, size := range []int{20, 20000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) { everyPickClaimsByPrimaryKey(t, size) })
	}
}

// positional returns statement stmt with its @names turned into positional parameters (the
// Store's own rewrite, named.go), and the values literal gives them, in order: for PREPARE, whose
// EXECUTE then runs the generic plan.
func positional(s *Store, stmt string, literal map[string]string) (string, []string) {
	rw, err := s.rewrites.get(context.Background(), nil, s.sql(stmt))
	if err != nil {
		panic(err)
	}
	values := make([]string, len(rw.names))
	for i, name := range rw.names {
		values[i] = literal[name]
	}
	return rw.sql, values
}

func everyPickClaimsByPrimaryKey(t *testing.T, size int) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	rows := make([]InsertRow, size)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, Weight: 1,
			ConcurrencyKey: "g:x"}
		if i%2 == 0 {
			rows[i].ConcurrencyKey, rows[i].RateLimit = "", "r"
		}
	}
	_, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	for _, table := range []string{"instances", "gates", "buckets"} {
		_, err = pool.Exec(ctx, `ANALYZE "`+schema+`".`+table)
		require.NoError(t, err)
	}
	args := pgx.NamedArgs{"queue": "q", "limit": 100, "owner": "o#1", "lease": time.Minute.Milliseconds(), "horizon": int64(0),
		"g_names": []string{"g"}, "g_limits": []int32{100000}, "g_shards": []int32{8},
		"r_names": []string{"r"}, "r_rates": []float64{1e7}, "r_bursts": []float64{1e7},
		"g_hint": []string{"g:x"}, "r_hint": []string{"r"}, "l_key": "g:x", "l_shard": int16(0), "l_owner": "o", "lr_key": "r",
		"mv_names": []string{"m"}, "mv_versions": []int32{2}, "paused_machines": []string{"other"},
		"fw_keys": []string{"t"}, "fw_weights": []float64{2}, "fw_default": 1.0, "claim_rows": 100}
	literal := map[string]string{"queue": "'q'", "limit": "100", "owner": "'o#1'", "lease": "60000", "horizon": "0",
		"g_names": "'{g}'", "g_limits": "'{100000}'", "g_shards": "'{8}'", "r_names": "'{r}'", "r_rates": "'{1e7}'",
		"r_bursts": "'{1e7}'", "g_hint": "'{g:x}'", "r_hint": "'{r}'", "l_key": "'g:x'", "l_shard": "0", "l_owner": "'o'", "lr_key": "'r'",
		"mv_names": "'{m}'", "mv_versions": "'{2}'", "paused_machines": "'{other}'",
		"fw_keys": "'{t}'", "fw_weights": "'{2}'", "fw_default": "1", "claim_rows": "100"}
	explain := func(settings, query string, args ...any) string {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, s.sql(settings), pickLockTimeout)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
		require.NoError(t, err)
		var plan []string
		for _, q := range strings.Split(query, ";\n") {
			r, err := tx.Query(ctx, q, args...)
			require.NoError(t, err)
			lines, err := pgx.CollectRows(r, pgx.RowTo[string])
			require.NoError(t, err)
			if len(lines) > 0 {
				plan = lines
			}
		}
		return strings.Join(plan, "\n")
	}
	var stmts []string
	for _, name := range []string{"pick", "pick_gated", "pick_rated", "pick_admitted", "pick_leased", "pick_rate_lane"} {
		stmts = append(stmts, name, name+"_fair") // the plain scan and the fair one
	}
	for _, stmt := range stmts {
		settings := "pick_settings"
		// The plan for these arguments (a custom plan), under the pick's settings.
		plan := explain(settings, "EXPLAIN (COSTS OFF) "+s.sql(stmt), args)
		require.NotContains(t, plan, "Seq Scan on instances", "%s, %d rows:\n%s", stmt, size, plan)

		// The plan cached for any arguments (the generic plan, which every pick uses from its
		// first run).
		positional, values := positional(s, stmt, literal)
		plan = explain(settings, "PREPARE generic_"+stmt+" AS "+positional+";\n"+
			"EXPLAIN (COSTS OFF) EXECUTE generic_"+stmt+"("+strings.Join(values, ", ")+");\n"+
			"DEALLOCATE generic_"+stmt)
		require.NotContains(t, plan, "Seq Scan on instances", "%s, %d rows, generic plan:\n%s", stmt, size, plan)
		require.NotContains(t, plan, "Hash Join", "%s, %d rows, generic plan:\n%s", stmt, size, plan)
		require.Contains(t, plan, "Index Scan using instances_pkey on instances i\n", "%s, %d rows, generic plan:\n%s", stmt, size, plan)
	}
}

// The statements every step pays for are planned once per connection, not on every execution:
// after a few runs Postgres settles on their generic plan. (The single insert over arrays, and
// the plain pick when it ran with plan_cache_mode forced to custom, were planned anew each time,
// and planning cost more than executing.) The picks use their generic plan from the first run
// (TestEveryPickClaimsByPrimaryKey checks that plan).
func TestHotStatementsKeepTheirCachedPlan(t *testing.T) {
	s, pool, _ := newTestStore(t, 2)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	db := conn.Conn()
	const runs = 12
	gates := &Gates{Names: []string{"g"}, Limits: []int32{1000}, Shards: []int32{4}}
	rates := &Rates{Names: []string{"r"}, Rates: []float64{1e6}, Bursts: []float64{1e6}}
	shard, ok, err := s.LeaseGate(ctx, db, "g:l", 1000, 4, "o", 2*runs, 1, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	picks := []struct {
		stmt         string
		gates        *Gates
		rates        *Rates
		ckey, rlimit string
		lane         Lane
	}{
		{"pick", nil, nil, "", "", Lane{}},
		{"pick_gated", gates, nil, "g:k", "", Lane{}},
		{"pick_rated", nil, rates, "", "r:k", Lane{}},
		{"pick_admitted", gates, rates, "g:k", "r:k", Lane{}},
		{"pick_leased", gates, nil, "g:l", "", Lane{Gate: &Lease{Key: "g:l", Shard: shard, Owner: "o"}}},
		{"pick_rate_lane", nil, rates, "", "r:l", Lane{Rate: "r:l"}},
	}
	// The fair scan, in a queue of tagged rows.
	fairRows := func(i int) []InsertRow {
		return []InsertRow{{Machine: "m", Step: "s", State: "{}", Queue: "fair", Priority: 5, MaxAttempts: 1, Weight: 1,
			FairKey: fmt.Sprint("t", i%3)}}
	}
	for i := range runs {
		_, c, err := s.InsertClaim(ctx, db, &InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "own", Priority: 5,
			MaxAttempts: 1}, fmt.Sprintf("c#%d", i), time.Minute)
		require.NoError(t, err, "insert_claim %d", i)
		require.NotNil(t, c)
		for _, p := range picks {
			queue := "q" + p.stmt
			_, err := s.InsertMany(ctx, db, []InsertRow{{Machine: "m", Step: "s", State: "{}", Queue: queue, Priority: 5,
				MaxAttempts: 1, Weight: 1, ConcurrencyKey: p.ckey, RateLimit: p.rlimit}})
			require.NoError(t, err, "insert %d", i)

			res, err := s.Pick(ctx, db, queue, 10, fmt.Sprintf("o#%d", i), PickOpts{Lease: time.Minute, Gates: p.gates, Rates: p.rates, Lane: p.lane})
			require.NoError(t, err, "%s %d", p.stmt, i)
			require.Len(t, res.Rows, 1, p.stmt)
		}
		_, err = s.InsertMany(ctx, db, fairRows(i))
		require.NoError(t, err, "fair insert %d", i)
		res, err := s.Pick(ctx, db, "fair", 10, fmt.Sprintf("f#%d", i), PickOpts{Lease: time.Minute, FairOrder: true})
		require.NoError(t, err, "pick_fair %d", i)
		require.Len(t, res.Rows, 1, "pick_fair")
	}
	hot := []string{"insert_one", "insert_one_fair", "insert_claim", "pick", "pick_fair", "pick_gated", "pick_rated", "pick_admitted", "pick_leased", "pick_rate_lane"}
	plans := map[string][2]int64{}
	params := regexp.MustCompile(`@\w+|\$\d+`) // pgx sends named parameters as positional ones
	rows, err := db.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_catalog.pg_prepared_statements`)
	require.NoError(t, err)
	var text string
	var generic, custom int64
	_, err = pgx.ForEachRow(rows, []any{&text, &generic, &custom}, func() error {
		for _, name := range hot {
			if params.ReplaceAllString(text, "?") == params.ReplaceAllString(s.sql(name), "?") {
				plans[name] = [2]int64{generic, custom}
			}
		}
		return nil
	})
	require.NoError(t, err)
	for _, name := range hot {
		p, ok := plans[name]
		require.True(t, ok, "%s was not prepared on the connection: %v", name, plans)
		require.GreaterOrEqual(t, p[0], int64(runs-5), "%s: %d generic plans, %d custom (planned on every run)", name, p[0], p[1])
		if strings.HasPrefix(name, "pick_") {
			// The admission picks are told to use their generic plan from the first run.
			require.Zero(t, p[1], "%s: %d custom plans", name, p[1])
		}
	}
}

// Rows scheduled for later cost a pick nothing: with 100,000 delayed rows in the queue, at the
// due rows' priority and at a more urgent one, a pick that cannot fill its batch (three rows
// due) and the insert-claim test for rows ahead each read a few pages of the pick index (a
// descent per priority: every walk has the priority fixed, so the scheduled time bounds it),
// not the hundreds that hold the delayed rows' entries.
func TestPicksNeverReadDelayedRows(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".instances (machine, step, queue, priority, state, max_attempts, scheduled_at)
		SELECT 'm', 's', 'q', CASE WHEN g % 2 = 0 THEN 1 ELSE 5 END, '{}', 1, now() + interval '1 day'
		FROM generate_series(1, 100000) AS g`)
	require.NoError(t, err)
	rows := make([]InsertRow, 3)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1}
	}
	_, err = s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	require.Greater(t, readyIndexPages(t, pool, schema), 200, "the delayed rows fill the pick index")

	// pages sums the buffers the plan's walks of the pick index touched.
	buffers := regexp.MustCompile(`Buffers: shared (?:hit=(\d+))?\s*(?:read=(\d+))?`)
	pages := func(explain string) int {
		lines := strings.Split(explain, "\n")
		n, walks := 0, 0
		for i, line := range lines {
			if !strings.Contains(line, "using instances_ready_") {
				continue
			}
			walks++
			for _, next := range lines[i+1:] {
				if strings.Contains(next, "->") {
					break
				}
				if m := buffers.FindStringSubmatch(next); m != nil {
					hit, _ := strconv.Atoi(m[1])
					rd, _ := strconv.Atoi(m[2])
					n += hit + rd
				}
			}
		}
		require.Positive(t, walks, "no walk of the pick index:\n%s", explain)
		return n
	}
	explain := func(stmt string, args ...any) string {
		return explainAnalyze(t, pool, "ANALYZE, BUFFERS, COSTS OFF", s.sql(stmt), args...)
	}
	plan := explain("pick", pgx.NamedArgs{"queue": "q", "limit": 100, "owner": "o#1", "lease": time.Minute.Milliseconds(),
		"horizon": int64(0), "mv_names": []string{}, "mv_versions": []int32{},
		"fw_keys": []string{}, "fw_weights": []float64{}, "fw_default": 1.0, "claim_rows": 100})
	require.Contains(t, plan, "Update on instances i (actual", "the pick ran:\n%s", plan)
	require.Less(t, pages(plan), 60, "the pick read the delayed rows' pages:\n%s", plan)
	claim := explain("insert_claim", "m", "s", "{}", "q", int16(9), 1, "o#1", int64(60000), 1)
	require.Less(t, pages(claim), 60, "the test for rows ahead read the delayed rows' pages:\n%s", claim)
}
