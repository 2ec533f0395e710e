package chaos

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// heavy serializes the tests that start a crowd of worker processes (the races' stress tests):
// each holds a few dozen connections of the tests' Postgres (max_connections 100 by default).
var heavy sync.Mutex

// env is one test's database, a database of its own (privateDatabase): a pool, a migrated
// schema with the oracle installed, and a second pool for effects and probes (a step's effect
// must not wait for an engine connection).
type env struct {
	url    string // the database's URL, for worker processes
	pool   *pgxpool.Pool
	side   *pgxpool.Pool
	schema string
	// wantDeadlocks is how many deadlocks the test provokes on purpose (I8 wants the database's
	// count to be exactly that; 0 for every test but the metric's negative control).
	wantDeadlocks int64
	// summary is the chaos-summary line check or verdict filled, reported once the deadlock
	// count is known (when the test's connections have closed).
	summary *oracle.Summary
	started time.Time
}

func newEnv(t *testing.T, conns int32) *env {
	t.Helper()
	e := &env{started: time.Now()}
	e.url = oracle.Database(t, func(n int64) { e.judgeDeadlocks(t, n) })
	e.pool, e.side = openPool(t, e.url, conns), openPool(t, e.url, 6)
	e.schema = durabledbtest.Schema(t, e.pool)
	require.NoError(t, oracle.Install(context.Background(), e.pool, e.schema))
	return e
}

// judgeDeadlocks is I8, once the test's connections have closed: the database counted exactly
// the deadlocks the test provoked. It reports the summary line check or verdict filled.
func (e *env) judgeDeadlocks(t *testing.T, n int64) {
	if e.summary != nil {
		s := *e.summary
		s.Deadlocks = int(n - e.wantDeadlocks)
		oracle.Report(t, s)
	}
	if n != e.wantDeadlocks {
		t.Errorf("I8 no deadlocks: the test's database counted %d, the test provoked %d", n, e.wantDeadlocks)
	}
}

// q substitutes the quoted schema for {schema}.
func (e *env) q(query string) string { return expand(query, e.schema) }

// expand substitutes the quoted schema for {schema}.
func expand(query, schema string) string {
	return strings.ReplaceAll(query, "{schema}", pgx.Identifier{schema}.Sanitize())
}

func (e *env) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(query), args...).Scan(&n))
	return n
}

func (e *env) exec(t testing.TB, query string, args ...any) {
	t.Helper()
	_, err := e.side.Exec(context.Background(), e.q(query), args...)
	require.NoError(t, err)
}

// client builds a client in the env's schema (cfg may be nil).
func (e *env) client(t testing.TB, cfg *gendurable.Config) *gendurable.Client {
	t.Helper()
	c := gendurable.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = e.schema
	cl, err := gendurable.NewClient(e.pool, &c)
	require.NoError(t, err)
	return cl
}

// start starts cl and returns its stop; the test's cleanup stops it too (stopping twice is
// harmless).
func start(t testing.TB, cl *gendurable.Client) (stop func()) {
	t.Helper()
	require.NoError(t, cl.Start(context.Background()))
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		require.NoError(t, cl.Stop(ctx))
	}
	t.Cleanup(stop)
	return stop
}

// eventually polls cond every few milliseconds until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := 5 * time.Millisecond; !cond(); wait = min(2*wait, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(wait)
	}
}

// check runs the oracle's invariants and reports the test's summary line; any violation fails
// the test.
func (e *env) check(t *testing.T, o oracle.Opts, s oracle.Summary) {
	t.Helper()
	ctx := context.Background()
	v, err := oracle.Check(ctx, e.pool, e.schema, o)
	require.NoError(t, err)
	s.Test = t.Name()
	s.Violations = len(v)
	s.Seconds = time.Since(e.started).Seconds()
	for _, x := range v {
		switch {
		case strings.HasPrefix(x.Invariant, "I1"):
			s.Lost++
		case strings.HasPrefix(x.Invariant, "I2 one"):
			s.DuplicateTerminal++
		}
	}
	e.summary = &s // reported with I8, when the test ends
	require.Empty(t, v, "oracle violations")
}

func (e *env) lockWaits(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, e.side.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, e.schema).Scan(&n))
	return n
}

// stranded counts parked instances that have an unconsumed signal they await: a lost wakeup.
func (e *env) stranded(t testing.TB) int {
	return e.count(t, `SELECT count(*) FROM {schema}.instances i WHERE status = 'awaiting'
		AND EXISTS (SELECT 1 FROM {schema}.signals s WHERE s.instance_id = i.id AND s.name = ANY(i.await_names))`)
}

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
