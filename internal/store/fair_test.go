package store

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// queueTagged reports whether queue holds runnable rows with a fair tag (pick_tagged, which every
// pick sends before it).
func queueTagged(ctx context.Context, s *Store, db DB, queue string) (tagged bool, err error) {
	err = db.QueryRow(ctx, s.sql("pick_tagged"), pgx.NamedArgs{"queue": queue}).Scan(&tagged)
	return tagged, err
}

// The pick serves a queue's keys in fair order, and is work-conserving: a pick claims as many rows
// as it asks for while rows are runnable, whoever they belong to. Rows without a key share as one
// key; a keyed row that became due later than it became runnable (no tag) takes its place when
// the pick sees it; weights scale a key's share; a more urgent priority comes first whatever the
// keys.
func TestFairPickServesKeysInTurnAndFillsItsBatch(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	row := func(key string, prio int) InsertRow {
		return InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: prio, MaxAttempts: 1, Weight: 1, FairKey: key}
	}
	insert := func(n int, r InsertRow) {
		t.Helper()
		rows := make([]InsertRow, n)
		for i := range rows {
			rows[i] = r
		}
		_, err := s.InsertMany(ctx, pool, rows)
		require.NoError(t, err)
	}
	seq := 0
	pick := func(limit int) map[string]int {
		t.Helper()
		seq++
		res, err := s.Pick(ctx, pool, "q", limit, fmt.Sprint("o#", seq), PickOpts{Lease: time.Minute, FairOrder: true})
		require.NoError(t, err)
		by := map[string]int{}
		for _, c := range res.Rows {
			key := ""
			if c.FairKey != nil {
				key = *c.FairKey
			}
			by[key]++
		}
		by["total"] = len(res.Rows)
		return by
	}

	// Without a tagged row, a queue is plain; the plain scan claims nothing from a queue with one.
	insert(1, row("", 5))
	tagged, err := queueTagged(ctx, s, pool, "q")
	require.NoError(t, err)
	require.False(t, tagged)
	res, err := s.Pick(ctx, pool, "q", 10, "plain#1", PickOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Rows, 1, "the plain scan of a queue without tagged rows")
	require.False(t, res.Tagged, "the pick's own probe")

	// A's backlog, then small ones: B (tagged), rows without a key, C due since a moment ago
	// (scheduled, so untagged: the pick places it).
	insert(300, row("A", 5))
	tagged, err = queueTagged(ctx, s, pool, "q")
	require.NoError(t, err)
	require.True(t, tagged)
	res, err = s.Pick(ctx, pool, "q", 10, "plain#2", PickOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, res.Tagged, "the pick's own probe")
	require.Empty(t, res.Rows, "the plain scan claims nothing from a queue with tagged rows")
	insert(5, row("B", 5))
	insert(5, row("", 5))
	past := time.Now().Add(-time.Second)
	c := row("C", 5)
	c.ScheduledAt = &past
	insert(3, c)
	var nTagged, nUntagged int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(fair_tag), count(*) - count(fair_tag) FROM "`+schema+`".instances
		WHERE status = 'available'`).Scan(&nTagged, &nUntagged))
	require.Equal(t, [2]int{305, 8}, [2]int{nTagged, nUntagged}, "rows due at once with a key are tagged")

	got := pick(100)
	require.Equal(t, map[string]int{"A": 87, "B": 5, "": 5, "C": 3, "total": 100}, got,
		"the first pick serves every key in turn behind A's head")
	// A alone: every pick is full.
	require.Equal(t, map[string]int{"A": 100, "total": 100}, pick(100))

	// D at ten times A's weight: its rows come ten for one of A's.
	d := row("D", 5)
	d.FairWeight = 10
	insert(50, d)
	got = pick(21)
	require.Equal(t, map[string]int{"A": 2, "D": 19, "total": 21}, got, "A's share beside D at weight 10")

	// A more urgent row first, whatever the keys.
	insert(1, row("E", 1))
	got = pick(1)
	require.Equal(t, map[string]int{"E": 1, "total": 1}, got)

	// Then the rest: all of it, D's first, every pick full until the queue runs dry.
	left := 300 - 87 - 100 - 2 + 50 - 19
	for left > 0 {
		got = pick(40)
		require.Equal(t, min(40, left), got["total"], "a pick with %d rows runnable", left)
		left -= got["total"]
	}
	require.Equal(t, map[string]int{"total": 0}, pick(40))
	tagged, err = queueTagged(ctx, s, pool, "q")
	require.NoError(t, err)
	require.False(t, tagged)
}

// A claimed row leaves the fair order; its outcome puts a row that runs again at once back in it
// at its key's end (the key after the outcome: Next may set another).
func TestFairOutcomeGivesTheNextStepItsPlace(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	rows := make([]InsertRow, 10)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, Weight: 1, FairKey: "A"}
	}
	_, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	res, err := s.Pick(ctx, pool, "q", 2, "o#1", PickOpts{Lease: time.Minute, FairOrder: true})
	require.NoError(t, err)
	require.Len(t, res.Rows, 2)
	var nulls int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".instances WHERE status = 'executing' AND fair_tag IS NULL`).Scan(&nulls))
	require.Equal(t, 2, nulls, "a claim takes the row out of the fair order")

	outs := make([]Outcome, 2)
	for i := range outs {
		res.Rows[i].Owner = "o#1"
		outs[i] = Outcome{Kind: KindNext, Step: "s2"}
		outs[i].Fence(&res.Rows[i], nil)
	}
	outs[1].FairSet, outs[1].FairKey = true, "B"
	applied, _, err := s.ApplyOutcomes(ctx, pool, outs)
	require.NoError(t, err)
	require.Len(t, applied, 2)
	type tagRow struct {
		key string
		tag float64
	}
	got := map[int64]tagRow{}
	r, err := pool.Query(ctx, `SELECT id, fair_key, fair_tag FROM "`+schema+`".instances WHERE id = ANY($1)`,
		[]int64{res.Rows[0].ID, res.Rows[1].ID})
	require.NoError(t, err)
	for r.Next() {
		var id int64
		var tr tagRow
		require.NoError(t, r.Scan(&id, &tr.key, &tr.tag))
		got[id] = tr
	}
	require.NoError(t, r.Err())
	// A's rows left hold tags 3..10: the next step of A goes after them; B, with no row, at the head.
	require.Equal(t, tagRow{"A", 11}, got[res.Rows[0].ID])
	require.Equal(t, tagRow{"B", 4}, got[res.Rows[1].ID])
}

