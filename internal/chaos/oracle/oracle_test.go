package oracle

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// The oracle finds each kind of violation it claims to, and none in a clean history.
func TestOracleFindsEveryViolation(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	require.NoError(t, Install(ctx, pool, schema))
	s := pgx.Identifier{schema}.Sanitize()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, strings.ReplaceAll(sql, "{s}", s), args...)
		require.NoError(t, err)
	}
	all := Opts{N: 1, Effects: true, Counter: true, Path: []string{"a", "b"}}

	// A clean history: insert, claim, effect, finish.
	exec(`INSERT INTO {s}.instances (id, machine, step, queue, max_attempts, state) OVERRIDING SYSTEM VALUE
		VALUES (1, 'm', 'a', 'q', 3, '{"i": 0, "path": []}')`)
	exec(`UPDATE {s}.instances SET status = 'executing', locked_by = 'w#1', locked_until = now() + interval '1m' WHERE id = 1`)
	require.NoError(t, Effect(ctx, pool, schema, 1, "a", 1, 7))
	exec(`UPDATE {s}.instances SET status = 'available', locked_by = NULL, locked_until = NULL, step = 'b',
		state = '{"i": 1, "path": ["a"]}' WHERE id = 1`)
	exec(`UPDATE {s}.instances SET status = 'executing', locked_by = 'w#2', locked_until = now() + interval '1m' WHERE id = 1`)
	exec(`UPDATE {s}.instances SET locked_until = now() + interval '2m' WHERE id = 1`) // a heartbeat: no transition
	require.NoError(t, Effect(ctx, pool, schema, 1, "b", 1, 7))
	exec(`UPDATE {s}.instances SET status = 'done', locked_by = NULL, locked_until = NULL, finalized_at = now(),
		result = '{"i": 2, "path": ["a", "b"]}' WHERE id = 1`)
	v, err := Check(ctx, pool, schema, all)
	require.NoError(t, err)
	require.Empty(t, v)
	var logged int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.t_outcome_log`).Scan(&logged))
	require.Equal(t, 5, logged, "the heartbeat is not a transition")

	// Now break everything.
	exec(`UPDATE {s}.instances SET status = 'available', finalized_at = NULL WHERE id = 1`)
	exec(`UPDATE {s}.instances SET status = 'executing', locked_by = 'w#3', locked_until = now(), step = 'c',
		state = '{"i": 0, "path": []}' WHERE id = 1`)
	exec(`UPDATE {s}.instances SET status = 'done', locked_by = NULL, locked_until = NULL,
		result = '{"path": ["a", "b", "b"]}' WHERE id = 1`) // step c ran with no effect
	exec(`INSERT INTO {s}.instances (id, machine, step, queue, max_attempts, state, status, locked_by, locked_until)
		OVERRIDING SYSTEM VALUE VALUES (2, 'm', 'a', 'q', 3, '{}', 'executing', 'w#4', now())`)
	exec(`INSERT INTO {s}.gates (key, shard, held, capacity) VALUES ('g', 0, 1, 5)`)
	exec(`INSERT INTO {s}.gate_leases (key, shard, owner, slots, expires_at) VALUES ('g', 0, 'w', 1, now())`)
	exec(`INSERT INTO {s}.signals (instance_id, name) VALUES (1, 'late')`)
	v, err = Check(ctx, pool, schema, all)
	require.NoError(t, err)
	var names []string
	for _, x := range v {
		names = append(names, x.Invariant)
	}
	require.ElementsMatch(t, []string{"I1 complete", "I2 one terminal transition", "I3 no rewind", "I4 no lost effect",
		"I5 exact path", "I6 nothing executing", "I6 gate counters at zero", "I6 no gate lease left", "I7 clean inboxes"}, names, "%v", v)
}

// I5 by machine: each machine's done instances are held to that machine's path, the others to
// Path, and a machine with neither is not checked.
func TestOracleChecksPathsByMachine(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	require.NoError(t, Install(ctx, pool, schema))
	s := pgx.Identifier{schema}.Sanitize()
	_, err := pool.Exec(ctx, strings.ReplaceAll(`INSERT INTO {s}.instances (id, machine, step, queue, max_attempts, state, status, result, finalized_at)
		OVERRIDING SYSTEM VALUE VALUES
		(1, 'child', 's1', 'q', 3, '{}', 'done', '{"path": ["s0", "s1"]}', now()),
		(2, 'parent', 'join', 'q', 3, '{}', 'done', '{"path": ["spawn", "join"]}', now()),
		(3, 'other', 'x', 'q', 3, '{"path": ["x"]}', 'done', NULL, now())`, "{s}", s))
	require.NoError(t, err)
	check := func(o Opts) []string {
		t.Helper()
		v, err := Check(ctx, pool, schema, o)
		require.NoError(t, err)
		var out []string
		for _, x := range v {
			out = append(out, x.String())
		}
		return out
	}
	paths := map[string][]string{"parent": {"spawn", "join"}}
	require.Empty(t, check(Opts{Paths: paths}), "machines not named are not checked without Path")
	got := check(Opts{Paths: paths, Path: []string{"s0", "s1"}})
	require.Len(t, got, 1)
	require.Contains(t, got[0], "3 other", "Path holds for every machine not named")
	got = check(Opts{Paths: map[string][]string{"parent": {"spawn"}, "child": {"s0", "s1"}, "other": {"x"}}})
	require.Len(t, got, 1)
	require.Contains(t, got[0], "2 parent")
}

// Count and Steps read the figures a Summary reports from the logs.
func TestCountAndSteps(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	require.NoError(t, Install(ctx, pool, schema))
	s := pgx.Identifier{schema}.Sanitize()
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, strings.ReplaceAll(sql, "{s}", s))
		require.NoError(t, err)
	}
	from := time.Now()
	exec(`INSERT INTO {s}.instances (id, machine, step, queue, max_attempts, state) OVERRIDING SYSTEM VALUE
		VALUES (1, 'm', 'a', 'q', 3, '{}'), (2, 'm', 'a', 'q', 3, '{}')`)
	claim := `UPDATE {s}.instances SET status = 'executing', locked_by = 'w#1', locked_until = now() + interval '1m' WHERE id = 1`
	exec(claim)
	exec(`UPDATE {s}.instances SET status = 'available', locked_by = NULL, locked_until = NULL WHERE id = 1`) // a release
	exec(claim)
	exec(`UPDATE {s}.instances SET status = 'available', locked_by = NULL, locked_until = NULL, step = 'b' WHERE id = 1`)
	exec(claim)
	exec(`UPDATE {s}.instances SET status = 'done', locked_by = NULL, locked_until = NULL, finalized_at = now() WHERE id = 1`)
	exec(`UPDATE {s}.instances SET status = 'available', finalized_at = NULL WHERE id = 1`) // a rewind to done again
	exec(`UPDATE {s}.instances SET status = 'done', finalized_at = now() WHERE id = 1`)
	c, err := Count(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, Tally{Instances: 2, Finished: 1, DuplicateTerminal: 1}, c)
	n, err := Steps(ctx, pool, schema, from, time.Now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, 2, n, "a -> b and b -> done; the release is no step")
	n, err = Steps(ctx, pool, schema, from.Add(-time.Hour), from)
	require.NoError(t, err)
	require.Zero(t, n)
}

// Size follows GD_CHAOS, and Seed replays GD_SEED.
func TestSizeAndSeed(t *testing.T) {
	t.Setenv(ChaosEnv, "")
	require.False(t, Full())
	require.Equal(t, 5, Size(5, 50))
	t.Setenv(ChaosEnv, "full")
	require.True(t, Full())
	require.Equal(t, 50, Size(5, 50))

	t.Setenv(SeedEnv, "42")
	seed, r1 := Seed(t)
	require.Equal(t, uint64(42), seed)
	_, r2 := Seed(t)
	require.Equal(t, r1.Uint64(), r2.Uint64(), "one seed, one sequence")
}

// DatabaseDeadlocks misses no deadlock: read the moment the sessions of a database have closed,
// it has the one they ran into (which a backend would otherwise report a second or more later),
// and it counts that database's alone.
func TestDatabaseDeadlocksMissesNone(t *testing.T) {
	ctx := context.Background()
	var counted int64 = -1
	t.Run("deadlock", func(t *testing.T) {
		dsn := Database(t, func(n int64) { counted = n })
		cfg, err := pgx.ParseConfig(dsn)
		require.NoError(t, err)
		connect := func() *pgx.Conn {
			c, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			return c
		}
		a, b := connect(), connect()
		_, err = a.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)`)
		require.NoError(t, err)
		txA, err := a.Begin(ctx)
		require.NoError(t, err)
		txB, err := b.Begin(ctx)
		require.NoError(t, err)
		_, err = txA.Exec(ctx, `UPDATE t SET id = id WHERE id = 1`)
		require.NoError(t, err)
		_, err = txB.Exec(ctx, `UPDATE t SET id = id WHERE id = 2`)
		require.NoError(t, err)
		errA := make(chan error, 1)
		go func() {
			_, err := txA.Exec(ctx, `UPDATE t SET id = id WHERE id = 2`)
			errA <- err
		}()
		_, errB := txB.Exec(ctx, `UPDATE t SET id = id WHERE id = 1`)
		errs := []error{errB, <-errA}
		var pgErr *pgconn.PgError
		deadlocked := 0
		for _, err := range errs {
			if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
				deadlocked++
			}
		}
		require.Equal(t, 1, deadlocked, "one of the two was chosen as the deadlock's victim: %v", errs)
		require.NoError(t, a.Close(ctx))
		require.NoError(t, b.Close(ctx))
	})
	require.Equal(t, int64(1), counted, "the database's count, read as its sessions ended")
}
