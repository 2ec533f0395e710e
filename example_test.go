package gendurable_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The examples (example_*_test.go) run against the tests' Postgres (DATABASE_URL), each in a
// schema of its own that it drops afterwards. The parts between "docs:begin" and "docs:end"
// markers are quoted by the guides in docs/, and TestGuidesQuoteCompiledCode keeps them
// identical; only example files may hold such regions.

// examplePool opens a pool on DATABASE_URL and migrates a schema of the example's own, named
// after it and this process (examples of two checkouts may run at once on one Postgres). The
// pool's search_path is that schema, so that the tables an example creates for its application
// live there too and go with it. The returned func drops the schema and closes the pool.
func examplePool(name string) (*pgxpool.Pool, string, func()) {
	ctx := context.Background()
	schema := fmt.Sprintf("example_%s_%d", name, os.Getpid())
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	_ = durablemigrate.Drop(ctx, pool, schema)
	if err := gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: schema}); err != nil {
		panic(err)
	}
	return pool, schema, func() {
		if err := durablemigrate.Drop(ctx, pool, schema); err != nil {
			panic(err)
		}
		pool.Close()
	}
}
