// Package durablemigrate holds gendurable's schema as numbered migrations (embedded SQL, in
// migrations/) and the migrator that applies them. Version 1 is the schema as it was before
// numbered migrations; every later change is a migration with an up and, where one can exist, a
// down. Migrations are written for rolling deploys (migrations/README.md): a schema migrated to
// version N still runs the library that knows version N−1, so a fleet is migrated first and then
// redeployed node by node.
package durablemigrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var files embed.FS

// baseFingerprint names the text version 1 was built from. It is recorded in every schema, and a
// schema that records another one was built from a text that predates numbered migrations.
const baseFingerprint = "948a9c3ec7b4ad46db3d1f6eb48c46ec8f2a5e0c2ef925cfcd2b68862dc6c262"

// Migration is one numbered schema change.
type Migration struct {
	// Version is the schema version the migration's up brings a schema to.
	Version int
	// Name says what the migration does (its file name without the number and suffix).
	Name string
	// Readers is the oldest library that runs against a schema at Version: the newest schema
	// version such a library knows. By the rolling-deploy rule it is Version−1 (the library
	// before keeps working), unless the migration's up says "-- readers: N".
	Readers int
	// Contract says the migration only removes what libraries that know the version before it
	// no longer use (its up says "-- contract"): such a library runs with or without it, and
	// Migrate applies it to an existing schema only when asked for by version (see
	// DefaultTarget).
	Contract bool
	up       string
	down     string
	// pre are index builds (CREATE INDEX CONCURRENTLY IF NOT EXISTS, from NNN_name.pre.sql) that
	// come before the up: on an existing schema the migrator builds them concurrently, outside a
	// transaction, so that writers are never blocked for the build; otherwise they run plainly in
	// the up's transaction.
	pre []string
}

// HasDown reports whether the migration can be undone (version 1 cannot: drop the schema).
func (m Migration) HasDown() bool { return m.down != "" }

// Up returns the migration's up SQL for schema ("" is the default schema).
func (m Migration) Up(schema string) (string, error) { return expand(m.up, schema) }

// Down returns the migration's down SQL for schema ("" is the default schema), or an error if it
// has none.
func (m Migration) Down(schema string) (string, error) {
	if m.down == "" {
		return "", fmt.Errorf("gendurable: schema version %d (%s) has no down migration", m.Version, m.Name)
	}
	return expand(m.down, schema)
}

func expand(text, schema string) (string, error) {
	s, err := ident.Schema(schema)
	if err != nil {
		return "", err
	}
	return ident.Expand(text, s), nil
}

var migrations = mustLoad(files)

// Version is the newest schema version this library knows, and the one Migrate brings a schema
// to. A client of this library starts against a schema at Version, or at a later version whose
// Readers allow it (a fleet migrated ahead of its deploy).
var Version = migrations[len(migrations)-1].Version

// Required is the oldest schema version this library runs against: Version, less the contract
// migrations it ends with (this library no longer uses what they remove).
var Required = required(migrations)

func required(ms []Migration) int {
	v := len(ms)
	for v > 1 && ms[v-1].Contract {
		v--
	}
	return ms[v-1].Version
}

// DefaultTarget is the version Migrate brings a schema at version current to when no target is
// given: a schema being created (current 0) is built whole, to Version; an existing one is brought
// to Required at most, never through the contract migrations this library ends with. Those remove
// what the library before this one reads, so they run only when asked for by their version
// (MigrateTo, `gendurable migrate --target`), once every node runs this library: a Migrate that
// every process runs at start stays safe while nodes of the previous library still run. (A
// contract migration below Required, an earlier library's, is applied on the way: it removes
// only what libraries older than the previous one read.)
func DefaultTarget(current int) int {
	switch {
	case current == 0:
		return Version
	case current < Required:
		return Required
	default:
		return min(current, Version)
	}
}

// Migrations returns every migration, oldest first.
func Migrations() []Migration { return slices.Clone(migrations) }

