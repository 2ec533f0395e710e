package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed preload.sql
var preloadSQL string

// preloadStatement returns the statement named name of preload.sql.
func preloadStatement(name string) string {
	_, rest, ok := strings.Cut(preloadSQL, "-- name: "+name+"\n")
	if !ok {
		panic("bench: no statement " + name + " in preload.sql")
	}
	if i := strings.Index(rest, "-- name: "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// preload inserts finished finished rows and live live rows (parked, and scheduled a day ahead)
// of machine in queue into schema, and vacuums and analyzes the table, so that a scenario runs
// with a large table behind its backlog.
func preload(ctx context.Context, pool *pgxpool.Pool, schema string, finished, live int, machine, queue string) error {
	s, err := ident.Schema(schema)
	if err != nil {
		return err
	}
	if finished > 0 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, st := range []struct {
				name string
				args []any
			}{
				{"preload_finished_off", nil},
				{"preload_finished", []any{finished, machine, queue}},
				{"preload_finished_count", []any{finished, queue}},
				{"preload_finished_on", nil},
			} {
				if _, err := tx.Exec(ctx, ident.Expand(preloadStatement(st.name), s), st.args...); err != nil {
					return fmt.Errorf("%s: %w", st.name, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("preload %d finished rows: %w", finished, err)
		}
	}
	if live > 0 {
		if _, err := pool.Exec(ctx, ident.Expand(preloadStatement("preload_live"), s), live, machine+"-live", queue); err != nil {
			return fmt.Errorf("preload %d live rows: %w", live, err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+ident.Quote(s)+".instances"); err != nil {
		return fmt.Errorf("vacuum after preload: %w", err)
	}
	// Flush the set-up's writes now, so that the scenario does not measure the checkpoint that
	// writes them out. A role that may not checkpoint (pg_checkpoint, or a superuser) skips it.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			return fmt.Errorf("checkpoint after preload: %w", err)
		}
	}
	return nil
}
