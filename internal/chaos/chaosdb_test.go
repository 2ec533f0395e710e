package chaos

// The database of the infrastructure-fault tests (Postgres restarts, session kills, network
// faults, PgBouncer, bloat): a private cluster, or a schema of the shared server, with the
// oracle installed.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// chaosDB is a chaos test's database: a pool (direct, for the test's own reads and inserts) and
// a migrated schema with the oracle installed.
type chaosDB struct {
	url    string
	pool   *pgxpool.Pool
	schema string
	// cluster is the private cluster the database is on (nil: the shared server, where the test
	// judges I8 itself), whose server log counts its deadlocks.
	cluster *devdb.DB
}

// newChaosDB makes a schema on the Postgres at url (through pool, made by the caller) and
// installs the oracle in it.
func newChaosDB(t *testing.T, url string, pool *pgxpool.Pool, schema string) *chaosDB {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, oracle.Install(ctx, pool, schema))
	return &chaosDB{url: url, pool: pool, schema: schema}
}

func (d *chaosDB) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, d.pool.QueryRow(context.Background(), expand(query, d.schema), args...).Scan(&n))
	return n
}

// now is the database's clock.
func (d *chaosDB) now(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, d.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now))
	return now
}

// insert inserts n chaosMachine instances through a client of its own, priority prio (0: 5).
func (d *chaosDB) insert(t *testing.T, n, prio int) []int64 {
	t.Helper()
	cl, err := gendurable.NewClient(d.pool, &gendurable.Config{Schema: d.schema})
	require.NoError(t, err)
	m := chaosMachine(nil, d.schema, 0, 0, 0)
	ids := make([]int64, 0, n)
	for done := 0; done < n; {
		batch := min(n-done, 5000)
		params := make([]gendurable.InsertManyParams, batch)
		for i := range params {
			params[i] = gendurable.InsertManyParams{Input: m.With(path{}), Opts: &gendurable.InsertOpts{Priority: prio}}
		}
		res, err := cl.InsertMany(context.Background(), params)
		require.NoError(t, err)
		for _, r := range res {
			ids = append(ids, r.ID)
		}
		done += batch
	}
	return ids
}

// done counts finished instances.
func (d *chaosDB) done(t *testing.T) int {
	return d.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`)
}

// waitDone waits until n instances are done, failing the test after timeout.
func (d *chaosDB) waitDone(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%d instances done", n), func() bool {
		// The test's own connections may have been cut by the fault: an error is "not yet".
		var k int
		err := d.pool.QueryRow(context.Background(), expand(`SELECT count(*) FROM {schema}.instances WHERE status = 'done'`,
			d.schema)).Scan(&k)
		return err == nil && k >= n
	})
}

// check runs the oracle (I1–I7, and I8 on a private cluster) and fails the test on any
// violation; it returns the number of violations and of duplicate terminal transitions for the
// report.
func (d *chaosDB) check(t *testing.T, n int) (violations, dupTerminal int) {
	t.Helper()
	ctx := context.Background()
	v, err := oracle.Check(ctx, d.pool, d.schema, oracle.Opts{N: n, Effects: true, Counter: true, Path: linearPath})
	require.NoError(t, err)
	if d.cluster != nil {
		if k := d.deadlocks(t); k > 0 {
			v = append(v, oracle.Violation{Invariant: "I8 no deadlocks", Detail: fmt.Sprintf("the server logged %d deadlocks", k)})
		}
	}
	dupTerminal = d.count(t, `SELECT coalesce(sum(k - 1), 0) FROM (SELECT count(*) AS k FROM {schema}.t_outcome_log
		WHERE new_status = 'done' AND old_status IS DISTINCT FROM new_status GROUP BY id) c`)
	require.Empty(t, v, "oracle violations")
	return len(v), dupTerminal
}

// deadlocks counts the deadlocks of a private cluster from its server log, which every backend
// writes as it detects one (pg_stat_database would have it only once that backend reports its
// counts, and an immediate shutdown loses them).
func (d *chaosDB) deadlocks(t *testing.T) int {
	t.Helper()
	require.NotNil(t, d.cluster, "deadlocks: not a private cluster")
	log, err := d.cluster.ServerLog()
	require.NoError(t, err)
	return strings.Count(log, "deadlock detected")
}

// privateCluster starts a Postgres cluster of the test's own (never the shared server: the test
// may stop or restart it), with a pool and a migrated schema with the oracle installed; all of
// it is stopped and removed when the test ends.
func privateCluster(t *testing.T, settings map[string]string) (*devdb.DB, *chaosDB) {
	t.Helper()
	return privateClusterWith(t, devdb.ClusterOptions{Settings: settings})
}

// privateClusterWith is privateCluster with the cluster's options (its server's settings and
// environment).
func privateClusterWith(t *testing.T, opts devdb.ClusterOptions) (*devdb.DB, *chaosDB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err := devdb.StartCluster(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cluster.Close()) })
	cfg, err := poolConfig(cluster.URL, "test-"+t.Name(), 8, "")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db := newChaosDB(t, cluster.URL, pool, durabledbtest.Schema(t, pool))
	db.cluster = cluster
	return cluster, db
}

// progress is the fraction of the chaos queue's steps done (each instance has 5).
func (d *chaosDB) progress(ctx context.Context, n int) (float64, error) {
	var steps int64
	err := d.pool.QueryRow(ctx, expand(`SELECT coalesce(sum(coalesce((result->>'i')::int, (state->>'i')::int)), 0)
		FROM {schema}.instances WHERE queue = 'chaos'`, d.schema)).Scan(&steps)
	return float64(steps) / float64(5*n), err
}

// waitProgress waits until the run reaches frac, failing the test after timeout.
func (d *chaosDB) waitProgress(t *testing.T, n int, frac float64, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%.0f%% of the steps", 100*frac), func() bool {
		p, err := d.progress(context.Background(), n)
		return err == nil && p >= frac
	})
}
