package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/stretchr/testify/require"
)

// The pick serves a queue's keys in fair order, and is work-conserving: a pick claims as many rows
// as it asks for while rows are runnable, whoever they belong to. Rows without a key share as one
// key; a keyed row that became due later than it became runnable (no tag) takes its place when
// the pick sees it; weights scale a key's share; a more urgent priority comes first whatever the
// keys.
func TestFairPickServesKeysInTurnAndFillsItsBatch(t *testing.T) {
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	s, err := New(schema)
	require.NoError(t, err)
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
	tagged, err := s.QueueTagged(ctx, pool, "q")
	require.NoError(t, err)
	require.False(t, tagged)
	res, err := s.Pick(ctx, pool, "q", 10, "plain#1", PickOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Rows, 1, "the plain scan of a queue without tagged rows")

	// A's backlog, then small ones: B (tagged), rows without a key, C due since a moment ago
	// (scheduled, so untagged: the pick places it).
	insert(300, row("A", 5))
	tagged, err = s.QueueTagged(ctx, pool, "q")
	require.NoError(t, err)
	require.True(t, tagged)
	res, err = s.Pick(ctx, pool, "q", 10, "plain#2", PickOpts{Lease: time.Minute})
	require.NoError(t, err)
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
	tagged, err = s.QueueTagged(ctx, pool, "q")
	require.NoError(t, err)
	require.False(t, tagged)
}

// A claimed row leaves the fair order; its outcome puts a row that runs again at once back in it
// at its key's end (the key after the outcome: Next may set another).
func TestFairOutcomeGivesTheNextStepItsPlace(t *testing.T) {
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	s, err := New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	rows := make([]InsertRow, 10)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, Weight: 1, FairKey: "A"}
	}
	_, err = s.InsertMany(ctx, pool, rows)
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
		outs[i].Fence(&res.Rows[i])
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
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	s, err := New(schema)
	require.NoError(t, err)
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
