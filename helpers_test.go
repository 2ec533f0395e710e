package gendurable_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// env is one test's database: a pool and a migrated schema of its own.
type env struct {
	pool   *pgxpool.Pool
	schema string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := durabledbtest.Pool(t, 16)
	return &env{pool: pool, schema: durabledbtest.Schema(t, pool)}
}

// client builds a client in the env's schema; cfg may be nil.
func (e *env) client(t *testing.T, cfg *gendurable.Config) *gendurable.Client {
	t.Helper()
	if cfg == nil {
		cfg = &gendurable.Config{}
	}
	c := *cfg
	c.Schema = e.schema
	cl, err := gendurable.NewClient(e.pool, &c)
	require.NoError(t, err)
	return cl
}

// start starts a client and stops it when the test ends.
func start(t *testing.T, cl *gendurable.Client) {
	t.Helper()
	require.NoError(t, cl.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, cl.Stop(ctx))
	})
}

// count runs a count query with the schema substituted for {schema}.
func (e *env) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(query, e.schema), args...).Scan(&n))
	return n
}

// exec runs a statement with the schema substituted for {schema}.
func (e *env) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), expand(query, e.schema), args...)
	require.NoError(t, err)
}

func expand(q, schema string) string {
	out := []byte{}
	for i := 0; i < len(q); i++ {
		if len(q)-i >= 8 && q[i:i+8] == "{schema}" {
			out = append(out, '"')
			out = append(out, schema...)
			out = append(out, '"')
			i += 7
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

// newDeadlockFreeEnv is newEnv in a database of the test's own (oracle.Database), whose deadlock
// count must be zero when the test ends: read once every connection of the test has closed, it
// misses none and holds no other test's.
func newDeadlockFreeEnv(t *testing.T) *env {
	t.Helper()
	dsn := oracle.Database(t, func(n int64) {
		if n != 0 {
			t.Errorf("the test's database counted %d deadlocks", n)
		}
	})
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &env{pool: pool, schema: durabledbtest.Schema(t, pool)}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
