package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A pick on a rate lane grants all of the lane's rows in its window in one debit, exactly their
// weight, or none of them (a bucket that cannot afford them all, a first grant larger than a
// full bucket); it claims the rows with no key or limit either way, and leaves rows of another
// limit and of a key for an admission pick, which grants the lane's prefix that fits.
func TestPickOnARateLaneGrantsAllOrNone(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	// A rate so slow that no bucket refills while the test runs.
	rates := &Rates{Names: []string{"r"}, Rates: []float64{1e-9}, Bursts: []float64{100}}
	insert := func(queue string, rows ...[2]string) {
		t.Helper()
		var in []InsertRow
		for _, r := range rows {
			w := 1
			if r[1] == "r:a" && len(in)%2 == 1 {
				w = 2
			}
			in = append(in, InsertRow{Machine: "m", Step: "s", State: "{}", Queue: queue, Priority: 5, MaxAttempts: 1,
				ConcurrencyKey: r[0], RateLimit: r[1], Weight: w})
		}
		_, err := s.InsertMany(ctx, pool, in)
		require.NoError(t, err)
	}
	tokens := func(key string) float64 {
		t.Helper()
		var v float64
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce((SELECT tokens FROM %q.buckets WHERE key = $1), -1)`, schema),
			key).Scan(&v))
		return v
	}
	pick := func(queue, lane string) PickResult {
		t.Helper()
		res, err := s.Pick(ctx, pool, queue, 10, "o#"+queue+lane, PickOpts{Lease: time.Minute, Rates: rates, Lane: Lane{Rate: lane}})
		require.NoError(t, err)
		return res
	}
	// Lane rows of weights 1, 2, 1, 2 (6 tokens), two rows with nothing, one of another limit,
	// one of a key.
	q1 := [][2]string{{"", "r:a"}, {"", "r:a"}, {"", ""}, {"", "r:a"}, {"", "r:b"}, {"k", ""}, {"", "r:a"}, {"", ""}}
	insert("q1", q1...)
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.buckets (key, tokens, rate, burst, updated_at) VALUES ('r:a', 10, 1e-9, 100, now())`, schema))
	require.NoError(t, err)
	res := pick("q1", "r:a")
	require.Equal(t, []string{"-/-", "-/-", "-/-", "-/-", "-/-", "-/-"}, claimedKeys(res.Rows), "the lane's four rows and the two free ones")
	require.Equal(t, 8, res.Considered, "the other limit's and the key's rows were admissible: in the window, left")
	require.InDelta(t, 4, tokens("r:a"), 1e-6, "exactly the lane's weight debited")
	res = pick("q1", "")
	require.Len(t, res.Rows, 2, "the rows left are an admission pick's")

	// A lane row with a key (free: no row of it executes) is not the lane's: nothing of the lane
	// is granted or debited, and the admission pick grants the lane's rows in order with the
	// key's row among them.
	insert("q5", [2]string{"", "r:a"}, [2]string{"k2", "r:a"}, [2]string{"", ""})
	res = pick("q5", "r:a")
	require.Equal(t, []string{"-/-"}, claimedKeys(res.Rows), "only the free row")
	require.InDelta(t, 4, tokens("r:a"), 1e-6, "nothing debited for rows the lane did not claim")
	res = pick("q5", "")
	require.Equal(t, []string{"-/-", "k2/-"}, claimedKeys(res.Rows))
	require.InDelta(t, 1, tokens("r:a"), 1e-6, "weights 1 and 2")
	_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.buckets SET tokens = 4 WHERE key = 'r:a'`, schema))
	require.NoError(t, err)

	// 6 tokens' worth again (weights 1, 2, 2, 1), against the 4 left: none granted, nothing
	// debited; the admission pick grants the prefix that fits (1 + 2).
	insert("q2", [2]string{"", "r:a"}, [2]string{"", "r:a"}, [2]string{"", ""}, [2]string{"", "r:a"}, [2]string{"", "r:a"})
	res = pick("q2", "r:a")
	require.Len(t, res.Rows, 1, "only the free row")
	require.InDelta(t, 4, tokens("r:a"), 1e-6)
	res = pick("q2", "")
	require.Len(t, res.Rows, 2)
	require.InDelta(t, 1, tokens("r:a"), 1e-6)

	// A cold bucket is full: the lane's first grant mints it debited, unless the grant is more
	// than a full bucket holds.
	insert("q3", [2]string{"", "r:c"}, [2]string{"", "r:c"})
	res = pick("q3", "r:c")
	require.Len(t, res.Rows, 2)
	require.InDelta(t, 98, tokens("r:c"), 1e-6)
	big := make([][2]string, 0, 101)
	for range 101 {
		big = append(big, [2]string{"", "r:d"})
	}
	insert("q4", big...)
	res, err = s.Pick(ctx, pool, "q4", 101, "o#q4", PickOpts{Lease: time.Minute, Rates: rates, Lane: Lane{Rate: "r:d"}})
	require.NoError(t, err)
	require.Empty(t, res.Rows, "101 tokens' worth is more than a bucket of 100 holds")
	require.Equal(t, float64(-1), tokens("r:d"), "no bucket minted")
}

// An admission pick charges a bucket only for rows it can claim: of a K = 1 key's rows in the
// window it claims the most urgent, so that one alone takes tokens (the key's other rows wait,
// uncharged, for the next pick). With and without gates configured.
func TestRatedPickChargesOnlyTheRowsItCanClaim(t *testing.T) {
	for name, gates := range map[string]*Gates{
		"pick_rated":    nil,
		"pick_admitted": {Names: []string{"g"}, Limits: []int32{10}, Shards: []int32{1}},
	} {
		t.Run(name, func(t *testing.T) {
			pool := durabledbtest.Pool(t, 2)
			schema := durabledbtest.Schema(t, pool)
			s, err := New(schema)
			require.NoError(t, err)
			ctx := context.Background()
			rates := &Rates{Names: []string{"r"}, Rates: []float64{1e-9}, Bursts: []float64{100}}
			var in []InsertRow
			for _, k := range []string{"k", "k", "k", "g:x", "g:x"} {
				in = append(in, InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1,
					ConcurrencyKey: k, RateLimit: "r:a", Weight: 3})
			}
			_, err = s.InsertMany(ctx, pool, in)
			require.NoError(t, err)
			res, err := s.Pick(ctx, pool, "q", 10, "o#1", PickOpts{Lease: time.Minute, Gates: gates, Rates: rates})
			require.NoError(t, err)
			var tokens float64
			require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT tokens FROM %q.buckets WHERE key = 'r:a'`, schema)).Scan(&tokens))
			if gates == nil {
				// Every key is K = 1: one row of k, one of g:x.
				require.Len(t, res.Rows, 2)
				require.InDelta(t, 100-2*3, tokens, 1e-6, "charged for the two rows claimed")
			} else {
				// g:x is gated (limit 10): both of its rows, and one of k.
				require.Len(t, res.Rows, 3)
				require.InDelta(t, 100-3*3, tokens, 1e-6, "charged for the three rows claimed")
			}
		})
	}
}

