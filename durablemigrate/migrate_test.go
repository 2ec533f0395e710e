package durablemigrate_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	// The test binary is also the migrating process of TestTwoProcessesMigrateAtOnce.
	if schema := os.Getenv("GD_MIGRATE_SCHEMA"); schema != "" {
		os.Exit(migrateProcess(schema))
	}
	durabledbtest.Main(m)
}

// migrateProcess migrates schema to the newest version from a process of its own, once its
// parent says go (a line on stdin), so that the test's processes start migrating together.
func migrateProcess(schema string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 2
	}
	if err := durablemigrate.Migrate(ctx, pool, schema); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

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
	require.Equal(t, 12, tables) // instances, signals, gates, gate_leases, buckets, meta, nodes, upgrade_requests, schedules, retention, finished_counts, pauses
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

// catalog describes a schema's objects as text, for comparing two schemas: every column with its
// type, default and nullability, every constraint and index with its definition, every type and
// its labels, in name order. Names are schema-qualified only through the definitions, which are
// printed with the schema's name replaced.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
		       CASE WHEN a.attnotnull THEN ' not null' ELSE '' END ||
		       coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_get_constraintdef(k.oid) ||
		       CASE WHEN k.convalidated THEN '' ELSE ' (not validated)' END
		FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1
		UNION ALL
		SELECT 'index ' || indexname || ' ' || indexdef FROM pg_indexes WHERE schemaname = $1
		UNION ALL
		SELECT 'type ' || t.typname || ' ' || coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
		                                                FROM pg_enum e WHERE e.enumtypid = t.oid), '')
		FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		WHERE n.nspname = $1 AND t.typtype = 'e'
		UNION ALL
		SELECT 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r'
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(g.oid)
		FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND NOT g.tgisinternal
		UNION ALL
		SELECT 'function ' || p.proname || ' ' || md5(p.prosrc)
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1
		ORDER BY 1`, schema)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.ReplaceAll(strings.Join(lines, "\n"), schema+".", "S.")
}

// Every step has a down back to version 1, and up, down and up again leaves the schema as the
// first up built it, object for object (a column's position aside: a column dropped and added
// again goes to the end of its table, which no statement depends on).
func TestUpDownUpLeavesTheSameSchema(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_updown_%d", os.Getpid())
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 1))
	one := catalog(t, pool, schema)
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version))
	latest := catalog(t, pool, schema)
	require.NotEqual(t, one, latest)
	st, err := durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, durablemigrate.State{Version: durablemigrate.Version, Readers: durablemigrate.Version - 1}, st)

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 1))
	require.Equal(t, one, catalog(t, pool, schema), "down to 1 leaves version 1's schema")
	st, err = durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 1, st.Version)

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version))
	require.Equal(t, latest, catalog(t, pool, schema), "up again builds the same schema")

	err = durablemigrate.MigrateTo(ctx, pool, schema, 0)
	require.ErrorContains(t, err, "target version 0")
	steps, err := durablemigrate.Plan(1, 0)
	require.Error(t, err)
	require.Nil(t, steps)
}

// Migrating from processes that start together: each applies steps under the advisory lock, so
// every version is applied once, and all of them end with the newest schema.
func TestTwoProcessesMigrateAtOnce(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_procs_%d", os.Getpid())
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })

	exe, err := os.Executable()
	require.NoError(t, err)
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bytes.Buffer
	}
	var procs []proc
	for range 2 {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "GD_MIGRATE_SCHEMA="+schema, "DATABASE_URL="+durabledbtest.URL(t))
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		out := &bytes.Buffer{}
		cmd.Stderr = out
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(stdout).ReadString('\n')
		require.NoError(t, err, out.String())
		require.Equal(t, "ready\n", line)
		procs = append(procs, proc{cmd, stdin, out})
	}
	for _, p := range procs { // go
		_, err := io.WriteString(p.stdin, "go\n")
		require.NoError(t, err)
	}
	for _, p := range procs {
		require.NoError(t, p.cmd.Wait(), p.out.String())
	}
	require.NoError(t, durablemigrate.Check(ctx, pool, schema))
	st, err := durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, durablemigrate.Version, st.Version)
}

// A client checks the schema's version at Start: an older schema is refused with both versions
// and the command that migrates it; a newer one is accepted while its readers include this
// library, and refused with both versions once they do not.
func TestCheckNamesBothVersions(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_check_%d", os.Getpid())
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Required-1))

	err := durablemigrate.Check(ctx, pool, schema)
	var ve *durablemigrate.VersionError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, durabletype.ErrSchemaMismatch)
	require.Contains(t, err.Error(), fmt.Sprintf("version %d, older than this library's %d", durablemigrate.Required-1, durablemigrate.Required))
	require.Contains(t, err.Error(), "gendurable migrate --schema "+schema)

	require.NoError(t, durablemigrate.Migrate(ctx, pool, schema))
	require.NoError(t, durablemigrate.Check(ctx, pool, schema))
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version))
	require.NoError(t, durablemigrate.Check(ctx, pool, schema))

	// A schema one version ahead, readable by this library (a fleet migrated before its deploy).
	set := func(version, readers int) {
		_, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.meta SET value = CASE key WHEN 'version' THEN $1 ELSE $2 END
			WHERE key IN ('version', 'readers')`, schema), fmt.Sprint(version), fmt.Sprint(readers))
		require.NoError(t, err)
	}
	set(durablemigrate.Version+1, durablemigrate.Version)
	require.NoError(t, durablemigrate.Check(ctx, pool, schema))
	require.NoError(t, durablemigrate.Migrate(ctx, pool, schema), "Migrate leaves a newer schema alone")
	// One this library cannot read.
	set(durablemigrate.Version+2, durablemigrate.Version+1)
	err = durablemigrate.Check(ctx, pool, schema)
	require.ErrorAs(t, err, &ve)
	require.Contains(t, err.Error(), fmt.Sprintf("at version %d, which needs a library that knows schema version %d or later; this library knows up to %d",
		durablemigrate.Version+2, durablemigrate.Version+1, durablemigrate.Version))
	require.Error(t, durablemigrate.MigrateTo(ctx, pool, schema, 1), "a schema newer than the library is not migrated down by it")
}

