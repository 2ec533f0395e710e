// Package durablemigrate holds gendurable's schema (embedded SQL) and the migrator that applies
// it. There is one schema version; pre-1.0 it is edited in place, so a schema built from an
// older text is refused with ErrSchemaMismatch rather than silently used.
package durablemigrate

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5"
)

//go:embed sql/v1.sql
var v1 string

// Version is the schema version this package builds.
const Version = 1

// DB is what Migrate needs: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Fingerprint identifies the exact DDL text this package applies.
func Fingerprint() string {
	sum := sha256.Sum256([]byte(v1))
	return hex.EncodeToString(sum[:])
}

// SQL returns the DDL for the given schema ("" means the default), ready to run by hand or by
// another migration tool. It ends by recording the version and fingerprint, as Migrate does.
func SQL(schema string) (string, error) {
	schema, err := ident.Schema(schema)
	if err != nil {
		return "", err
	}
	return ident.Expand(v1, schema) + "\n" + metaInsert(schema) + ";\n", nil
}

func metaInsert(schema string) string {
	return fmt.Sprintf("INSERT INTO %s.meta (key, value) VALUES ('version', '%d'), ('fingerprint', '%s')",
		ident.Quote(schema), Version, Fingerprint())
}

// Migrate creates the schema if it does not exist and checks it if it does. It is idempotent
// and safe to call from many processes at once: callers serialize on a transaction-scoped
// advisory lock keyed by the schema name, and the whole DDL commits or none of it.
func Migrate(ctx context.Context, db DB, schema string) error {
	schema, err := ident.Schema(schema)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("gendurable: migrate %s: begin: %w", schema, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// Serialize concurrent migrators of this schema (a lock on a hash, held until commit).
	if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('gendurable.migrate:' || $1, 0))", schema); err != nil {
		return fmt.Errorf("gendurable: migrate %s: lock: %w", schema, err)
	}
	fp, found, err := readFingerprint(ctx, tx, schema)
	if err != nil {
		return err
	}
	if found {
		if fp != Fingerprint() {
			return fmt.Errorf("%w: schema %q has fingerprint %.12s, this build expects %.12s; "+
				"pre-1.0 the schema is edited in place: drop it (DROP SCHEMA %s CASCADE) and migrate again",
				durabletype.ErrSchemaMismatch, schema, fp, Fingerprint(), ident.Quote(schema))
		}
		return tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, ident.Expand(v1, schema)); err != nil {
		return fmt.Errorf("gendurable: migrate %s: %w", schema, err)
	}
	if _, err := tx.Exec(ctx, metaInsert(schema)); err != nil {
		return fmt.Errorf("gendurable: migrate %s: record version: %w", schema, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("gendurable: migrate %s: commit: %w", schema, err)
	}
	return nil
}

// Check returns nil if the schema exists and was built by this version, ErrNotMigrated if it
// does not exist, and ErrSchemaMismatch if it was built from another text.
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
	fp, found, err := readFingerprint(ctx, tx, schema)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: schema %q (run gendurable.Migrate or `gendurable migrate`)", durabletype.ErrNotMigrated, schema)
	}
	if fp != Fingerprint() {
		return fmt.Errorf("%w: schema %q; drop it and migrate again", durabletype.ErrSchemaMismatch, schema)
	}
	return nil
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

func readFingerprint(ctx context.Context, tx pgx.Tx, schema string) (string, bool, error) {
	var exists bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (
		SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'meta')`, schema).Scan(&exists)
	if err != nil {
		return "", false, fmt.Errorf("gendurable: read schema %s: %w", schema, err)
	}
	if !exists {
		return "", false, nil
	}
	var fp string
	err = tx.QueryRow(ctx, "SELECT value FROM "+ident.Quote(schema)+".meta WHERE key = 'fingerprint'").Scan(&fp)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", true, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("gendurable: read schema %s: %w", schema, err)
	}
	return fp, true, nil
}