// The fair order composes with concurrency keys and rate limits: the fair scan chooses the
// candidates in tag order, and admission works on them as on the plain scan's: a key that runs
// one at a time gets one row of the window, a bucket grants what it holds, and once the key cannot
// run (its row executing, its bucket empty) the scan passes its rows over and the batch goes to
// the others.
func TestFairPickComposesWithKeysAndLimits(t *testing.T) {
	s, pool, _ := newTestStore(t, 2)
	ctx := context.Background()
	insert := func(queue, key string, n int, set func(*InsertRow)) {
		t.Helper()
		rows := make([]InsertRow, n)
		for i := range rows {
			rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: queue, Priority: 5, MaxAttempts: 1, Weight: 1, FairKey: key}
			set(&rows[i])
		}
		_, err := s.InsertMany(ctx, pool, rows)
		require.NoError(t, err)
	}
	pick := func(queue, owner string, rates *Rates) map[string]int {
		t.Helper()
		res, err := s.Pick(ctx, pool, queue, 20, owner, PickOpts{Lease: time.Minute, FairOrder: true, Rates: rates})
		require.NoError(t, err)
		out := map[string]int{}
		for _, c := range res.Rows {
			out[*c.FairKey]++
		}
		return out
	}

	// The window of 20 in tag order holds 11 of A's rows and 9 of B's (B's start at A's head).
	// A's rows run one at a time (a concurrency key no gate owns).
	insert("k", "A", 50, func(r *InsertRow) { r.ConcurrencyKey = "a-lock" })
	insert("k", "B", 50, func(*InsertRow) {})
	require.Equal(t, map[string]int{"A": 1, "B": 9}, pick("k", "k#1", nil))
	require.Equal(t, map[string]int{"B": 20}, pick("k", "k#2", nil), "A's key runs: its rows are passed over")

	// A's rows under a rate limit of burst 3 (refilled a token in 1,000 s).
	rates := &Rates{Names: []string{"r"}, Rates: []float64{0.001}, Bursts: []float64{3}}
	insert("r", "A", 50, func(r *InsertRow) { r.RateLimit = "r:a" })
	insert("r", "B", 50, func(*InsertRow) {})
	require.Equal(t, map[string]int{"A": 3, "B": 9}, pick("r", "r#1", rates))
	require.Equal(t, map[string]int{"B": 20}, pick("r", "r#2", rates), "A's bucket is empty: its rows are passed over")
}

