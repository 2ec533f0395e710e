package store

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// admissionFixture is one queue whose batch meets every admission case at once: rows with no key;
// a K = 1 key; a gated key whose rows fit its emptiest shard (the common case), one whose rows do
// not (they are spread over its shards' free slots: the general case) and one whose gate is
// full; a limited key whose bucket affords its whole batch, one that affords a prefix (weights 1,
// 2, 1, 1 against 3.5 tokens), one with less than a token and one with no bucket yet; rows under
// both a gate and a limit, and a K = 1 key under a limit. A row's key in the results is its
// concurrency key followed by its rate limit.
type admissionFixture struct {
	s     *Store
	db    DB
	gates *Gates
	rates *Rates
	key   map[int64]string // each row's key ("" none; the rate key for limited rows)
}

func newAdmissionFixture(t *testing.T) *admissionFixture {
	t.Helper()
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	f := &admissionFixture{s: s, db: pool, key: map[int64]string{},
		gates: &Gates{Names: []string{"big", "g"}, Limits: []int32{300, 10}, Shards: []int32{2, 3}},
		// A rate so slow that no bucket refills while the test runs.
		rates: &Rates{Names: []string{"r"}, Rates: []float64{1e-9}, Bursts: []float64{1000}}}
	var rows []InsertRow
	add := func(n int, ckey, rlimit string, weights ...int) {
		for i := range n {
			w := 1
			if i < len(weights) {
				w = weights[i]
			}
			rows = append(rows, InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1,
				ConcurrencyKey: ckey, RateLimit: rlimit, Weight: w})
		}
	}
	add(5, "", "")
	add(3, "solo", "")
	add(20, "big:a", "")
	add(8, "g:near", "")
	add(4, "g:full", "")
	add(5, "", "r:rich")
	add(4, "", "r:poor", 1, 2, 1, 1)
	add(2, "", "r:empty")
	add(3, "g:both", "r:rich") // under a gate and a limit
	add(2, "", "r:cold")       // a limit with no bucket yet: full
	add(2, "solo2", "r:cold")  // a K = 1 key under a limit
	ins, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	for i, r := range ins {
		f.key[r.ID] = rows[i].ConcurrencyKey + rows[i].RateLimit
	}
	// g's shards hold 4, 3 and 3 slots. g:near has 1 + 2 + 3 free (shard 2 has no counter yet:
	// empty); g:full has none.
	_, err = pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO %[1]q.gates (key, shard, held, capacity) VALUES
		  ('g:near', 0, 3, 4), ('g:near', 1, 1, 3), ('g:full', 0, 4, 4), ('g:full', 1, 3, 3), ('g:full', 2, 3, 3);
		INSERT INTO %[1]q.buckets (key, tokens, rate, burst, updated_at) VALUES
		  ('r:rich', 100, 1e-9, 1000, now()), ('r:poor', 3.5, 1e-9, 1000, now()), ('r:empty', 0.2, 1e-9, 1000, now())`,
		schema))
	require.NoError(t, err)
	return f
}

// pick runs one pick in a transaction it rolls back, and returns what it claimed: each row's key
// and gate shard ("key/shard"), sorted, and the counts it reported.
func (f *admissionFixture) pick(t *testing.T, gates *Gates, rates *Rates, hint Hint) ([]string, PickResult) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := f.s.Pick(ctx, tx, "q", 100, "o#1", PickOpts{Lease: time.Minute, Gates: gates, Rates: rates, Hint: hint})
	require.NoError(t, err)
	var got []string
	for _, c := range res.Rows {
		shard := "-"
		if c.ConcurrencyShard != nil {
			shard = fmt.Sprint(*c.ConcurrencyShard)
		}
		got = append(got, fmt.Sprintf("%d %s/%s", c.ID, f.key[c.ID], shard))
	}
	sort.Strings(got)
	return got, res
}

func countKeys(t *testing.T, f *admissionFixture, res PickResult) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, c := range res.Rows {
		k := f.key[c.ID]
		if c.ConcurrencyShard != nil {
			k += fmt.Sprintf("/%d", *c.ConcurrencyShard)
		}
		n[k]++
	}
	return n
}

// An admission pick claims the same rows, in the same gate shards, and reports the same counts,
// with any hint: none, the right keys, or keys that are wrong (a full gate, an empty bucket, a
// K = 1 key, keys no configuration owns, keys with no rows). The hint only decides which gates
// and buckets are read once at the start rather than row by row.
func TestAdmissionPickIsTheSameWithAnyHint(t *testing.T) {
	f := newAdmissionFixture(t)
	hints := []Hint{
		{},
		{GateKeys: []string{"big:a", "g:near", "g:both"}, RateKeys: []string{"r:rich", "r:poor", "r:cold"}},
		{GateKeys: []string{"g:full", "solo", "nope:x", "big:zzz", "g:near", "g:near"}, RateKeys: []string{"r:empty", "q:x", "r"}},
		{GateKeys: []string{"big:a", "g:near", "g:full"}, RateKeys: []string{"r:rich", "r:poor", "r:empty"}},
	}
	for _, c := range []struct {
		name         string
		gates        *Gates
		rates        *Rates
		want         map[string]int
		denied, cons int
	}{
		{"both", f.gates, f.rates, map[string]int{"": 5, "solo": 1, "big:a/0": 20, "g:near/2": 3, "g:near/1": 2,
			"g:near/0": 1, "r:rich": 5, "r:poor": 2, "g:bothr:rich/0": 3, "r:cold": 2, "solo2r:cold": 1}, 2, 52},
		{"gates", f.gates, nil, map[string]int{"": 5, "solo": 1, "big:a/0": 20, "g:near/2": 3, "g:near/1": 2,
			"g:near/0": 1}, 0, 36},
		{"rates", nil, f.rates, map[string]int{"": 5, "solo": 1, "big:a": 1, "g:near": 1, "g:full": 1, "r:rich": 5,
			"r:poor": 2, "g:bothr:rich": 1, "r:cold": 2, "solo2r:cold": 1}, 2, 56},
	} {
		t.Run(c.name, func(t *testing.T) {
			var first []string
			for i, h := range hints {
				got, res := f.pick(t, c.gates, c.rates, h)
				require.Equal(t, c.want, countKeys(t, f, res), "hint %+v", h)
				require.Equal(t, c.denied, res.RateDenied, "hint %+v", h)
				require.Equal(t, c.cons, res.Considered, "hint %+v", h)
				require.Zero(t, res.Refused, "hint %+v", h)
				if i == 0 {
					first = got
					continue
				}
				require.Equal(t, first, got, "hint %+v claimed other rows than no hint", h)
			}
		})
	}
}

// HintFrom names each gated key and rate limit of a batch once, and leaves out K = 1 keys (no
// shard: no gate to read).
func TestHintFromNamesTheBatchKeysOnce(t *testing.T) {
	s := func(v string) *string { return &v }
	sh := func(v int16) *int16 { return &v }
	h := HintFrom([]Claimed{
		{ConcurrencyKey: s("g:a"), ConcurrencyShard: sh(0), RateLimit: s("r:x")},
		{ConcurrencyKey: s("g:a"), ConcurrencyShard: sh(1)},
		{ConcurrencyKey: s("solo")},
		{RateLimit: s("r:x")},
		{ConcurrencyKey: s("g:b"), ConcurrencyShard: sh(0), RateLimit: s("r:y")},
		{},
	})
	require.Equal(t, Hint{GateKeys: []string{"g:a", "g:b"}, RateKeys: []string{"r:x", "r:y"}}, h)
	many := make([]Claimed, 100)
	for i := range many {
		many[i] = Claimed{ConcurrencyKey: s(fmt.Sprint("g:", i)), ConcurrencyShard: sh(0), RateLimit: s(fmt.Sprint("r:", i))}
	}
	h = HintFrom(many)
	require.Len(t, h.GateKeys, maxHintKeys)
	require.Len(t, h.RateKeys, maxHintKeys)
}
