// Command redispoke-bench measures pickup across nodes through Redis: gendurable's
// latency-remote benchmark scenario (a client that works no queue inserts one instance every
// 5 ms; a worker client on a pool of its own starts it), with both clients on the Redis poke
// transport instead of PokePostgres.
//
//	go run ./cmd/redispoke-bench [--database-url URL] [--redis 127.0.0.1:6379] [--n 500] [--json]
//
// It recreates and drops its schema (--schema, default gendurable_bench), like `gendurable bench`.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/contrib/redispoke"
	"github.com/gendurable/gendurable/internal/bench"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "redispoke-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("redispoke-bench", flag.ContinueOnError)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "the Postgres to measure (default $DATABASE_URL, else 127.0.0.1:5432, else a throwaway cluster)")
	schema := fs.String("schema", "gendurable_bench", "the schema the scenario recreates and drops")
	addr := fs.String("redis", "127.0.0.1:6379", "the Redis server's address")
	n := fs.Int("n", 0, "inserts measured (default the scenario's)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		// As `gendurable bench`: DATABASE_URL, else 127.0.0.1:5432, else a throwaway cluster.
		db, err := devdb.Resolve(ctx, devdb.Options{Log: os.Stderr})
		if err != nil {
			return err
		}
		defer func() { _ = db.Close() }()
		*url = db.URL
	}
	cfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		return fmt.Errorf("database url: %w", err)
	}
	// The pool `gendurable bench` measures latency-remote with: at least 20 connections.
	cfg.MaxConns = max(cfg.MaxConns, 20)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	err = rdb.Ping(ctx).Err()
	_ = rdb.Close()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", *addr, err)
	}
	opts := bench.Options{Schema: *schema, Scenarios: []string{"latency-remote"}, N: *n,
		Poke:   func() gendurable.PokeTransport { return redispoke.New(&redis.Options{Addr: *addr}) },
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	var results []bench.Result
	err = bench.Run(ctx, pool, opts, func(r bench.Result) {
		if *asJSON {
			_ = bench.WriteJSON(out, r)
		}
		results = append(results, r)
	})
	if !*asJSON {
		bench.WriteTable(out, results)
	}
	return err
}
