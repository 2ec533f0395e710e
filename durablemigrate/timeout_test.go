package durablemigrate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Many deployments give the application's role a statement_timeout (a few seconds). A migration
// of a large table outlasts it: an index built concurrently scans the table twice and first
// waits for every transaction writing to it, and a step's DDL waits for its lock. Under such a
// timeout the build was cancelled, left its index invalid and failed the run, and every run
// after it did the same. The migrator lifts the timeout for its own session (the caller's
// context bounds the run) and leaves the pool's connection as it found it; the role's
// lock_timeout still applies.
func TestMigrateOutlastsTheRolesStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := durabledbtest.Pool(t, 2)
	schema := fmt.Sprintf("t_migrate_timeout_%d", durablemigrate.Version)
	require.NoError(t, durablemigrate.Drop(ctx, admin, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), admin, schema) })
	require.NoError(t, durablemigrate.MigrateTo(ctx, admin, schema, 10))

	// A writer holds the instances table for a second: version 11's concurrent index build
	// waits for it, longer than the 200ms the sessions allow a statement.
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.instances (machine, step, queue, status, max_attempts, state)
		VALUES ('m', 's', 'q', 'available', 1, '{}')`, schema))
	require.NoError(t, err)
	go func() {
		time.Sleep(time.Second)
		_ = tx.Commit(context.Background())
	}()
	timed := durabledbtest.Pool(t, 1, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "200ms"
	})
	began := time.Now()
	require.NoError(t, durablemigrate.MigrateTo(ctx, timed, schema, 13))
	require.GreaterOrEqual(t, time.Since(began), 900*time.Millisecond, "the build waited for the writer")
	st, err := durablemigrate.Current(ctx, admin, schema)
	require.NoError(t, err)
	require.Equal(t, 13, st.Version)
	var invalid int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_index i
		JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND NOT i.indisvalid`, schema).Scan(&invalid))
	require.Zero(t, invalid)

	// The pool's one connection has its timeout back.
	var timeout string
	require.NoError(t, timed.QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout))
	require.Equal(t, "200ms", timeout)
}
