package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func countByStatus(ctx context.Context, pool *pgxpool.Pool, schema string) (map[gendurable.Status]int64, error) {
	st, err := store.New(schema)
	if err != nil {
		return nil, err
	}
	return st.CountByStatus(ctx, pool, "")
}

type reason struct {
	reason string
	n      int64
}

func failureReasons(ctx context.Context, pool *pgxpool.Pool, schema string) ([]reason, error) {
	st, err := store.New(schema)
	if err != nil {
		return nil, err
	}
	rs, err := st.FailureReasons(ctx, pool)
	if err != nil {
		return nil, err
	}
	out := make([]reason, len(rs))
	for i, r := range rs {
		out[i] = reason{r.Reason, r.Count}
	}
	return out, nil
}