// bucketRace sets up a pick racing GC's pruning of its bucket: rows of limit r:a (rate 10 a
// second, burst 10) in queue q; the pick's transaction, begun at p; the bucket r:a, which holds
// half a burst at p and is full half a second later; and the database clock past p + 600ms, so
// that a sweep starting now finds the bucket full.
type bucketRace struct {
	s       *Store
	pool    *pgxpool.Pool
	schema  string
	rates   *Rates
	pick    pgx.Tx
	p       time.Time
	pickPID uint32
}

func newBucketRace(t *testing.T, rows int) *bucketRace {
	t.Helper()
	s, pool, schema := newTestStore(t, 4)
	ctx := context.Background()
	r := &bucketRace{s: s, pool: pool, schema: schema, rates: &Rates{Names: []string{"r"}, Rates: []float64{10}, Bursts: []float64{10}}}
	var in []InsertRow
	for range rows {
		in = append(in, InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, RateLimit: "r:a", Weight: 1})
	}
	_, err := s.InsertMany(ctx, pool, in)
	require.NoError(t, err)
	r.pick, err = pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.pick.Rollback(ctx) })
	require.NoError(t, r.pick.QueryRow(ctx, `SELECT now(), pg_backend_pid()`).Scan(&r.p, &r.pickPID))
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.buckets (key, tokens, rate, burst, updated_at)
		VALUES ('r:a', 0, 10, 10, $1::timestamptz - interval '500 milliseconds')`, schema), r.p)
	require.NoError(t, err)
	for {
		var passed bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp() > $1::timestamptz + interval '600 milliseconds'`, r.p).Scan(&passed))
		if passed {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A bucket the GC sweep deletes as refilled while a pick that read it is writing its debit: the
// pick's balance came from its own clock (now(), its transaction's start), before the sweep saw
// the bucket full, so a debit that minted the bucket full less the grant would credit again the
// refill between the two. The debit mints the balance the pick read less its grant instead.
// (The sweep here prunes buckets the moment they are full; GC's wait for a full minute makes
// this a pick whose transaction began a minute before its statement.)
func TestABucketSweptDuringAPickNeverCreditsTheRefillTwice(t *testing.T) {
	const weight = 5
	r := newBucketRace(t, weight)
	ctx := context.Background()
	sweep, err := r.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = sweep.Rollback(ctx) }()
	n, err := r.s.GCBuckets(ctx, sweep, r.rates, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the sweep deletes the refilled bucket")

	// The pick reads the bucket (the sweep has not committed), grants its balance at p (half a
	// burst), and its debit waits on the sweep's lock.
	type picked struct {
		res PickResult
		err error
	}
	done := make(chan picked, 1)
	go func() {
		res, err := r.s.Pick(ctx, r.pick, "q", 10, "o", PickOpts{Lease: time.Minute, Rates: r.rates})
		done <- picked{res, err}
	}()
	for {
		var waiting bool
		require.NoError(t, r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, r.pickPID).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case res := <-done:
			t.Fatalf("the pick finished before the sweep committed: %d rows, %v", len(res.res.Rows), res.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.NoError(t, sweep.Commit(ctx))
	res := <-done
	require.NoError(t, res.err)
	require.Len(t, res.res.Rows, weight, "the balance at p affords the five rows")
	require.NoError(t, r.pick.Commit(ctx))

	// The bucket's tokens, carried back to p by its rate, are at most what the pick left at p:
	// the same line refilled at the same rate, so the bucket never holds more than it should.
	var atP float64
	require.NoError(t, r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT tokens + rate * extract(epoch FROM $1::timestamptz - updated_at)
		FROM %q.buckets WHERE key = 'r:a'`, r.schema), r.p).Scan(&atP))
	require.LessOrEqual(t, atP, 5.0-weight+1e-6, "the debit minted a bucket that credits the refill before the sweep again")
}

// A pick takes a missing bucket as full at its transaction's start, which comes before its
// statement's snapshot: a bucket pruned in between, the moment it refilled, would be full to
// that pick too early. The sweep prunes a bucket only once it has been full for a while (GC: a
// minute), so a bucket that was not full when a running pick began is left for it to read.
func TestASweepLeavesABucketThatWasNotFullWhenAPickBegan(t *testing.T) {
	r := newBucketRace(t, 10)
	ctx := context.Background()
	n, err := r.s.GCBuckets(ctx, r.pool, r.rates, time.Minute)
	require.NoError(t, err)
	require.Zero(t, n, "the sweep pruned a bucket full for less than its minute")

	// The pick, its snapshot taken now, still reads the bucket: half a burst at p.
	res, err := r.s.Pick(ctx, r.pick, "q", 10, "o", PickOpts{Lease: time.Minute, Rates: r.rates})
	require.NoError(t, err)
	require.NoError(t, r.pick.Commit(ctx))
	require.Len(t, res.Rows, 5, "the pick granted more than the bucket held at its start")
}
