package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/stretchr/testify/require"
)

// holdWrites installs, in the env's schema, a trigger that makes every write of a row of table
// wait, before it happens, while the test holds the advisory lock the returned functions take and
// give back: the server-side form of a fault point, for windows inside one statement (a pick
// reads a bucket's balance and writes it back in one statement; Go sees nothing in between).
func holdWrites(t *testing.T, e *env, table string) (hold, release func()) {
	t.Helper()
	ctx := context.Background()
	e.exec(t, fmt.Sprintf(`CREATE FUNCTION {schema}.t_hold_write() RETURNS trigger LANGUAGE plpgsql
		SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN PERFORM pg_advisory_xact_lock_shared(hashtext(TG_TABLE_SCHEMA)); RETURN NEW; END $fn$;
		CREATE TRIGGER t_hold_write BEFORE INSERT OR UPDATE ON {schema}.%s FOR EACH ROW EXECUTE FUNCTION {schema}.t_hold_write()`, table))
	conn, err := e.side.Acquire(ctx)
	require.NoError(t, err)
	held := false
	release = func() {
		if held {
			_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext($1))`, e.schema)
			require.NoError(t, err)
			held = false
		}
	}
	t.Cleanup(func() { release(); conn.Release() }) // a failed test must not leave the writers waiting
	hold = func() {
		_, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, e.schema)
		require.NoError(t, err)
		held = true
	}
	return hold, release
}

// The rate-limit writeback race, forced: two picks read a bucket's balance (each takes burst
// candidates, sees burst tokens and grants them all) and are both held at the moment they write it back (a trigger on
// the buckets table: bucket_before_writeback, server side); then both go. The second writeback
// must find the bucket already debited and grant nothing, so the two grant burst rows between
// them, not twice that. Both for a cold key (no bucket row yet: the two meet on its primary key)
// and a warm one (an existing, full bucket: they meet on its row lock).
func TestBucketWritebackRaceNeverOverdraws(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8)
	ctx := context.Background()
	st, err := store.New(e.schema)
	require.NoError(t, err)
	const burst = 5
	rates := &store.Rates{Names: []string{"api"}, Rates: []float64{0.001}, Bursts: []float64{burst}}
	job := gendurable.Job[string]{Name: "rj", Queue: "r", Perform: func(*gendurable.Ctx, string) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 1, Period: 1000 * time.Second, Burst: burst}}})
	params := make([]gendurable.InsertManyParams, 3*burst)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With("x"), Opts: &gendurable.InsertOpts{Queue: "r", RateLimit: "api"}}
	}
	_, err = cl.InsertMany(ctx, params)
	require.NoError(t, err)
	hold, release := holdWrites(t, e, "buckets")
	reps := oracle.Size(20, 100)
	for _, warm := range []bool{false, true} {
		for rep := range reps {
			e.exec(t, `UPDATE {schema}.instances SET status = 'available', locked_by = NULL, locked_until = NULL, attempt = 0`)
			e.exec(t, `DELETE FROM {schema}.buckets`)
			if warm {
				e.exec(t, `INSERT INTO {schema}.buckets (key, tokens, rate, burst, updated_at) VALUES ('api', $1, 0.001, $1, now())`, burst)
			}
			hold()
			type result struct {
				res store.PickResult
				err error
			}
			results := make(chan result, 2)
			for i := range 2 {
				go func() {
					// In a transaction of the test's: no lock_timeout, so the held pick waits as
					// long as the test wants (the production pick would give up after 100 ms and
					// retry with a fresh snapshot).
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						results <- result{err: err}
						return
					}
					defer func() { _ = tx.Rollback(ctx) }()
					// Each takes burst candidates (the other's are locked: SKIP LOCKED), and each sees a
					// full bucket.
					// One picker is hinted at the bucket (it reads it once, at its start), the other
					// tests it row by row: the two ways must meet at the writeback the same.
					res, err := st.Pick(ctx, tx, "r", burst, fmt.Sprintf("picker%d#%d", i, rep), store.PickOpts{Lease: time.Minute, Rates: rates, Hint: store.Hint{RateKeys: []string{"api"}[:1-i]}})
					if err == nil {
						err = tx.Commit(ctx)
					}
					results <- result{res, err}
				}()
			}
			eventually(t, 10*time.Second, "both picks at the writeback", func() bool { return e.lockWaits(t) == 2 })
			release()
			var got []int
			for range 2 {
				r := <-results
				require.NoError(t, r.err)
				got = append(got, len(r.res.Rows))
			}
			require.ElementsMatch(t, []int{burst, 0}, got, "warm %v, rep %d: the picks claimed %v from a bucket of %d", warm, rep, got, burst)
			require.Equal(t, burst, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`))
			require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.buckets WHERE tokens < 0 OR tokens > burst`))
		}
		t.Logf("warm bucket %v: %d/%d races granted exactly burst", warm, reps, reps)
	}
	e.exec(t, `UPDATE {schema}.instances SET status = 'available', locked_by = NULL, locked_until = NULL, attempt = 0`)
	e.check(t, oracle.Opts{Terminal: []string{"available"}}, oracle.Summary{Instances: 3 * burst, Faults: 2 * reps})
}

// The gate debit race, forced the same way: two picks each take 2 of the 4 candidates of a key
// and both see its gate's 2 free slots, and are held at the moment they debit its counter (gates trigger).
// The second debit must not fit (the ON CONFLICT condition re-reads the newest count) and claim
// nothing of the key: 2 executing, never 4.
func TestGateDebitRaceNeverOverAdmits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8)
	ctx := context.Background()
	st, err := store.New(e.schema)
	require.NoError(t, err)
	gates := &store.Gates{Names: []string{"g"}, Limits: []int32{2}, Shards: []int32{1}}
	job := gendurable.Job[string]{Name: "gj", Queue: "g", Perform: func(*gendurable.Ctx, string) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	params := make([]gendurable.InsertManyParams, 4)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With("x"), Opts: &gendurable.InsertOpts{Queue: "g", ConcurrencyKey: "g:1"}}
	}
	_, err = cl.InsertMany(ctx, params)
	require.NoError(t, err)
	hold, release := holdWrites(t, e, "gates")
	reps := oracle.Size(20, 100)
	for _, warm := range []bool{false, true} {
		for rep := range reps {
			e.exec(t, `UPDATE {schema}.instances SET status = 'available', locked_by = NULL, locked_until = NULL, attempt = 0,
				concurrency_shard = NULL`)
			e.exec(t, `DELETE FROM {schema}.gates`)
			if warm {
				e.exec(t, `INSERT INTO {schema}.gates (key, shard, held, capacity) VALUES ('g:1', 0, 0, 2)`)
			}
			hold()
			errs := make(chan error, 2)
			claimed := make(chan int, 2)
			for i := range 2 {
				go func() {
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						errs <- err
						return
					}
					defer func() { _ = tx.Rollback(ctx) }()
					// Each takes 2 candidates (SKIP LOCKED keeps them apart) and sees 2 free slots.
					// One picker is hinted at the key, the other tests its gate row by row.
					res, err := st.Pick(ctx, tx, "g", 2, fmt.Sprintf("picker%d#%d", i, rep), store.PickOpts{Lease: time.Minute, Gates: gates, Hint: store.Hint{GateKeys: []string{"g:1"}[:1-i]}})
					if err == nil {
						err = tx.Commit(ctx)
					}
					if err != nil && store.GateContention(err) { // the CHECK backstop: a lost race, retried by the engine
						err = nil
						res.Rows = nil
					}
					claimed <- len(res.Rows)
					errs <- err
				}()
			}
			eventually(t, 10*time.Second, "both picks at the debit", func() bool { return e.lockWaits(t) == 2 })
			release()
			total := 0
			for range 2 {
				require.NoError(t, <-errs)
				total += <-claimed
			}
			require.Equal(t, 2, total, "warm %v, rep %d: the gate admitted %d of limit 2", warm, rep, total)
			require.Equal(t, 2, e.count(t, `SELECT held FROM {schema}.gates WHERE key = 'g:1'`))
		}
		t.Logf("warm counter %v: %d/%d races admitted exactly the limit", warm, reps, reps)
	}
	e.exec(t, `UPDATE {schema}.instances SET status = 'available', locked_by = NULL, locked_until = NULL, attempt = 0, concurrency_shard = NULL`)
	e.exec(t, `DELETE FROM {schema}.gates`)
	e.check(t, oracle.Opts{Terminal: []string{"available"}}, oracle.Summary{Instances: 4, Faults: 2 * reps})
}
