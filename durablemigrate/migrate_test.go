package durablemigrate_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/durabletype"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

func TestMigrateIsIdempotentAndSafeConcurrently(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 12)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_race_%d", durablemigrate.Version)
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })

	require.ErrorIs(t, durablemigrate.Check(ctx, pool, schema), durabletype.ErrNotMigrated)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- durablemigrate.Migrate(ctx, pool, schema)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, durablemigrate.Check(ctx, pool, schema))
	require.NoError(t, durablemigrate.Migrate(ctx, pool, schema))
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.Equal(t, 6, tables) // instances, signals, gates, gate_leases, buckets, meta
}

func TestMigrateRefusesASchemaBuiltFromOtherDDL(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `UPDATE "`+schema+`".meta SET value = 'something-older' WHERE key = 'fingerprint'`)
	require.NoError(t, err)
	err = durablemigrate.Migrate(ctx, pool, schema)
	require.ErrorIs(t, err, durabletype.ErrSchemaMismatch)
	require.Contains(t, err.Error(), "DROP SCHEMA")
	require.ErrorIs(t, durablemigrate.Check(ctx, pool, schema), durabletype.ErrSchemaMismatch)
}

func TestSchemaNamesAreValidatedAndQuoted(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	bads := []string{`a"; DROP SCHEMA public CASCADE; --`, "Upper", "1abc", "pg_mine", "has space", "dot.ted",
		strings.Repeat("a", 64), "semi;colon", "quote'd", "dollar$"}
	for _, bad := range bads {
		err := durablemigrate.Migrate(ctx, pool, bad)
		require.ErrorIs(t, err, durabletype.ErrInvalidIdentifier, bad)
		_, err = durablemigrate.SQL(bad)
		require.ErrorIs(t, err, durabletype.ErrInvalidIdentifier, bad)
	}
	// Nothing was created under any of the names, and public is still there. (Counting every
	// schema before and after would count the schemas other tests create and drop meanwhile.)
	var made, public int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE nspname::text = ANY($1::text[]) OR lower(nspname::text) = ANY($1::text[])),
		count(*) FILTER (WHERE nspname = 'public') FROM pg_namespace`, bads).Scan(&made, &public))
	require.Zero(t, made)
	require.Equal(t, 1, public)
}

func TestPrintedSQLBuildsTheSameSchema(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	const schema = "t_migrate_printed"
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	sql, err := durablemigrate.SQL(schema)
	require.NoError(t, err)
	require.Contains(t, sql, `CREATE TABLE "t_migrate_printed".instances`)
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err)
	// A schema built by hand from the printed SQL is accepted as this version.
	require.NoError(t, durablemigrate.Check(ctx, pool, schema))
	require.NoError(t, durablemigrate.Migrate(ctx, pool, schema))
}

// Version 1 is frozen: its statements (its comments aside) are the text every schema built before
// numbered migrations was made from. A change to the schema is a new migration, never an edit.
func TestVersionOneIsFrozen(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("migrations/001_initial.up.sql")
	require.NoError(t, err)
	var stmts []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			stmts = append(stmts, l)
		}
	}
	sum := sha256.Sum256([]byte(strings.Join(stmts, "\n")))
	require.Equal(t, "cdfa21d5b90771bf6a6dfa7d406ecd5dcc94e753f8f56c711a6eb264b951f42e", hex.EncodeToString(sum[:]),
		"001_initial.up.sql's statements changed: add a migration instead")
	m := durablemigrate.Migrations()
	require.Equal(t, 1, m[0].Version)
	require.False(t, m[0].HasDown(), "version 1 has no down: dropping the schema is the way back")
}