var fileRE = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down|pre)\.sql$`)

// preRE is the one statement a pre file may hold, one or more times: a concurrent index build
// that can be run again.
var preRE = regexp.MustCompile(`(?s)^CREATE INDEX CONCURRENTLY IF NOT EXISTS ([a-z0-9_]+) ON .+$`)
var readersRE = regexp.MustCompile(`(?m)^-- readers: (\d+)$`)

// contractRE marks a contract migration (Migration.Contract).
var contractRE = regexp.MustCompile(`(?m)^-- contract$`)

// mustLoad reads the migrations folder: NNN_name.up.sql and, optionally, NNN_name.down.sql,
// numbered from 1 without gaps. A malformed folder is a bug in this package: it panics.
func mustLoad(fsys fs.FS) []Migration {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		panic(err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			panic("durablemigrate: unexpected file migrations/" + e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(fsys, "migrations/"+e.Name())
		if err != nil {
			panic(err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2], Readers: max(v-1, 1)}
			byVersion[v] = mig
		}
		if mig.Name != m[2] {
			panic(fmt.Sprintf("durablemigrate: version %d has two names, %s and %s", v, mig.Name, m[2]))
		}
		switch m[3] {
		case "up":
			mig.up = string(b)
			if r := readersRE.FindStringSubmatch(mig.up); r != nil {
				mig.Readers, _ = strconv.Atoi(r[1])
			}
			mig.Contract = contractRE.MatchString(mig.up)
		case "down":
			mig.down = string(b)
		default:
			mig.pre = splitPre(e.Name(), string(b))
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for v := 1; v <= len(byVersion); v++ {
		mig := byVersion[v]
		if mig == nil || mig.up == "" {
			panic(fmt.Sprintf("durablemigrate: migration %d is missing (or has no up)", v))
		}
		if mig.Readers < 1 || mig.Readers > v {
			panic(fmt.Sprintf("durablemigrate: migration %d: readers %d is not a version from 1 to %d", v, mig.Readers, v))
		}
		out = append(out, *mig)
	}
	return out
}

// splitPre splits a pre file into its statements (each ends with ";" at the end of a line;
// comment lines are dropped). Anything but a concurrent index build is a bug: it panics.
func splitPre(name, text string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") || strings.TrimSpace(line) == "" {
			continue
		}
		cur.WriteString(line + "\n")
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			stmt := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
			if !preRE.MatchString(stmt) {
				panic("durablemigrate: migrations/" + name + ": not a CREATE INDEX CONCURRENTLY IF NOT EXISTS: " + stmt)
			}
			out = append(out, stmt)
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		panic("durablemigrate: migrations/" + name + ": a statement without its ';'")
	}
	return out
}

// inTx is a pre statement as it runs inside the up's transaction: a plain index build.
func inTx(stmt string) string {
	return strings.Replace(stmt, "CREATE INDEX CONCURRENTLY IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS", 1)
}

// DB is what the migrator needs: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// State is a schema's migration state.
type State struct {
	// Version is the schema's version; 0 for a schema that does not exist or has no gendurable
	// tables.
	Version int
	// Readers is the oldest library that runs against it (see Migration.Readers).
	Readers int
}

// VersionError is a schema at a version this library cannot run against. It matches
// ErrSchemaMismatch.
type VersionError struct {
	Schema string
	// Have is the schema's version; Readers the oldest library that runs against it.
	Have, Readers int
	// Library is the newest schema version this library knows (Version); Required the oldest it
	// runs against (Required).
	Library, Required int
}

func (e *VersionError) Error() string {
	if e.Have < e.Required {
		return fmt.Sprintf("gendurable: schema %q is at version %d, older than this library's %d: migrate it first "+
			"(gendurable migrate --schema %s, or gendurable.Migrate)", e.Schema, e.Have, e.Required, e.Schema)
	}
	return fmt.Sprintf("gendurable: schema %q is at version %d, which needs a library that knows schema version %d or later; "+
		"this library knows up to %d: upgrade gendurable (or migrate the schema down: gendurable migrate --schema %s --target %d)",
		e.Schema, e.Have, e.Readers, e.Library, e.Schema, e.Library)
}

// Is makes a VersionError match ErrSchemaMismatch.
func (e *VersionError) Is(target error) bool { return target == durabletype.ErrSchemaMismatch }

// Check returns nil if this library can run against the schema: at Required or later, with
// Readers at most Version. It returns ErrNotMigrated if the schema does not exist, a
// *VersionError for a version it cannot run against, and ErrSchemaMismatch for a schema built
// from a text that predates numbered migrations.
func Check(ctx context.Context, db DB, schema string) error {
	schema, err := ident.Schema(schema)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("gendurable: check schema %s: %w", schema, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	st, err := readState(ctx, tx, schema)
	if err != nil {
		return err
	}
	return st.Check(schema)
}

// Check returns nil if this library can run against schema in state s, as Check does for the
// schema as it stands (a running client checks the state its registry refreshes read).
func (s State) Check(schema string) error {
	if s.Version == 0 {
		return fmt.Errorf("%w: schema %q (run gendurable.Migrate or `gendurable migrate`)", durabletype.ErrNotMigrated, schema)
	}
	if s.Version < Required || s.Readers > Version {
		return &VersionError{Schema: schema, Have: s.Version, Readers: s.Readers, Library: Version, Required: Required}
	}
	return nil
}

// Current returns the schema's migration state.
func Current(ctx context.Context, db DB, schema string) (State, error) {
	schema, err := ident.Schema(schema)
	if err != nil {
		return State{}, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return State{}, fmt.Errorf("gendurable: read schema %s: %w", schema, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return readState(ctx, tx, schema)
}

// Step is one migration to apply: its up, or (Down) its down.
type Step struct {
	Migration
	Down bool
}

// SQL returns the step's SQL for schema, followed by the statement that records the schema's
// new version, as the migrator runs it in one transaction.
//
// An up's index builds come first, as plain CREATE INDEX statements; `gendurable migrate` builds
// them concurrently (outside a transaction, writers never blocked) on a schema that exists.
func (s Step) SQL(schema string) (string, error) {
	sql, err := s.Up(schema)
	if s.Down {
		sql, err = s.Migration.Down(schema)
	} else if err == nil && len(s.pre) > 0 {
		var b strings.Builder
		for _, p := range s.pre {
			e, err := expand(inTx(p), schema)
			if err != nil {
				return "", err
			}
			b.WriteString(e + ";\n")
		}
		sql = b.String() + sql
	}
	if err != nil {
		return "", err
	}
	to := s.Version
	if s.Down {
		to = s.Version - 1
	}
	return strings.TrimRight(sql, "\n") + "\n\n" + recordVersion(schema, to) + ";\n", nil
}

// Plan returns the steps that take a schema at version from to version to, in order.
func Plan(from, to int) ([]Step, error) {
	if to < 1 || to > Version {
		return nil, fmt.Errorf("gendurable: target version %d: this library knows versions 1 to %d", to, Version)
	}
	if from > Version {
		return nil, fmt.Errorf("gendurable: the schema is at version %d, newer than this library knows (%d): "+
			"migrate it with the library that migrated it", from, Version)
	}
	var steps []Step
	for v := from + 1; v <= to; v++ {
		steps = append(steps, Step{Migration: migrations[v-1]})
	}
	for v := from; v > to; v-- {
		m := migrations[v-1]
		if !m.HasDown() {
			return nil, fmt.Errorf("gendurable: schema version %d (%s) has no down migration", v, m.Name)
		}
		steps = append(steps, Step{Migration: m, Down: true})
	}
	return steps, nil
}

// SQL returns the SQL that builds schema ("" is the default) from nothing to Version, ready to run
// by hand or by another migration tool; it records the version as Migrate does.
func SQL(schema string) (string, error) {
	steps, err := Plan(0, Version)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, s := range steps {
		sql, err := s.SQL(schema)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "-- gendurable schema version %d: %s\n%s\n", s.Version, s.Name, sql)
	}
	return b.String(), nil
}

// recordVersion is the statement that records a schema's version (0 removes nothing: the schema
// is gone with version 1's down, which does not exist).
func recordVersion(schema string, version int) string {
	readers := 1
	if version >= 1 {
		readers = migrations[version-1].Readers
	}
	return fmt.Sprintf("INSERT INTO %s.meta (key, value) VALUES ('version', '%d'), ('readers', '%d'), ('fingerprint', '%s')\n"+
		"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
		ident.Quote(schema), version, readers, baseFingerprint)
}

// Migrate brings the schema to DefaultTarget: it creates it at Version if it does not exist, and
// brings an existing one up to Required, never through a contract migration. See MigrateTo.
func Migrate(ctx context.Context, db DB, schema string) error {
	st, err := Current(ctx, db, schema)
	if err != nil {
		return err
	}
	return MigrateTo(ctx, db, schema, DefaultTarget(st.Version))
}

// MigrateTo migrates the schema up or down to target, one version per transaction: each step
// takes a transaction-scoped advisory lock keyed by the schema name, reads the schema's version,
// applies the next step towards target and records the new version, so that concurrent callers
// serialize and each sees the others' work. A schema that does not exist is created at target in
// one such transaction, its indexes built plainly: it has no rows and no writers, and nothing of
// it shows before it is whole. A schema newer than this library knows is left alone
// when target is Version (a fleet migrated ahead of its deploy) and refused otherwise.
//
// A step on an existing schema runs in tries, each under a short lock_timeout, so that the
// statements of a running fleet never queue for long behind a lock request another session
// holds off; it gives up after a minute of tries, naming the sessions in the way.
//
// On a pool or a connection the run turns the session's statement_timeout off (a role's timeout
// would cancel an index build on a large table) and sets it back after: ctx bounds the run. In a
// caller's transaction the caller's settings apply.
func MigrateTo(ctx context.Context, db DB, schema string, target int) error {
	schema, err := ident.Schema(schema)
	if err != nil {
		return err
	}
	if target < 1 || target > Version {
		return fmt.Errorf("gendurable: migrate %s: target version %d: this library knows versions 1 to %d", schema, target, Version)
	}
	// On a pool or a connection, the migrator holds a session lock on the schema's name for the
	// whole run, so that it can build indexes concurrently between steps (outside any
	// transaction). It waits for that lock by polling, never in a transaction: a migrator that
	// waited inside one would hold a snapshot, and a concurrent index build waits for every
	// older snapshot to go.
	sess, release, err := session(ctx, db)
	if err != nil {
		return fmt.Errorf("gendurable: migrate %s: %w", schema, err)
	}
	if sess != nil {
		defer release()
		restore, err := liftStatementTimeout(ctx, sess)
		if err != nil {
			return fmt.Errorf("gendurable: migrate %s: %w", schema, err)
		}
		defer restore()
		if err := lockSession(ctx, sess, schema); err != nil {
			return fmt.Errorf("gendurable: migrate %s: lock: %w", schema, err)
		}
		defer func() {
			_, _ = sess.Exec(context.WithoutCancel(ctx), "SELECT pg_catalog.pg_advisory_unlock("+lockKey+")", schema)
		}()
		db = sess
	}
	for {
		if sess != nil {
			if err := buildConcurrently(ctx, sess, schema, target); err != nil {
				return err
			}
		}
		done, err := migrateStep(ctx, db, schema, target)
		if err != nil || done {
			return err
		}
	}
}

// lockKey is the advisory lock of a schema's migrators ($1 the schema's name).
const lockKey = "pg_catalog.hashtextextended('gendurable.migrate:' || $1, 0)"

// sessionDB is a connection: the migrator's own, for a run under a session lock.
type sessionDB interface {
	DB
	execer
}

// session returns the connection a run holds its session lock on: one of the pool's, or the
// connection itself; nil for a transaction (whose caller owns it: no session lock, and every
// index is built in the steps' transactions).
func session(ctx context.Context, db DB) (sessionDB, func(), error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		c, err := d.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return c, c.Release, nil
	case *pgx.Conn:
		return d, func() {}, nil
	}
	return nil, nil, nil
}

// liftStatementTimeout turns the session's statement_timeout off for the run and returns what
// sets it back to the session's default. A role's timeout (often seconds) is shorter than an
// index build on a large table, or a step's wait for its lock: cancelled, the build leaves an
// invalid index and the run fails, and every run after it the same. The caller's context bounds
// the run instead; lock_timeout is left as the role has it. A pool's connection whose reset
// fails is closed, so that the pool never hands out a session without the timeout.
func liftStatementTimeout(ctx context.Context, sess sessionDB) (func(), error) {
	if _, err := sess.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		return nil, fmt.Errorf("lift statement_timeout for the run: %w", err)
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := sess.Exec(rctx, "RESET statement_timeout"); err != nil {
			if c, ok := sess.(*pgxpool.Conn); ok {
				_ = c.Conn().Close(rctx)
			}
		}
	}, nil
}

// lockSession takes the schema's migration lock for the session, polling.
func lockSession(ctx context.Context, c execer, schema string) error {
	for {
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_catalog.pg_try_advisory_lock("+lockKey+")", schema).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// execer is a DB that runs a statement outside a transaction (a pool or a connection, not a
// pgx.Tx).
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// buildConcurrently builds the index builds of the next step, if it is an up that has them and
// the schema exists, concurrently and outside a transaction, on the migrator's session (which
// holds the schema's lock): an index on a large table is built without blocking its writers. An
// invalid index a failed build left is dropped and built again. The step's transaction then
// finds them built (IF NOT EXISTS).
func buildConcurrently(ctx context.Context, ex sessionDB, schema string, target int) error {
	st, err := Current(ctx, ex, schema)
	if err != nil || st.Version < 1 || st.Version >= target || st.Version >= Version {
		return err
	}
	for _, stmt := range migrations[st.Version].pre {
		name := preRE.FindStringSubmatch(stmt)[1]
		var invalid bool
		err := ex.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
			JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2 AND NOT i.indisvalid)`, schema, name).Scan(&invalid)
		if err != nil {
			return fmt.Errorf("gendurable: migrate %s: check index %s: %w", schema, name, err)
		}
		if invalid {
			if _, err := ex.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+ident.Quote(schema)+"."+ident.Quote(name)); err != nil {
				return fmt.Errorf("gendurable: migrate %s: drop the invalid index %s: %w", schema, name, err)
			}
		}
		sql, err := expand(stmt, schema)
		if err != nil {
			return err
		}
		if _, err := ex.Exec(ctx, sql); err != nil {
			return fmt.Errorf("gendurable: migrate %s: version %d (%s): build index %s: %w", schema, st.Version+1,
				migrations[st.Version].Name, name, err)
		}
	}
	return nil
}

