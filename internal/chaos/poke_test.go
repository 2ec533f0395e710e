package chaos

// Pokes across processes: the LISTEN/NOTIFY transport wakes a worker process at once. The test
// measures milliseconds, so it runs on its own (see the Makefile's latency-bound tests).

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// idleFor is how long a queue must sit idle before a test relies on its pokes: by then its idle
// backoff has grown past 2.5 s (10 ms doubling per empty poll), so a start within pokeBound
// cannot be a poll's doing.
const (
	idleFor   = 3 * time.Second
	pokeBound = 100 * time.Millisecond
)

// poked waits for the queues to idle (their next poll seconds away), runs try, and requires its
// latency within bound. A try that misses by less than bound (a loaded machine) is run again, up
// to three times; a miss by more fails at once: that is a poll's doing, not a poke's.
func poked(t *testing.T, what string, bound time.Duration, try func() time.Duration) {
	t.Helper()
	var seen []time.Duration
	for range 3 {
		time.Sleep(idleFor)
		d := try()
		if d < bound {
			return
		}
		seen = append(seen, d)
		if d >= 2*bound {
			break
		}
	}
	t.Fatalf("%s: not started within %v after an insert (tries: %v)", what, bound, seen)
}

// startLatency is, by the database clock, how long after its insert instance id's first step
// started (the effect machine records each step).
func startLatency(t *testing.T, e *env, id int64) time.Duration {
	t.Helper()
	var ms float64
	eventually(t, 5*time.Second, "the first step", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1`, id) > 0
	})
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`
		SELECT extract(epoch FROM min(f.at) - i.inserted_at) * 1000
		FROM {schema}.t_effects f JOIN {schema}.instances i USING (id) WHERE id = $1 GROUP BY i.inserted_at`, e.schema),
		id).Scan(&ms))
	return time.Duration(ms * float64(time.Millisecond))
}

func insertEffect(t *testing.T, cl *gendurable.Client) int64 {
	t.Helper()
	res, err := cl.Insert(context.Background(), linear("linear5", 0, nil).With(path{}), &gendurable.InsertOpts{Queue: "crash"})
	require.NoError(t, err)
	return res.ID
}

// With PokePostgres, an insert on one process (a web node that runs no queue) is started by a
// worker process at once, though the worker polls only every 10 s; an InsertTx's poke leaves with
// its commit.
func TestPokePostgresReachesAnotherProcess(t *testing.T) {
	e := newEnv(t, 16)
	startWorker(t, e.crashCfg("pokeworker", func(c *workerCfg) { c.Poke, c.PollMS, c.StepMS = "postgres", 10000, 0 }))
	web := e.client(t, &gendurable.Config{Name: "web", Poke: gendurable.PokePostgres(),
		Machines: []gendurable.Machine{linear("linear5", 0, nil)}})
	start(t, web)

	poked(t, "Insert", pokeBound, func() time.Duration { return startLatency(t, e, insertEffect(t, web)) })
	poked(t, "InsertTx", pokeBound, func() time.Duration { return insertTxLatency(t, e, web) })
}

// insertTxLatency inserts in a transaction, checks that nothing starts before its commit, and
// returns how long after the commit the instance's first step started.
func insertTxLatency(t *testing.T, e *env, web *gendurable.Client) time.Duration {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := web.InsertTx(ctx, tx, linear("linear5", 0, nil).With(path{}), &gendurable.InsertOpts{Queue: "crash"})
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // nothing may start before the commit
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1`, res.ID))
	require.NoError(t, tx.Commit(ctx))
	var committed time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&committed))
	eventually(t, 5*time.Second, "the first step", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1`, res.ID) > 0
	})
	var first time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT min(at) FROM {schema}.t_effects WHERE id = $1`, e.schema),
		res.ID).Scan(&first))
	return first.Sub(committed)
}