// Each of the fairness reads walks its own index even on a table the planner knows nothing about
// (a new schema, never analyzed: the plans every new installation caches first, and keeps): the
// probe of a key's last row instances_fair_key, the queue's head and the plain pick's guard
// instances_ready_tagged, the plain scan instances_ready_untagged. (A key probe through the queue's
// tagged rows reads all of them for every row inserted: an insert of n keyed rows costs O(n²).)
// Also on a schema at 13, which this library runs against until the contract migration 14: there
// version 11's instances_ready and instances_fair_last are still there, and after a down from 14
// they are the newest indexes (the planner breaks a tie between equal costs by the index built
// last).
func TestFairProbesReadTheirOwnIndexesWithoutStatistics(t *testing.T) {
	for _, version := range []int{durablemigrate.Version, durablemigrate.Required} {
		t.Run(fmt.Sprint(version), func(t *testing.T) { fairProbesReadTheirOwnIndexes(t, version) })
	}
}

func fairProbesReadTheirOwnIndexes(t *testing.T, version int) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, version))
	prepared := 0
	var plans []string
	generic := func(stmt string, values []string) string {
		t.Helper()
		prepared++
		name := fmt.Sprint("generic_", prepared)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, s.sql("pick_settings"), pickLockTimeout)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "PREPARE "+name+" AS "+stmt)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE "+name+"("+strings.Join(values, ", ")+")")
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plans = append(plans, strings.Join(lines, "\n"))
		return strings.Join(lines, "\n")
	}
	// walks says the plan walks index; on a schema at 13, version 11's instances_ready, bounded
	// to the same part by its fair_tag condition (checked below), does as well.
	walks := func(plan, index string) bool {
		return strings.Contains(plan, "using "+index) ||
			(version < durablemigrate.Version && strings.Contains(plan, "using instances_ready on"))
	}
	keyProbeOnItsIndex := func(stmt, plan string) {
		t.Helper()
		require.Contains(t, plan, "Index Scan using instances_fair_key", "%s:\n%s", stmt, plan)
		require.NotRegexp(t, `Filter: .*fair_key =`, plan, "%s: the key is a filter, not the index's:\n%s", stmt, plan)
	}

	plan := generic(s.sql("insert_many_fair"), []string{"'{m}'", "'{s}'", `'{"{}"}'`, "'{q}'", "'{5}'", "'{NULL}'",
		"'{0}'", "'{1}'", "'{NULL}'", "'{0}'", "'{0}'", "'{NULL}'", "'{NULL}'", "'{1}'", "'{1}'", "'{t}'", "'{1}'", "'{1}'"})
	keyProbeOnItsIndex("insert_many_fair", plan)
	require.True(t, walks(plan, "instances_ready_tagged"), "the queue's head:\n%s", plan)

	literal := map[string]string{"queue": "'q'", "limit": "100", "owner": "'o#1'", "lease": "60000",
		"mv_names": "'{m}'", "mv_versions": "'{2}'", "paused_machines": "'{other}'",
		"fw_keys": "'{t}'", "fw_weights": "'{2}'", "fw_default": "1", "claim_rows": "100"}
	stmt, values := positional(s, "pick_fair", literal)
	plan = generic(stmt, values)
	keyProbeOnItsIndex("pick_fair", plan)
	require.True(t, walks(plan, "instances_ready_tagged"), "pick_fair's tagged rows:\n%s", plan)
	require.True(t, walks(plan, "instances_ready_untagged"), "pick_fair's untagged rows:\n%s", plan)

	stmt, values = positional(s, "pick", literal)
	plan = generic(stmt, values)
	require.True(t, walks(plan, "instances_ready_untagged"), "the plain scan:\n%s", plan)
	require.True(t, walks(plan, "instances_ready_tagged"), "the plain scan's guard:\n%s", plan)
	require.NotContains(t, plan, "instances_fair_key", "the plain scan reads no key:\n%s", plan)

	plan = generic(s.sql("insert_claim"), []string{"'m'", "'s'", "'{}'", "'q'", "5", "1", "'o#1'", "60000", "1"})
	require.True(t, walks(plan, "instances_ready_untagged"), "insert_claim's untagged rows ahead:\n%s", plan)
	require.True(t, walks(plan, "instances_ready_tagged"), "insert_claim's tagged rows ahead:\n%s", plan)

	stmt, values = positional(s, "pick_tagged", literal)
	plan = generic(stmt, values)
	require.True(t, walks(plan, "instances_ready_tagged"), "pick_tagged:\n%s", plan)
	for _, plan := range plans {
		require.NotContains(t, plan, "instances_fair_last", "version 11's index:\n%s", plan)
		lines := strings.Split(plan, "\n")
		for i, line := range lines {
			if strings.Contains(line, "using instances_ready on") {
				require.Less(t, i+1, len(lines))
				require.Contains(t, lines[i+1], "fair_tag IS", "a walk of version 11's index bounded to one part:\n%s", plan)
			}
		}
	}
}

