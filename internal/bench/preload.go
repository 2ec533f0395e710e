package bench

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed preload.sql
var preloadSQL string

// preloadTerminal inserts n finished rows of machine in queue into schema, and analyzes the
// table, so that a scenario runs with a large table behind its backlog.
func preloadTerminal(ctx context.Context, pool *pgxpool.Pool, schema string, n int, machine, queue string) error {
	s, err := ident.Schema(schema)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, ident.Expand(preloadSQL, s), n, machine, queue); err != nil {
		return fmt.Errorf("preload %d rows: %w", n, err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+ident.Quote(s)+".instances"); err != nil {
		return fmt.Errorf("vacuum after preload: %w", err)
	}
	return nil
}
