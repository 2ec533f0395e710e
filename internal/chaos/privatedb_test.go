package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// privateEnv is an env in a database of its own, created for the test and dropped after it.
// Postgres counts deadlocks per database: a test that measures them (or provokes one on purpose)
// needs a database no other test writes to.
func privateEnv(t *testing.T, conns int32) (*env, string) {
	t.Helper()
	ctx := context.Background()
	admin := durabledbtest.Pool(t, 2)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "gd_races_" + hex.EncodeToString(b[:])
	_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(durabledbtest.URL(t))
	require.NoError(t, err)
	require.Contains(t, []string{"postgres", "postgresql"}, u.Scheme, "the tests' database URL is not a URL")
	u.Path = "/" + name
	dsn := u.String()
	open := func(n int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(dsn)
		require.NoError(t, err)
		cfg.MaxConns = n
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close) // closed before the database is dropped (cleanups run last first)
		return p
	}
	e := &env{url: dsn, pool: open(conns), side: open(6), schema: "races", started: time.Now()}
	require.NoError(t, durablemigrate.Migrate(ctx, e.pool, e.schema))
	require.NoError(t, oracle.Install(ctx, e.pool, e.schema))
	e.deadlocks, err = oracle.Deadlocks(ctx, e.pool)
	require.NoError(t, err)
	return e, dsn
}

// deadlocksAfter reads the database's deadlock count once the statistics have caught up (a
// backend reports its counts at most once a second, and when it exits).
func deadlocksAfter(t *testing.T, e *env, atLeast int64, wait time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		n, err := oracle.Deadlocks(context.Background(), e.side)
		require.NoError(t, err)
		if n >= atLeast || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}