// Rows without a fairness key pay nothing for fairness: inserted, claimed, moved on by Next,
// retried with a backoff and finished, they never enter an index that fairness added (each stays
// an empty B-tree, its metapage alone), and the plain pick reads the tagged rows' index with one
// descent of that empty tree.
func TestRowsWithoutKeysPayNothingForFairness(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	rows := make([]InsertRow, 2000)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 1 + i%9, MaxAttempts: 3, Weight: 1}
	}
	_, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	kinds := []OutcomeKind{KindNext, KindRetry, KindDone}
	for p := range 10 {
		owner := fmt.Sprint("o#", p)
		res, err := s.Pick(ctx, pool, "q", 100, owner, PickOpts{Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, res.Rows, 100)
		outs := make([]Outcome, len(res.Rows))
		for i := range res.Rows {
			res.Rows[i].Owner = owner
			outs[i] = Outcome{Kind: kinds[i%3], Step: "s2"}
			if outs[i].Kind == KindRetry {
				outs[i].Delay = time.Hour
			}
			outs[i].Fence(&res.Rows[i], nil)
		}
		applied, _, err := s.ApplyOutcomes(ctx, pool, outs)
		require.NoError(t, err)
		require.Len(t, applied, 100)
	}
	for _, index := range []string{"instances_ready_tagged", "instances_fair_key"} {
		var size int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass)`, `"`+schema+`".`+index).Scan(&size))
		require.Equal(t, int64(8192), size, "%s holds an entry of a row without a key", index)
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, s.sql("pick_settings"), pickLockTimeout)
	require.NoError(t, err)
	r, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "+s.sql("pick"), pgx.NamedArgs{
		"queue": "q", "limit": 100, "owner": "x#1", "lease": 60000,
		"mv_names": []string{}, "mv_versions": []int32{}, "paused_machines": []string{}})
	require.NoError(t, err)
	lines, err := pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	guard := regexp.MustCompile(`using instances_ready_tagged[^\n]*\n(?:[^\n]*\n)*?\s*Buffers: shared hit=(\d+)`).FindStringSubmatch(plan)
	require.NotNil(t, guard, "the guard's walk:\n%s", plan)
	hits, err := strconv.Atoi(guard[1])
	require.NoError(t, err)
	require.LessOrEqual(t, hits, 2, "the guard reads the empty index's metapage alone (for its root and its version):\n%s", plan)
	require.Contains(t, plan, "rows=100 loops=1", "the pick claims its batch:\n%s", plan)
}
