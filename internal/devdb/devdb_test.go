package devdb

import (
	"context"
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
