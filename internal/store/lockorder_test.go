package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A committer settling children of several parents locks the parents in id order, whatever
// order their row versions lie in on disk. Here parent B's version lies before A's (A was
// updated after both were inserted), and another transaction holds A while it goes on to lock B,
// in id order like every writer of several parents. Locking in heap order, the outcome statement
// would hold B while it waits for A: a deadlock (found by the fan-out test under kills, T17).
func TestSettleLocksParentsInIDOrder(t *testing.T) {
	s, pool, schema := newTestStore(t, 4)
	var err error
	ctx := context.Background()
	q := pgx.Identifier{schema}.Sanitize()
	var a, b int64
	require.NoError(t, pool.QueryRow(ctx, `WITH p AS (
		INSERT INTO `+q+`.instances (machine, step, queue, max_attempts, state, status, pending_children, spawn_wave)
		SELECT 'p', 'join', 'q', 3, '{}', 'joining', 2, 1 FROM generate_series(1, 2) RETURNING id)
		SELECT min(id), max(id) FROM p`).Scan(&a, &b))
	// Updates of an indexed column (not HOT) give A a new version, and index entry, after B's.
	for _, st := range []string{"awaiting", "joining"} {
		_, err = pool.Exec(ctx, `UPDATE `+q+`.instances SET status = $2::text::`+q+`.status WHERE id = $1`, a, st)
		require.NoError(t, err)
	}
	var order []int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY ctid) FROM `+q+`.instances`).Scan(&order))
	require.Equal(t, []int64{b, a}, order, "the test needs B's row version before A's")
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.instances (machine, step, queue, max_attempts, state, status,
		locked_by, locked_until, parent_id, parent_wave)
		SELECT 'c', 's', 'q', 3, '{}', 'executing', 'o#' || p || '-' || g, now() + interval '1h', p, 1
		FROM unnest($1::bigint[]) p, generate_series(1, 2) g`, q), []int64{a, b})
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `SELECT id, locked_by FROM `+q+`.instances WHERE status = 'executing' AND locked_by LIKE '%-1'`)
	require.NoError(t, err)
	defer rows.Close()
	var batch []Outcome
	for rows.Next() {
		var o Outcome
		require.NoError(t, rows.Scan(&o.Claim.ID, &o.Claim.Owner))
		o.Kind, o.Result, o.Child = KindDone, []byte("{}"), true
		batch = append(batch, o)
	}
	require.NoError(t, rows.Err())
	require.Len(t, batch, 2, "one child of each parent finishes")

	// The other writer holds A.
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `UPDATE `+q+`.instances SET updated_at = now() WHERE id = $1`, a)
	require.NoError(t, err)

	conn, committer := backendConn(t, pool)
	applied := make(chan error, 1)
	go func() {
		_, _, err := s.ApplyOutcomes(ctx, conn.Conn(), batch)
		applied <- err
	}()
	waitForLock(t, pool, committer) // the outcome statement waits for A...
	// ...holding nothing the other writer needs next.
	_, err = other.Exec(ctx, `SET LOCAL lock_timeout = '5s'`)
	require.NoError(t, err)
	_, err = other.Exec(ctx, `UPDATE `+q+`.instances SET updated_at = now() WHERE id = $1`, b)
	require.NoError(t, err, "the outcome statement held parent B while it waited for A")
	require.NoError(t, other.Commit(ctx))
	require.NoError(t, <-applied)
	var pending []int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(pending_children ORDER BY id) FROM `+q+`.instances WHERE id IN ($1, $2)`,
		a, b).Scan(&pending))
	require.Equal(t, []int32{1, 1}, pending, "each parent settled once")
}

// Giving gate slots back (an outcome's credit, the reaper's release of expired claims) locks the
// gate counters in (key, shard) order, like the pick's debit, whatever plan the statement gets
// and whatever order the counters' row versions lie in. Here shard 1's version lies before shard
// 0's (shard 0 was updated last), the plan scans the counters, and another transaction holds
// shard 0 while it goes on to lock shard 1. Locking in the scan's order, the credit would hold
// shard 1 while it waits for shard 0: a deadlock.
func TestCreditLocksGatesInKeyOrder(t *testing.T) {
	for _, via := range []string{"outcome", "reaper"} {
		t.Run(via, func(t *testing.T) { testCreditLockOrder(t, via == "reaper") })
	}
}

func testCreditLockOrder(t *testing.T, reaper bool) {
	s, pool, schema := newTestStore(t, 4)
	ctx := context.Background()
	q := pgx.Identifier{schema}.Sanitize()
	_, err := pool.Exec(ctx, `INSERT INTO `+q+`.gates (key, shard, held, capacity) VALUES ('g:x', 0, 1, 1), ('g:x', 1, 1, 1)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+q+`.gates SET held = 1 WHERE key = 'g:x' AND shard = 0`) // its new version goes after shard 1's
	require.NoError(t, err)
	var order []int16
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(shard ORDER BY ctid) FROM `+q+`.gates`).Scan(&order))
	require.Equal(t, []int16{1, 0}, order, "the test needs shard 1's row version before shard 0's")
	lease := "1 hour"
	if reaper {
		lease = "-1 second"
	}
	var batch []Outcome
	for shard := range int16(2) {
		var o Outcome
		owner := fmt.Sprintf("o#%d", shard)
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+q+`.instances (machine, step, queue, max_attempts, state, status,
			locked_by, locked_until, concurrency_key, concurrency_shard)
			VALUES ('m', 's', 'q', 3, '{}', 'executing', $1, now() + $3::interval, 'g:x', $2) RETURNING id`,
			owner, shard, lease).Scan(&o.Claim.ID))
		o.Claim.Owner, o.Kind, o.Result, o.Credit = owner, KindDone, []byte("{}"), &GateSlot{Key: "g:x", Shard: shard}
		batch = append(batch, o)
	}

	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `UPDATE `+q+`.gates SET held = held WHERE key = 'g:x' AND shard = 0`)
	require.NoError(t, err)

	conn, committer := backendConn(t, pool)
	// Whatever plan the planner picks: here, a scan of the counters rather than look-ups by key.
	_, err = conn.Exec(ctx, `SET enable_indexscan = off; SET enable_bitmapscan = off`)
	require.NoError(t, err)
	credited := make(chan error, 1)
	go func() {
		if reaper {
			rows, _, err := s.ReleaseExpired(ctx, conn.Conn(), 100, "", 0, 100)
			if err == nil && len(rows) != 2 {
				err = fmt.Errorf("released %d rows, want 2", len(rows))
			}
			credited <- err
			return
		}
		_, _, err := s.ApplyOutcomes(ctx, conn.Conn(), batch)
		credited <- err
	}()
	waitForLock(t, pool, committer)
	_, err = other.Exec(ctx, `SET LOCAL lock_timeout = '5s'`)
	require.NoError(t, err)
	_, err = other.Exec(ctx, `UPDATE `+q+`.gates SET held = held WHERE key = 'g:x' AND shard = 1`)
	require.NoError(t, err, "the credit held shard 1 while it waited for shard 0")
	require.NoError(t, other.Commit(ctx))
	require.NoError(t, <-credited)
	var held []int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(held ORDER BY shard) FROM `+q+`.gates`).Scan(&held))
	require.Equal(t, []int32{0, 0}, held, "each slot credited once")
}

// waitForLock waits until backend pid waits for a lock.
// backendConn acquires a connection of the pool for the test (released when it ends) and returns
// it with its backend's pid, for waitForLock.
func backendConn(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Conn, int) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	var pid int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	return conn, pid
}

func waitForLock(t *testing.T, pool DB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "backend %d never waited for a lock", pid)
		time.Sleep(5 * time.Millisecond)
	}
}