// migrateStep applies the next step towards target in one transaction (every step, to a schema
// that does not exist); done says there was none.
func migrateStep(ctx context.Context, db DB, schema string, target int) (done bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("gendurable: migrate %s: begin: %w", schema, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Serialize concurrent migrators of this schema (a lock on a hash, held until commit).
	if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock("+lockKey+")", schema); err != nil {
		return false, fmt.Errorf("gendurable: migrate %s: lock: %w", schema, err)
	}
	st, err := readState(ctx, tx, schema)
	if err != nil {
		return false, err
	}
	if st.Version == target || (st.Version > Version && target == Version) {
		return true, tx.Commit(ctx)
	}
	steps, err := Plan(st.Version, target)
	if err != nil {
		return false, fmt.Errorf("gendurable: migrate %s: %w", schema, err)
	}
	// A schema that does not exist yet is created whole in this transaction (see MigrateTo).
	if st.Version > 0 {
		steps = steps[:1]
	}
	for _, step := range steps {
		sql, err := step.SQL(schema)
		if err != nil {
			return false, err
		}
		if st.Version > 0 {
			err = applyInTries(ctx, tx, schema, sql)
		} else {
			_, err = tx.Exec(ctx, sql)
		}
		if err != nil {
			dir := "up"
			if step.Down {
				dir = "down"
			}
			return false, fmt.Errorf("gendurable: migrate %s: version %d (%s) %s: %w", schema, step.Version, step.Name, dir, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("gendurable: migrate %s: commit version %d: %w", schema, steps[len(steps)-1].Version, err)
	}
	return false, nil
}

// How a step on an existing schema waits for its locks (applyInTries): lockTry is the first
// try's lock_timeout, each later one doubles up to lockTryMax (above Postgres's default
// deadlock_timeout of a second, after which a lock wait cancels an autovacuum in its way),
// between two the migrator steps aside for as long again, and it gives up after lockTryFor (a
// variable for the tests).
const (
	lockTry    = 100 * time.Millisecond
	lockTryMax = 2 * time.Second
)

var lockTryFor = time.Minute

// SQLSTATEs a try may end in and be tried again: lock_not_available (its lock_timeout ran out)
// and deadlock_detected (with a transaction of the fleet, which then goes on).
const (
	pgLockNotAvailable = "55P03"
	pgDeadlock         = "40P01"
)

// fileLockTimeout is the lock_timeout a migration file sets for its step, for the printed SQL
// (--print, for your own migration tool); applyInTries sets its own instead.
var fileLockTimeout = regexp.MustCompile(`(?m)^SET LOCAL lock_timeout = '[^']*';$`)

// applyInTries applies a step's sql to an existing schema in tx, in tries.
//
// Locks: the step's statements take the locks their DDL needs on the tables they change (ACCESS
// EXCLUSIVE for ALTER TABLE and DROP INDEX, weaker ones for CREATE TRIGGER and CREATE INDEX). A
// lock request that waits makes every later statement on its table wait behind it: a step that
// waited for a long transaction, a report reading the instances table, say, would stop the whole
// fleet for as long. So each try runs the step in a savepoint under a short lock_timeout; a try
// that times out (or deadlocks) rolls back to it, the migrator steps aside so that the queued
// statements go through, and tries again, for up to lockTryFor; then it fails, naming the
// sessions in the way. A try is one round trip, and so is a failed one's rollback.
func applyInTries(ctx context.Context, tx pgx.Tx, schema, sql string) error {
	sql = fileLockTimeout.ReplaceAllString(sql, "")
	began, wait := time.Now(), lockTry
	for {
		_, err := tx.Exec(ctx, fmt.Sprintf("SAVEPOINT gd_try; SET LOCAL lock_timeout = %d;\n%s\nRELEASE SAVEPOINT gd_try",
			wait.Milliseconds(), sql))
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != pgLockNotAvailable && pgErr.Code != pgDeadlock) {
			return err
		}
		if _, rerr := tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT gd_try; RELEASE SAVEPOINT gd_try"); rerr != nil {
			return errors.Join(err, rerr)
		}
		if time.Since(began) >= lockTryFor {
			return fmt.Errorf("could not take its locks within %v, a try of at most %v at a time; in the way: %s; "+
				"migrate again once they end (or end them: SELECT pg_terminate_backend(pid)): %w",
				lockTryFor, lockTryMax, lockHolders(ctx, tx, schema, wait), err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		}
		wait = min(2*wait, lockTryMax)
	}
}

// lockHolders names, for an error, the other sessions that hold locks on relations of schema in
// transactions begun before the last try, which waited for wait (not those that came and went),
// the oldest first.
func lockHolders(ctx context.Context, tx pgx.Tx, schema string, wait time.Duration) string {
	rows, err := tx.Query(context.WithoutCancel(ctx), `SELECT a.pid, coalesce(a.state, ''),
		       extract(epoch FROM pg_catalog.clock_timestamp() - a.xact_start)::float8, left(a.query, 80)
		FROM pg_catalog.pg_stat_activity a
		WHERE a.xact_start < pg_catalog.clock_timestamp() - $2 * interval '1 millisecond'
		  AND a.pid <> pg_catalog.pg_backend_pid() AND EXISTS (
		  SELECT 1 FROM pg_catalog.pg_locks l
		  JOIN pg_catalog.pg_class c ON c.oid = l.relation JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		  WHERE l.pid = a.pid AND l.granted AND n.nspname = $1)
		ORDER BY a.xact_start LIMIT 5`, schema, wait.Milliseconds())
	if err != nil {
		return "(could not read pg_locks: " + err.Error() + ")"
	}
	var held []string
	var pid int32
	var state, query string
	var secs float64
	_, err = pgx.ForEachRow(rows, []any{&pid, &state, &secs, &query}, func() error {
		held = append(held, fmt.Sprintf("pid %d (%s, in a transaction for %.0fs: %q)", pid, state, secs, query))
		return nil
	})
	if err != nil {
		return "(could not read pg_locks: " + err.Error() + ")"
	}
	if len(held) == 0 {
		return "no session holds the schema's tables now"
	}
	return strings.Join(held, ", ")
}

// Drop removes the schema and everything in it. Tests and the demo use it to clean up.
func Drop(ctx context.Context, db DB, schema string) error {
	schema, err := ident.Schema(schema)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident.Quote(schema)+" CASCADE"); err != nil {
		return fmt.Errorf("gendurable: drop schema %s: %w", schema, err)
	}
	return tx.Commit(ctx)
}