// A schema that exists is brought to version 4 with its index built concurrently, outside a
// transaction; an invalid index a failed build left behind is dropped and built again.
func TestIndexesOfAnExistingSchemaAreBuiltConcurrently(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 4)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_concurrently_%d", durablemigrate.Version)
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 3))
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.instances (machine, step, queue, status, max_attempts, state, finalized_at)
		SELECT 'm' || (g %% 3), 's', 'q', 'done', 1, '{}', now() FROM generate_series(1, 5000) AS g`, schema))
	require.NoError(t, err)
	// A build that failed half way: the index is there, invalid.
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE INDEX instances_finished_by_machine ON %q.instances (machine)`, schema))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pg_catalog.pg_index SET indisvalid = false WHERE indexrelid = $1::regclass`,
		fmt.Sprintf("%q.instances_finished_by_machine", schema))
	require.NoError(t, err)

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version))
	var valid bool
	var def string
	require.NoError(t, pool.QueryRow(ctx, `SELECT i.indisvalid, pg_catalog.pg_get_indexdef(i.indexrelid) FROM pg_catalog.pg_index i
		WHERE i.indexrelid = $1::regclass`, fmt.Sprintf("%q.instances_finished_by_machine", schema)).Scan(&valid, &def))
	require.True(t, valid)
	require.Contains(t, def, "(machine, finalized_at, id) WHERE")
	st, err := durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, durablemigrate.Version, st.Version)

	// The printed SQL builds it as a plain index, in the step's transaction.
	steps, err := durablemigrate.Plan(3, 4)
	require.NoError(t, err)
	sql, err := steps[0].SQL(schema)
	require.NoError(t, err)
	require.Contains(t, sql, "CREATE INDEX IF NOT EXISTS instances_finished_by_machine")
	require.NotContains(t, sql, "CONCURRENTLY")
}

// A schema that does not exist is created at the newest version in one transaction, its indexes
// built plainly: it does not wait for a snapshot another session of the database holds (a
// concurrent build would, for as long as the snapshot lasts), and every catalog row of it comes
// from that one transaction.
func TestANewSchemaIsCreatedInOneTransaction(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 4)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_new_%x", time.Now().UnixNano())
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
	require.NoError(t, err)
	var n int
	require.NoError(t, holder.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_class").Scan(&n))

	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, durablemigrate.Migrate(mctx, pool, schema), "created while another session holds a snapshot")
	st, err := durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, durablemigrate.Version, st.Version)
	require.NoError(t, holder.QueryRow(ctx, "SELECT 1").Scan(&n), "the snapshot's transaction is still open")

	var xmins int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT c.xmin::text) FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1`, schema).Scan(&xmins))
	require.Equal(t, 1, xmins, "every table and index of the new schema was created by one transaction")
}

