package races

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if role := os.Getenv("GD_RACES_HELPER"); role != "" {
		// The test binary re-executed as a worker process.
		os.Exit(helperMain(role))
	}
	durabledbtest.Main(m)
}

// heavy serializes the tests that start worker processes: each holds a few dozen connections,
// and the tests' Postgres (max_connections 100 by default) is shared with every other package's
// tests.
var heavy sync.Mutex

// full says whether to run the reliability plan's full sizes (GD_CHAOS=full) instead of CI's.
func full() bool { return os.Getenv("GD_CHAOS") == "full" }

// size picks the CI or the full size.
func size(ci, fullSize int) int {
	if full() {
		return fullSize
	}
	return ci
}

// seedOf returns the test's seed (GD_SEED, else the time) and logs it for a replay.
func seedOf(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GD_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "GD_SEED")
		seed = v
	}
	t.Logf("seed=%d (replay: GD_SEED=%d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed with seed=%d", seed)
		}
	})
	return seed
}

// env is one test's database: a pool, a migrated schema of its own with the oracle installed,
// and a second pool for effects and probes (a step's effect must not wait for an engine
// connection).
type env struct {
	pool   *pgxpool.Pool
	side   *pgxpool.Pool
	schema string
	// deadlocks is the database's deadlock count when the env was made (oracle I8).
	deadlocks int64
	started   time.Time
}

func newEnv(t *testing.T, conns int32) *env {
	t.Helper()
	pool := durabledbtest.Pool(t, conns)
	e := &env{pool: pool, side: durabledbtest.Pool(t, 6), schema: durabledbtest.Schema(t, pool), started: time.Now()}
	ctx := context.Background()
	require.NoError(t, oracle.Install(ctx, pool, e.schema))
	var err error
	e.deadlocks, err = oracle.Deadlocks(ctx, pool)
	require.NoError(t, err)
	return e
}

// q substitutes the quoted schema for {schema}.
func (e *env) q(query string) string {
	return strings.ReplaceAll(query, "{schema}", pgx.Identifier{e.schema}.Sanitize())
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
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// check runs the oracle's invariants and reports the test's summary line; any violation fails
// the test.
func (e *env) check(t *testing.T, o oracle.Opts, s oracle.Summary) {
	t.Helper()
	ctx := context.Background()
	if o.DeadlocksBefore == 0 {
		o.DeadlocksBefore = e.deadlocks
	}
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
		case strings.HasPrefix(x.Invariant, "I8"):
			s.Deadlocks++
		}
	}
	oracle.Report(t, s)
	require.Empty(t, v, "oracle violations")
}

// path is linear5's state: a counter (oracle I3) and the steps it went through (I5). By names
// the client that ran the last step (a test of stale outcomes tells owners apart with it).
type path struct {
	I    int      `json:"i"`
	Path []string `json:"path"`
	By   string   `json:"by,omitempty"`
}

var linearSteps = []string{"s0", "s1", "s2", "s3", "s4"}

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