// readState reads the schema's meta rows. A schema whose fingerprint is not version 1's was built
// from a text that predates numbered migrations: ErrSchemaMismatch, with the way out.
func readState(ctx context.Context, tx pgx.Tx, schema string) (State, error) {
	var exists bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (
		SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'meta')`, schema).Scan(&exists)
	if err != nil {
		return State{}, fmt.Errorf("gendurable: read schema %s: %w", schema, err)
	}
	if !exists {
		return State{}, nil
	}
	rows, err := tx.Query(ctx, "SELECT key, value FROM "+ident.Quote(schema)+".meta")
	if err != nil {
		return State{}, fmt.Errorf("gendurable: read schema %s: %w", schema, err)
	}
	meta := map[string]string{}
	var k, v string
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { meta[k] = v; return nil }); err != nil {
		return State{}, fmt.Errorf("gendurable: read schema %s: %w", schema, err)
	}
	if meta["fingerprint"] != baseFingerprint {
		return State{}, fmt.Errorf("%w: schema %q was built from a schema text older than numbered migrations "+
			"(fingerprint %.12q): drop it (DROP SCHEMA %s CASCADE) and migrate again",
			durabletype.ErrSchemaMismatch, schema, meta["fingerprint"], ident.Quote(schema))
	}
	st := State{Readers: 1}
	if st.Version, err = strconv.Atoi(meta["version"]); err != nil || st.Version < 1 {
		return State{}, fmt.Errorf("%w: schema %q records version %q", durabletype.ErrSchemaMismatch, schema, meta["version"])
	}
	if r, ok := meta["readers"]; ok {
		if st.Readers, err = strconv.Atoi(r); err != nil {
			return State{}, fmt.Errorf("%w: schema %q records readers %q", durabletype.ErrSchemaMismatch, schema, r)
		}
	}
	return st, nil
}
