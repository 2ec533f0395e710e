package devdb

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The fallback a fresh machine without a running server takes: start a throwaway cluster from
// the machine's binaries (as an unprivileged user when root), use it, and remove it.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := Resolve(ctx, Options{SkipEnv: true, SkipLocal: true, NoInstall: true, Log: testWriter{t}})
	require.NoError(t, err)
	require.Contains(t, db.Source, "throwaway")
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	var fsync string
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	require.Equal(t, "off", fsync)
	var version int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	require.GreaterOrEqual(t, version, 150000)
	require.NoError(t, conn.Close(ctx))
	dir := db.dir
	require.NoError(t, db.Close())
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the cluster's folder is removed")
}

func TestResolvePrefersDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/nothing?connect_timeout=1")
	_, err := Resolve(context.Background(), Options{NoInstall: true})
	require.ErrorContains(t, err, "DATABASE_URL is set but Postgres is not reachable")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// A private cluster survives a fast restart and an immediate stop (crash recovery) with its data.
func TestPrivateClusterStopsAndStarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := StartCluster(ctx, ClusterOptions{NoInstall: true, Log: testWriter{t},
		Settings: map[string]string{"autovacuum_naptime": "7"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	query := func(sql string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var out string
		require.NoError(t, conn.QueryRow(ctx, sql).Scan(&out))
		return out
	}
	require.Equal(t, "7s", query("SHOW autovacuum_naptime"))
	require.Equal(t, "1", query("WITH c AS (SELECT 1) SELECT '1'"))
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept AS SELECT 'yes' AS v")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, db.Restart(ctx, "fast"))
	require.Equal(t, "yes", query("SELECT v FROM kept"))
	require.Equal(t, "7s", query("SHOW autovacuum_naptime"), "restart keeps the settings")
	require.NoError(t, db.Stop(ctx, "immediate"))
	_, err = pgx.Connect(ctx, db.URL)
	require.Error(t, err, "stopped")
	require.NoError(t, db.Start(ctx))
	require.Equal(t, "yes", query("SELECT v FROM kept"))
}

// A pgbouncer of the test's own in transaction mode, in front of a private cluster.
func TestPgBouncerInFront(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, err := StartCluster(ctx, ClusterOptions{NoInstall: true, Log: testWriter{t}})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	b, err := StartPgBouncer(ctx, db.URL, PgBouncerOptions{Log: testWriter{t}, PoolSize: 2})
	require.NoError(t, err)
	dir := b.dir
	cfg, err := pgx.ParseConfig(b.URL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT $1::int + 1", 41).Scan(&n))
	require.Equal(t, 42, n)
	var port string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('port')").Scan(&port))
	require.Equal(t, fmt.Sprint(db.Port), port, "the pooler's server is the cluster")
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, b.Close())
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the pooler's folder is removed")
}
