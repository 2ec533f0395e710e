package chaos

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// openPool opens a pool of at most n connections on dsn, closed when the test ends.
func openPool(t *testing.T, dsn string, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = n
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// privateEnv is newEnv, returning the database's URL too.
func privateEnv(t *testing.T, conns int32) (*env, string) {
	t.Helper()
	e := newEnv(t, conns)
	return e, e.url
}
