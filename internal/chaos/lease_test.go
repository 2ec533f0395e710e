package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/stretchr/testify/require"
)

// TestLeasedPicksRaceTheReconcilerAtExpiry races picks under gate leases that expire within
// milliseconds of being taken against two reconcilers sweeping in a loop: a pick that began
// before its lease expired may commit while a reconciler removes the lease and sets the counter
// from its own snapshot. Nothing ever finishes, so the counter must never fall below the rows
// executing in its shard. A trigger on the counter checks every write of it against the rows
// committed at that moment, and records any write below them.
func TestLeasedPicksRaceTheReconcilerAtExpiry(t *testing.T) {
	e := newEnv(t, 12)
	ctx := context.Background()
	st, err := store.New(e.schema)
	require.NoError(t, err)
	gates := &store.Gates{Names: []string{"g"}, Limits: []int32{1_000_000}, Shards: []int32{1}}
	for _, ddl := range []string{
		`CREATE TABLE {schema}.t_under (at timestamptz, held integer, executing bigint)`,
		`CREATE FUNCTION {schema}.t_check_held() RETURNS trigger LANGUAGE plpgsql AS $$
		 DECLARE n bigint;
		 BEGIN
		   SELECT count(*) INTO n FROM {schema}.instances
		   WHERE status = 'executing' AND concurrency_key = NEW.key AND concurrency_shard = NEW.shard;
		   IF NEW.held < n THEN
		     INSERT INTO {schema}.t_under VALUES (clock_timestamp(), NEW.held, n);
		   END IF;
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER t_check_held AFTER INSERT OR UPDATE ON {schema}.gates
		 FOR EACH ROW EXECUTE FUNCTION {schema}.t_check_held()`,
	} {
		_, err := e.pool.Exec(ctx, e.q(ddl))
		require.NoError(t, err)
	}
	rows := make([]store.InsertRow, oracle.Size(20_000, 100_000))
	for i := range rows {
		rows[i] = store.InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1,
			ConcurrencyKey: "g:a", Weight: 1}
	}
	_, err = st.InsertMany(ctx, e.pool, rows)
	require.NoError(t, err)

	deadline := time.Now().Add(time.Duration(oracle.Size(4, 30)) * time.Second)
	var wg sync.WaitGroup
	var leases, claimed, removed atomic.Int64
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(deadline); n++ {
				owner := fmt.Sprintf("p%d/L%d", p, n)
				ttl := time.Duration(1+rand.IntN(6)) * time.Millisecond
				shard, ok, err := st.LeaseGate(ctx, e.pool, "g:a", 1_000_000, 1, owner, 20, 1, ttl)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				leases.Add(1)
				l := &store.Lease{Key: "g:a", Shard: shard, Owner: owner}
				for k := range 3 {
					res, err := st.Pick(ctx, e.pool, "q", 5, fmt.Sprintf("p%d#%d.%d", p, n, k), store.PickOpts{Lease: time.Hour, Gates: gates, Lane: store.Lane{Gate: l}})
					if err != nil && !store.GateContention(err) {
						t.Error(err)
						return
					}
					claimed.Add(int64(len(res.Rows)))
					time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
				}
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				rep, _, err := st.ReconcileGates(ctx, e.pool, gates)
				if err != nil {
					t.Error(err)
					return
				}
				removed.Add(int64(rep))
			}
		}()
	}
	wg.Wait()
	t.Logf("%d leases, %d rows claimed under them, %d repairs", leases.Load(), claimed.Load(), removed.Load())
	require.Positive(t, claimed.Load())
	require.Positive(t, removed.Load(), "the reconcilers removed expired leases")
	var under []string
	r, err := e.side.Query(ctx, e.q(`SELECT format('%s: held %s, %s executing', at, held, executing) FROM {schema}.t_under ORDER BY at`))
	require.NoError(t, err)
	for r.Next() {
		var s string
		require.NoError(t, r.Scan(&s))
		under = append(under, s)
	}
	require.NoError(t, r.Err())
	require.Empty(t, under, "a counter was written below the rows executing in its shard")
}

// TestRateLanesNeverOverdrawABucket races eight pickers on the same rate lane (and two on
// admission picks) over a bucket of 300 tokens that does not refill: each lane pick grants all
// of its window's rows or none, and the bucket's writeback applies only while the grant fits its
// newest balance. From the rows: at most 300 tokens' worth of limited rows claimed, and every
// token the bucket lost is a claimed row's.
func TestRateLanesNeverOverdrawABucket(t *testing.T) {
	e := newEnv(t, 12)
	ctx := context.Background()
	st, err := store.New(e.schema)
	require.NoError(t, err)
	rates := &store.Rates{Names: []string{"r"}, Rates: []float64{1e-9}, Bursts: []float64{300}}
	rows := make([]store.InsertRow, 1000)
	for i := range rows {
		rows[i] = store.InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1,
			RateLimit: "r:a", Weight: 1 + i%3}
	}
	_, err = st.InsertMany(ctx, e.pool, rows)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var empty atomic.Int64
	for p := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lane := store.Lane{Rate: "r:a"}
			if p >= 8 {
				lane = store.Lane{}
			}
			for n := 0; empty.Load() < 50; n++ {
				res, err := st.Pick(ctx, e.pool, "q", 1+rand.IntN(6), fmt.Sprintf("p%d#%d", p, n), store.PickOpts{Lease: time.Hour, Rates: rates, Lane: lane})
				if store.GateContention(err) {
					continue // a lock wait past the pick's timeout: not a sign the bucket is spent
				}
				if err != nil {
					t.Error(err)
					return
				}
				if len(res.Rows) == 0 {
					empty.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	var granted int
	var left float64
	require.NoError(t, e.side.QueryRow(ctx, e.q(`SELECT (SELECT coalesce(sum(weight), 0)::int FROM {schema}.instances WHERE status = 'executing'),
		(SELECT tokens FROM {schema}.buckets WHERE key = 'r:a')`)).Scan(&granted, &left))
	t.Logf("%d tokens' worth granted, %.3f left", granted, left)
	require.LessOrEqual(t, granted, 300, "the bucket was overdrawn")
	require.InDelta(t, 300, float64(granted)+left, 1e-6, "every token debited is a granted row's")
	// (Strict order: a head row heavier than what is left blocks the rest.)
	require.GreaterOrEqual(t, granted, 298, "the bucket was spent down to less than a row's weight")
}