// A schema that holds finished rows is brought to version 5 with their counts, by queue and
// status, in finished_counts; from then on the triggers count every change, whoever makes it
// (here plain SQL, as a library that knows version 4 would); and down and up again counts them
// afresh.
func TestFinishedRowsAreCountedByTheMigrationThatAddsTheCounts(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_counts_%d", os.Getpid())
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 4))
	exec := func(q string) {
		t.Helper()
		_, err := pool.Exec(ctx, strings.ReplaceAll(q, "{schema}", fmt.Sprintf("%q", schema)))
		require.NoError(t, err)
	}
	exec(`INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, finalized_at)
		SELECT 'm', 's', 'q' || (g % 2),
		       (ARRAY['done', 'failed', 'cancelled', 'available'])[g % 4 + 1]::{schema}.status, 1, '{}',
		       CASE WHEN g % 4 < 3 THEN now() END
		FROM generate_series(1, 4000) AS g`)
	counts := func() map[string]int64 {
		t.Helper()
		rows, err := pool.Query(ctx, strings.ReplaceAll(`SELECT queue || '/' || status, sum(n)::bigint
			FROM {schema}.finished_counts GROUP BY queue, status HAVING sum(n) <> 0`, "{schema}", fmt.Sprintf("%q", schema)))
		require.NoError(t, err)
		out := map[string]int64{}
		var k string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil })
		require.NoError(t, err)
		return out
	}
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 5))
	// g % 4 = 0, 1, 2 are done, failed, cancelled; queue q0 holds the even g, so only done
	// (g % 4 = 0) and cancelled (g % 4 = 2); q1 only failed.
	require.Equal(t, map[string]int64{"q0/done": 1000, "q0/cancelled": 1000, "q1/failed": 1000}, counts())

	exec(`UPDATE {schema}.instances SET status = 'done', finalized_at = now()
		WHERE id IN (SELECT id FROM {schema}.instances WHERE status = 'available' ORDER BY id LIMIT 10)`)
	exec(`UPDATE {schema}.instances SET status = 'available', finalized_at = NULL
		WHERE id IN (SELECT id FROM {schema}.instances WHERE status = 'failed' ORDER BY id LIMIT 3)`)
	exec(`DELETE FROM {schema}.instances WHERE id IN (SELECT id FROM {schema}.instances WHERE status = 'cancelled' ORDER BY id LIMIT 7)`)
	exec(`INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, finalized_at)
		VALUES ('m', 's', 'q2', 'done', 1, '{}', now())`)
	want := map[string]int64{"q0/done": 1000, "q1/done": 10, "q0/cancelled": 993, "q1/failed": 997, "q2/done": 1}
	require.Equal(t, want, counts())

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 4))
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 5))
	require.Equal(t, want, counts())
	var rows int
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %q.finished_counts", schema)).Scan(&rows))
	require.Equal(t, len(want), rows, "the migration writes one row per queue and status")

	exec(`TRUNCATE {schema}.instances CASCADE`)
	require.Empty(t, counts())
}

// Migration 9 has the churning tables vacuumed at a hundredth dead, unthrottled, and leaves an
// operator's own storage parameters alone; down resets them to the server's.
func TestVacuumSettingsOfTheChurningTables(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_vacuum_%d", os.Getpid())
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	options := func(table string) []string {
		var o []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(c.reloptions, '{}') FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, table).Scan(&o))
		return o
	}
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 8))
	require.Equal(t, []string{"fillfactor=80"}, options("instances"))
	// An operator's own setting on a table the migration does not tune stays.
	_, err := pool.Exec(ctx, `ALTER TABLE "`+schema+`".nodes SET (autovacuum_vacuum_scale_factor = 0.05)`)
	require.NoError(t, err)

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 9))
	require.ElementsMatch(t, []string{"fillfactor=80", "autovacuum_vacuum_scale_factor=0.01",
		"autovacuum_vacuum_insert_scale_factor=0.01", "autovacuum_analyze_scale_factor=0.02",
		"autovacuum_vacuum_cost_delay=0"}, options("instances"))
	for _, table := range []string{"signals", "finished_counts"} {
		require.ElementsMatch(t, []string{"autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_cost_delay=0"}, options(table), table)
	}
	require.Equal(t, []string{"autovacuum_vacuum_scale_factor=0.05"}, options("nodes"))

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 8))
	require.Equal(t, []string{"fillfactor=80"}, options("instances"))
	require.Empty(t, options("signals"))
	require.Empty(t, options("finished_counts"))
}

