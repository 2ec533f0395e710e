package races

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	rows := make([]store.InsertRow, size(20_000, 100_000))
	for i := range rows {
		rows[i] = store.InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1,
			ConcurrencyKey: "g:a", Weight: 1}
	}
	_, err = st.InsertMany(ctx, e.pool, rows)
	require.NoError(t, err)

	deadline := time.Now().Add(time.Duration(size(4, 30)) * time.Second)
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
					res, err := st.Pick(ctx, e.pool, "q", 5, fmt.Sprintf("p%d#%d.%d", p, n, k), time.Hour, 0, gates, nil, store.Hint{}, l)
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