// A contract migration runs only when asked for by its version: Migrate brings an existing schema
// older than the oldest this library runs against (Required) to Required and no further, however
// often it runs (every process may run it at start while older nodes still run); MigrateTo the
// contract migration's version applies it. A schema being created goes to Version at once.
func TestContractMigrationsRunOnlyWhenNamed(t *testing.T) {
	t.Parallel()
	require.Less(t, durablemigrate.Required, durablemigrate.Version, "this library ends with a contract migration")
	for v := durablemigrate.Required + 1; v <= durablemigrate.Version; v++ {
		require.True(t, durablemigrate.Migrations()[v-1].Contract, "migration %d", v)
	}
	pool := durabledbtest.Pool(t, 2)
	ctx := context.Background()
	schema := fmt.Sprintf("t_migrate_contract_%d", os.Getpid())
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	state := func() durablemigrate.State {
		st, err := durablemigrate.Current(ctx, pool, schema)
		require.NoError(t, err)
		return st
	}

	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, 9))
	for range 2 {
		require.NoError(t, durablemigrate.Migrate(ctx, pool, schema))
		require.Equal(t, durablemigrate.State{Version: durablemigrate.Required, Readers: 11}, state(),
			"Migrate stops before the contract; the library that knows 11 still reads the schema")
	}
	require.NoError(t, durablemigrate.Check(ctx, pool, schema), "this library runs against it")
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version))
	require.Equal(t, durablemigrate.State{Version: durablemigrate.Version, Readers: durablemigrate.Version - 1}, state())
	require.NoError(t, durablemigrate.Migrate(ctx, pool, schema), "nothing to do at Version")
	require.Equal(t, durablemigrate.Version, state().Version)

	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	require.NoError(t, durablemigrate.Migrate(ctx, pool, schema))
	require.Equal(t, durablemigrate.Version, state().Version, "a new schema is built whole")
}

// A step on an existing schema runs in tries under a short lock_timeout: while another session
// holds its locks off (here a transaction that read the instances table and stays open), the
// statements queued behind the step's lock request go through between its tries instead of
// waiting behind it, and after lockTryFor it gives up, naming the session; the schema stays at
// its version. Not parallel: it shortens that wait for the whole package.
func TestAStepWaitingForItsLocksDoesNotStopTheTable(t *testing.T) {
	durablemigrate.SetLockTryFor(t.Cleanup, time.Second)
	pool := durabledbtest.Pool(t, 4)
	ctx := context.Background()
	schema := "t_migrate_lock_tries"
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Required))
	insert := fmt.Sprintf(`INSERT INTO %q.instances (machine, step, queue, status, max_attempts, state, finalized_at)
		VALUES ('m', 's', 'q', 'done', 1, '{}', now())`, schema)

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	var pid int32
	require.NoError(t, holder.QueryRow(ctx, fmt.Sprintf(`SELECT pg_backend_pid() FROM (SELECT count(*) FROM %q.instances) AS n`, schema)).Scan(&pid))

	// A writer inserts all along; the inserts that commit once the step's lock request has
	// been seen waiting, and before the step gives up, got through between its tries.
	stop, wrote := make(chan struct{}), make(chan error, 1)
	var during atomic.Int64
	var counting atomic.Bool
	go func() {
		for {
			select {
			case <-stop:
				wrote <- nil
				return
			default:
			}
			if _, err := pool.Exec(ctx, insert); err != nil {
				wrote <- err
				return
			}
			if counting.Load() {
				during.Add(1)
			}
		}
	}()
	migrated := make(chan error, 1)
	go func() { migrated <- durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version) }()
	for deadline, waiting := time.Now().Add(30*time.Second), 0; waiting == 0; time.Sleep(time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the step's lock request never showed in pg_locks")
		require.NoError(t, holder.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM pg_locks WHERE NOT granted
			AND relation = '%q.instances'::regclass`, schema)).Scan(&waiting))
	}
	counting.Store(true)
	err = <-migrated
	counting.Store(false)
	close(stop)
	require.NoError(t, <-wrote)
	require.ErrorContains(t, err, "could not take its locks")
	require.ErrorContains(t, err, fmt.Sprintf("pid %d (idle in transaction", pid), "the error names the session in the way")
	t.Logf("%d inserts while the step waited: %v", during.Load(), err)
	require.Positive(t, during.Load(), "inserts that went through while the step waited for its locks")
	st, err := durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, durablemigrate.Required, st.Version)

	// Once the session ends, the step takes its locks and applies.
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, durablemigrate.MigrateTo(ctx, pool, schema, durablemigrate.Version))
	st, err = durablemigrate.Current(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, durablemigrate.Version, st.Version)
}
