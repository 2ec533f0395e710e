package gendurable_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// checks returns the findings of one check.
func checks(fs []gendurable.Finding, check string) []gendurable.Finding {
	var out []gendurable.Finding
	for _, f := range fs {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// serverAutovacuum reads the server's autovacuum setting.
func serverAutovacuum(t *testing.T, e *env) bool {
	var on string
	require.NoError(t, e.pool.QueryRow(context.Background(), "SHOW autovacuum").Scan(&on))
	return on == "on"
}

// A schema worked by a started client, its work done, has nothing wrong with it but what the
// server says about autovacuum (this suite's server may run with it off). The horizon and the
// connections are the server's, which other tests share: they have tests of their own.
func TestCheckupOfAHealthySchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	m := linear("linear5", 0, nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 4}}, PollInterval: 20 * time.Millisecond})
	start(t, cl)
	r, err := cl.Insert(ctx, m.With(path{}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done' AND id = $1`, r.ID) == 1
	})
	fs, err := cl.Checkup(ctx, nil)
	require.NoError(t, err)
	for _, f := range fs {
		// The horizon and the connections are the server's, which other tests share.
		if f.Check != "horizon" && f.Check != "autovacuum" && f.Check != "connections" {
			t.Errorf("a healthy schema: %+v", f)
		}
	}
	av := checks(fs, "autovacuum")
	if serverAutovacuum(t, e) {
		require.Empty(t, av)
	} else {
		require.Len(t, av, 1)
		require.Equal(t, gendurable.SeverityProblem, av[0].Severity)
		require.Contains(t, av[0].Summary, "autovacuum is off on the server")
	}
}

// Rows are due and nobody works them; claims expired a while ago and nobody released them;
// a parked instance is past its await deadline and nobody woke it: no node runs a queue or the
// reaper. Once a worker with a reaper starts, both findings go.
func TestCheckupFindsNoWorkersAndNoReaper(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	parker := gendurable.FSM[path]{Name: "parker", Start: "wait", Queue: "work", Steps: map[string]gendurable.StepFunc[path]{
		"wait": func(*gendurable.Ctx, path) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"never"}, "after", path{}, gendurable.Timeout(time.Millisecond)), nil
		},
		"after": func(*gendurable.Ctx, path) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	m := linear("linear5", 0, nil)
	machines := []gendurable.Machine{m, parker}
	cl := e.client(t, &gendurable.Config{Machines: machines})
	_, err := cl.Insert(ctx, m.With(path{}), nil)
	require.NoError(t, err)
	fs, err := cl.Checkup(ctx, nil)
	require.NoError(t, err)
	w := checks(fs, "workers")
	require.Len(t, w, 1, "%+v", fs)
	require.Equal(t, gendurable.SeverityProblem, w[0].Severity)
	require.Equal(t, "rows are due in queues no live node works: work", w[0].Summary)
	require.Empty(t, checks(fs, "reaper"))

	// A worker without a reaper parks an instance whose deadline then passes, and a claim
	// whose worker died (its lease ran out two minutes ago).
	worker := e.client(t, &gendurable.Config{Name: "worker", Machines: machines, Reaper: &gendurable.ReaperConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 4}}, PollInterval: 20 * time.Millisecond})
	start(t, worker)
	p, err := cl.Insert(ctx, parker.With(path{}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "parked", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'awaiting'`, p.ID) == 1
	})
	dead, err := cl.Insert(ctx, m.With(path{}), &gendurable.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	e.exec(t, `UPDATE {schema}.instances SET status = 'executing', attempt = 1, locked_by = 'gone/1',
		locked_until = now() - interval '2 minutes' WHERE id = $1`, dead.ID)
	time.Sleep(300 * time.Millisecond) // the await deadline 300ms past
	// A due row of a queue nobody works, beside the worked one.
	_, err = cl.Insert(ctx, m.With(path{}), &gendurable.InsertOpts{Queue: "other"})
	require.NoError(t, err)
	fs, err = cl.Checkup(ctx, &gendurable.CheckupOpts{ReaperGrace: 200 * time.Millisecond})
	require.NoError(t, err)
	w = checks(fs, "workers")
	require.Len(t, w, 1, "%+v", fs)
	require.Equal(t, "rows are due in queues no live node works: other", w[0].Summary)
	r := checks(fs, "reaper")
	require.Len(t, r, 1, "%+v", fs)
	require.Equal(t, gendurable.SeverityProblem, r[0].Severity)
	require.Contains(t, r[0].Summary, "expired claims: 1; await deadlines passed: 1;")

	// A node with a reaper sees to both.
	reaper := e.client(t, &gendurable.Config{Name: "reaper", Machines: machines, Reaper: &gendurable.ReaperConfig{Interval: 20 * time.Millisecond}})
	start(t, reaper)
	eventually(t, 10*time.Second, "the reaper's sweep", func() bool {
		fs, err := cl.Checkup(ctx, &gendurable.CheckupOpts{ReaperGrace: 200 * time.Millisecond})
		require.NoError(t, err)
		return len(checks(fs, "reaper")) == 0
	})
}

// A unique index built concurrently over duplicate rows fails and stays behind, invalid; the
// checkup names it.
func TestCheckupFindsAnInvalidIndex(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	m := linear("linear5", 0, nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	for range 2 {
		_, err := cl.Insert(ctx, m.With(path{}), nil)
		require.NoError(t, err)
	}
	_, err := e.pool.Exec(ctx, expand(`CREATE UNIQUE INDEX CONCURRENTLY checkup_dup ON {schema}.instances (queue)`, e.schema))
	require.ErrorContains(t, err, "23505")
	fs, err := cl.Checkup(ctx, nil)
	require.NoError(t, err)
	x := checks(fs, "invalid_index")
	require.Len(t, x, 1, "%+v", fs)
	require.Equal(t, gendurable.SeverityProblem, x[0].Severity)
	require.Contains(t, x[0].Summary, e.schema+".checkup_dup on instances is invalid")
	require.Contains(t, x[0].Fix, `DROP INDEX CONCURRENTLY "`+e.schema+`"."checkup_dup"`)
	e.exec(t, `DROP INDEX {schema}.checkup_dup`)
	fs, err = cl.Checkup(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, checks(fs, "invalid_index"))
}

// A session that left a snapshot open holds vacuum back: the checkup names its pid once the
// snapshot is older than OldTransaction, and not after it ends.
func TestCheckupFindsASnapshotLeftOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cl := e.client(t, nil)
	conn, pid := session(t, e)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	mine := func() []gendurable.Finding {
		fs, err := cl.Checkup(ctx, &gendurable.CheckupOpts{OldTransaction: 200 * time.Millisecond})
		require.NoError(t, err)
		var out []gendurable.Finding
		for _, f := range checks(fs, "horizon") {
			if strings.HasPrefix(f.Summary, fmt.Sprintf("session %d ", pid)) {
				out = append(out, f)
			}
		}
		return out
	}
	eventually(t, 10*time.Second, "the snapshot reported", func() bool { return len(mine()) == 1 })
	f := mine()[0]
	require.Equal(t, gendurable.SeverityWarning, f.Severity)
	require.Contains(t, f.Summary, "idle in transaction")
	require.Contains(t, f.Fix, fmt.Sprintf("pg_terminate_backend(%d)", pid))
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, mine())

	// A read-committed transaction that wrote and sits idle holds no snapshot between its
	// statements, but its transaction id holds the horizon back all the same.
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()") // what a write does: take a transaction id
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the idle writer reported", func() bool { return len(mine()) == 1 })
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, mine())
}

// A schema change holds the instances table ACCESS EXCLUSIVE and a worker's statement waits for
// it: the checkup reports the wait and who blocks it, and that it could not read the table
// itself (it waits a second at most, not behind the lock).
func TestCheckupFindsALockedTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cl := e.client(t, nil)
	holder, holderPID := session(t, e)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, expand(`LOCK TABLE {schema}.instances IN ACCESS EXCLUSIVE MODE`, e.schema))
	require.NoError(t, err)

	waiter, waiterPID := session(t, e)
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, expand(`SELECT count(*) FROM {schema}.instances`, e.schema))
		waited <- err
	}()
	eventually(t, 10*time.Second, "the waiter waits", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted`, waiterPID) == 1
	})
	began := time.Now()
	fs, err := cl.Checkup(ctx, &gendurable.CheckupOpts{LockWait: time.Millisecond})
	require.NoError(t, err)
	require.Less(t, time.Since(began), 10*time.Second, "the checkup waited behind the lock")
	locked := checks(fs, "table_locked")
	require.Len(t, locked, 1, "%+v", fs)
	require.Equal(t, gendurable.SeverityProblem, locked[0].Severity)
	waits := slices.DeleteFunc(checks(fs, "lock_wait"), func(f gendurable.Finding) bool {
		return !strings.HasPrefix(f.Summary, fmt.Sprintf("session %d ", waiterPID))
	})
	require.Len(t, waits, 1, "%+v", fs)
	require.Contains(t, waits[0].Summary, fmt.Sprintf("AccessShareLock on %s.instances, blocked by %d", e.schema, holderPID))
	require.Equal(t, gendurable.SeverityProblem, fs[0].Severity, "problems first")

	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-waited)
	fs, err = cl.Checkup(ctx, &gendurable.CheckupOpts{LockWait: time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, checks(fs, "table_locked"))
}

// A transaction wrote an instance's row and sits idle without committing, and two writers of
// the same row wait: the first for the holder's transaction (it holds the row's tuple lock), the
// second for that tuple lock. The checkup reports both as waits for a row of the instances
// table, each with whom it waits for, and neither once the holder rolls back.
func TestCheckupFindsWaitsForARow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	m := linear("linear5", 0, nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	r, err := cl.Insert(ctx, m.With(path{}), nil)
	require.NoError(t, err)
	holder, holderPID := session(t, e)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	update := expand(`UPDATE {schema}.instances SET priority = 3 WHERE id = $1`, e.schema)
	_, err = tx.Exec(ctx, update, r.ID)
	require.NoError(t, err)

	var writers []int32
	done := make(chan error, 2)
	for range 2 {
		w, p := session(t, e)
		writers = append(writers, p)
		go func() {
			_, err := w.Exec(ctx, update, r.ID)
			done <- err
		}()
		eventually(t, 10*time.Second, "the writer waits", func() bool {
			return e.count(t, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted`, p) == 1
		})
	}
	rows := func() []gendurable.Finding {
		fs, err := cl.Checkup(ctx, &gendurable.CheckupOpts{LockWait: time.Millisecond})
		require.NoError(t, err)
		return slices.DeleteFunc(checks(fs, "lock_wait"), func(f gendurable.Finding) bool {
			return !strings.Contains(f.Summary, " for a row of "+e.schema+".instances, ")
		})
	}
	fs := rows()
	require.Len(t, fs, 2, "%+v", fs)
	// The longest wait first: the first writer's, for the holder.
	require.Regexp(t, fmt.Sprintf(`^session %d \(".*"\) has waited [0-9.]+m?s for a row of %s\.instances, blocked by %d$`,
		writers[0], regexp.QuoteMeta(e.schema), holderPID), fs[0].Summary)
	require.Regexp(t, fmt.Sprintf(`^session %d \(".*"\) has waited [0-9.]+m?s for a row of %s\.instances, blocked by `,
		writers[1], regexp.QuoteMeta(e.schema)), fs[1].Summary)
	require.Equal(t, gendurable.SeverityWarning, fs[0].Severity)
	require.Contains(t, fs[0].Fix, "idle_in_transaction_session_timeout")

	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	require.Empty(t, rows())
}

// Dead rows pile up where nothing vacuums: 100,000 finished instances deleted outside GC, with
// autovacuum off for the table. The checkup reports both, and the dead rows go with a VACUUM.
func TestCheckupFindsDeadRowsPilingUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	m := linear("linear5", 0, nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	e.exec(t, `ALTER TABLE {schema}.instances SET (autovacuum_enabled = false)`)
	const n = 100_000
	params := make([]gendurable.InsertManyParams, 10_000)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: m.With(path{})}
	}
	for range n / len(params) {
		_, err := cl.InsertMany(ctx, params)
		require.NoError(t, err)
	}
	e.exec(t, `DELETE FROM {schema}.instances`)
	dead := func() []gendurable.Finding {
		fs, err := cl.Checkup(ctx, nil)
		require.NoError(t, err)
		av := checks(fs, "autovacuum")
		require.Len(t, av, 1, "%+v", fs)
		if serverAutovacuum(t, e) {
			require.Contains(t, av[0].Summary, "autovacuum is off for "+e.schema+".instances")
		}
		return checks(fs, "dead_rows")
	}
	// The statistics count the deletion once the deleting session reports it (within a second
	// or so of its commit).
	eventually(t, 20*time.Second, "the dead rows counted", func() bool { return len(dead()) == 1 })
	f := dead()[0]
	require.Equal(t, gendurable.SeverityWarning, f.Severity)
	require.Contains(t, f.Summary, fmt.Sprintf("%s.instances holds %d dead rows", e.schema, n))
	require.Contains(t, f.Summary, "never since the statistics were reset")
	e.exec(t, `VACUUM {schema}.instances`)
	eventually(t, 20*time.Second, "the vacuum counted", func() bool { return len(dead()) == 0 })
}

// Connections in use past a share of what the server accepts are reported, with the figures the
// server gives. (The share is set below what this test's own pool holds open, since the server's
// other sessions come and go.)
func TestCheckupFindsConnectionsRunningOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cl := e.client(t, nil)
	var accepted int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int`).Scan(&accepted))
	fs, err := cl.Checkup(ctx, &gendurable.CheckupOpts{Connections: 0.5 / float64(accepted)})
	require.NoError(t, err)
	c := checks(fs, "connections")
	require.Len(t, c, 1, "%+v", fs)
	require.Equal(t, gendurable.SeverityWarning, c[0].Severity)
	var used int
	_, err = fmt.Sscanf(c[0].Summary, "%d of the "+fmt.Sprint(accepted)+" client connections the server accepts are in use", &used)
	require.NoError(t, err, c[0].Summary)
	require.GreaterOrEqual(t, used, 1)
	require.LessOrEqual(t, used, accepted)
	// At the default share (90%), a server this suite does not fill is not reported.
	if used < accepted*8/10 {
		fs, err = cl.Checkup(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, checks(fs, "connections"))
	}
}

// privateEnv is an env on a Postgres cluster of the test's own, started with settings (the
// prepared transactions and replication slots a test leaves are the whole server's, which other
// tests' checkups would see).
func privateEnv(t *testing.T, settings map[string]string) (*env, *devdb.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := devdb.StartCluster(ctx, devdb.ClusterOptions{Settings: settings})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cluster.Close()) })
	pool, err := pgxpool.New(ctx, cluster.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &env{pool: pool, schema: durabledbtest.Schema(t, pool)}, cluster
}

// standbyFeedback does what a standby with hot_standby_feedback does to its primary, then goes:
// it streams from slot over a replication connection, reports the oldest transaction its
// queries still see (the primary's current xmin), and disconnects. The slot keeps that xmin.
func standbyFeedback(t *testing.T, url, slot string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var lsn string
	var xid uint64
	// Streaming starts at the WAL flushed so far: a walsender refuses a start past it (the
	// current write position may be), after it has answered START_REPLICATION.
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text,
		pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&lsn, &xid))
	rc, err := pgconn.Connect(ctx, url+"&replication=true")
	require.NoError(t, err)
	rc.Frontend().Send(&pgproto3.Query{String: fmt.Sprintf("START_REPLICATION SLOT %s PHYSICAL %s", slot, lsn)})
	require.NoError(t, rc.Frontend().Flush())
	for {
		m, err := rc.ReceiveMessage(ctx)
		require.NoError(t, err)
		if _, ok := m.(*pgproto3.CopyBothResponse); ok {
			break
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("START_REPLICATION: %s", e.Message)
		}
	}
	// A hot standby feedback message: 'h', the send time (µs since 2000), the xmin and its epoch,
	// the catalog xmin and its epoch (none).
	msg := make([]byte, 25)
	msg[0] = 'h'
	binary.BigEndian.PutUint64(msg[1:], uint64(time.Since(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()))
	binary.BigEndian.PutUint32(msg[9:], uint32(xid))
	binary.BigEndian.PutUint32(msg[13:], uint32(xid>>32))
	rc.Frontend().Send(&pgproto3.CopyData{Data: msg})
	require.NoError(t, rc.Frontend().Flush())
	eventually(t, 10*time.Second, "the slot to take the standby's xmin", func() bool {
		var held bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&held))
		return held
	})
	require.NoError(t, rc.Close(ctx))
	eventually(t, 10*time.Second, "the standby gone", func() bool {
		var active bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active))
		return !active
	})
}

// session acquires a connection of e's pool for the test, released at its end, and its
// backend's pid.
func session(t *testing.T, e *env) (*pgxpool.Conn, int32) {
	t.Helper()
	c, err := e.pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(c.Release)
	var pid int32
	require.NoError(t, c.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return c, pid
}

// sqlOf is the statement of a fix that reads "… SQL; …", beginning with prefix.
func sqlOf(t *testing.T, fix, prefix string) string {
	t.Helper()
	i := strings.Index(fix, prefix)
	require.GreaterOrEqual(t, i, 0, "%q in %q", prefix, fix)
	j := strings.Index(fix[i:], ";")
	require.Greater(t, j, 0, "a ; after %q in %q", prefix, fix)
	return fix[i : i+j]
}

// A replication slot nothing reads is reported once the WAL it keeps passes SlotWAL, physical
// or logical, and the fix drops it. A prepared transaction nobody ended is reported once it is
// older than OldTransaction: a problem when it holds a lock on the schema's tables (an update
// of an instance prepared and left), a warning when it only holds the horizon; the fix's
// ROLLBACK PREPARED, quoted as written, ends it.
func TestCheckupFindsIdleSlotsAndPreparedTransactions(t *testing.T) {
	t.Parallel()
	e, cluster := privateEnv(t, map[string]string{"max_prepared_transactions": "4", "wal_level": "logical"})
	ctx := context.Background()
	t.Cleanup(func() {
		// Before the schema is dropped: a prepared transaction left by a failed check would
		// hold its lock on the instances table, and the drop would wait for it forever.
		rows, err := e.pool.Query(ctx, `SELECT gid FROM pg_prepared_xacts`)
		require.NoError(t, err)
		gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		for _, gid := range gids {
			e.exec(t, "ROLLBACK PREPARED '"+strings.ReplaceAll(gid, "'", "''")+"'")
		}
	})
	cl := e.client(t, nil)
	mine := func(check string, opts *gendurable.CheckupOpts) []gendurable.Finding {
		fs, err := cl.Checkup(ctx, opts)
		require.NoError(t, err)
		return checks(fs, check)
	}

	e.exec(t, `SELECT pg_create_physical_replication_slot('gd_standby', true)`)
	e.exec(t, `SELECT pg_create_logical_replication_slot('gd_feed', 'test_decoding')`)
	var kept int64 // the least either keeps: the WAL from the later restart_lsn on
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT min(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn))::bigint
		FROM pg_replication_slots`).Scan(&kept))
	require.Positive(t, kept)
	require.Empty(t, mine("slot", nil), "the default 1 GiB")
	require.Empty(t, mine("slot", &gendurable.CheckupOpts{SlotWAL: kept + 1<<30}))
	slots := mine("slot", &gendurable.CheckupOpts{SlotWAL: kept - 1})
	require.Len(t, slots, 2, "%+v", slots)
	var summaries []string
	for _, f := range slots {
		require.Equal(t, gendurable.SeverityWarning, f.Severity)
		require.Regexp(t, `has no consumer and keeps [0-9.]+ (B|KiB|MiB) of WAL`, f.Summary)
		summaries = append(summaries, f.Summary)
		e.exec(t, sqlOf(t, f.Fix, "SELECT pg_drop_replication_slot("))
	}
	slices.Sort(summaries)
	require.True(t, strings.HasPrefix(summaries[0], "replication slot gd_feed (logical, database postgres) "), summaries[0])
	require.True(t, strings.HasPrefix(summaries[1], "replication slot gd_standby (physical) "), summaries[1])
	require.Zero(t, e.count(t, `SELECT count(*) FROM pg_replication_slots`), "the fixes dropped them")
	require.Empty(t, mine("slot", &gendurable.CheckupOpts{SlotWAL: 1}))

	// A standby with hot_standby_feedback streams through a slot, then goes: its slot keeps the
	// xmin the standby last reported, whatever WAL it keeps.
	e.exec(t, `SELECT pg_create_physical_replication_slot('gd_gone', true)`)
	standbyFeedback(t, cluster.URL, "gd_gone")
	slots = mine("slot", nil)
	require.Len(t, slots, 1, "%+v", slots)
	require.Regexp(t, `^replication slot gd_gone \(physical\) has no consumer and holds the xmin horizon [0-9]+ transactions back `+
		`\(a standby's hot_standby_feedback, kept when it went\): vacuum keeps every row version younger than it`, slots[0].Summary)
	e.exec(t, sqlOf(t, slots[0].Fix, "SELECT pg_drop_replication_slot("))
	require.Empty(t, mine("slot", nil))

	// An update of an instance, prepared and left; and a transaction that only took an id.
	r, err := cl.Insert(ctx, linear("linear5", 0, nil).With(path{}), nil)
	require.NoError(t, err)
	prepare := func(gid, stmt string, args ...any) {
		conn, err := e.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release() // PREPARE TRANSACTION leaves the session out of any transaction
		_, err = conn.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, expand(stmt, e.schema), args...)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "PREPARE TRANSACTION '"+strings.ReplaceAll(gid, "'", "''")+"'")
		require.NoError(t, err)
	}
	prepare("order's 7", `UPDATE {schema}.instances SET priority = 2 WHERE id = $1`, r.ID)
	prepare("quiet", `SELECT pg_current_xact_id()`)
	require.Empty(t, mine("prepared", nil), "younger than the default 5 minutes")
	opts := &gendurable.CheckupOpts{OldTransaction: 50 * time.Millisecond}
	eventually(t, 10*time.Second, "both reported", func() bool { return len(mine("prepared", opts)) == 2 })
	fs := mine("prepared", opts)
	require.Equal(t, gendurable.SeverityProblem, fs[0].Severity, "%+v", fs)
	require.Regexp(t, `^prepared transaction 'order''s 7' \(owner postgres\) has waited [0-9.]+m?s for COMMIT PREPARED, holding locks on `+
		regexp.QuoteMeta(e.schema+".finished_counts, "+e.schema+".instances")+`: the rows it wrote`, fs[0].Summary)
	require.Equal(t, gendurable.SeverityWarning, fs[1].Severity)
	require.Regexp(t, `^prepared transaction 'quiet' \(owner postgres\) has waited [0-9.]+m?s for COMMIT PREPARED: vacuum keeps`, fs[1].Summary)
	for _, f := range fs {
		e.exec(t, sqlOf(t, f.Fix, "ROLLBACK PREPARED "))
	}
	require.Zero(t, e.count(t, `SELECT count(*) FROM pg_prepared_xacts`), "the fixes ended them")
	require.Empty(t, mine("prepared", opts))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE priority = 2`), "the update rolled back")
}

// A session that listens and then sits in a transaction reads no notification until it ends,
// and the server's NOTIFY queue grows behind it: reported once past NotifyQueue, and not once the
// session's transaction ends and it has read them (the next notifications move the queue's tail).
func TestCheckupFindsAStuckNotifyQueue(t *testing.T) {
	t.Parallel()
	e, _ := privateEnv(t, nil)
	ctx := context.Background()
	cl := e.client(t, nil)
	opts := &gendurable.CheckupOpts{NotifyQueue: 0.001}
	mine := func() []gendurable.Finding {
		fs, err := cl.Checkup(ctx, opts)
		require.NoError(t, err)
		return checks(fs, "notify_queue")
	}
	// notify sends n notifications of about 7,000 bytes each, all different (a transaction
	// sends identical ones once).
	batch := 0
	notify := func(n int) {
		batch++
		e.exec(t, `SELECT count(pg_notify('gd_stuck', repeat(md5(($1::int * 100000 + g)::text), 218)))
			FROM generate_series(1, $2::int) AS g`, batch, n)
	}
	require.Empty(t, mine())
	_, err := cl.Checkup(ctx, &gendurable.CheckupOpts{NotifyQueue: 50})
	require.ErrorContains(t, err, "NotifyQueue 50: a share of the queue, at most 1")

	listener, err := e.pool.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, "LISTEN gd_stuck")
	require.NoError(t, err)
	tx, err := listener.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	for range 20 { // 14 MB: about 0.17% of the queue
		notify(100)
	}
	fs := mine()
	require.Len(t, fs, 1)
	require.Equal(t, gendurable.SeverityWarning, fs[0].Severity)
	require.Regexp(t, `^the server's NOTIFY queue is 0\.[1-9]% full: a session that listens reads none of it`, fs[0].Summary)

	// The transaction ends; reading the rollback's answer, the client takes in what its
	// session now sends.
	require.NoError(t, tx.Rollback(ctx))
	_, err = listener.Exec(ctx, "UNLISTEN *")
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the queue read", func() bool {
		notify(10)
		return len(mine()) == 0
	})
}

// A client whose role has a CONNECTION LIMIT of 4, holding 3 connections while its checkup takes
// the fourth, is told its role is at its limit; once it lets them go, it is not. A database's
// limit is reported to a client held to it (Connections lowered to 1%, so that any connection
// counts), not to a superuser's, which the server lets past both limits.
func TestCheckupFindsItsRoleOrDatabaseAtItsConnectionLimit(t *testing.T) {
	t.Parallel()
	e, cluster := privateEnv(t, nil)
	ctx := context.Background()
	e.exec(t, `CREATE ROLE gd_app LOGIN CONNECTION LIMIT 4`)
	e.exec(t, `GRANT USAGE ON SCHEMA {schema} TO gd_app`)
	e.exec(t, `GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO gd_app`)
	cfg, err := pgxpool.ParseConfig(strings.Replace(cluster.URL, "postgres://postgres@", "postgres://gd_app@", 1))
	require.NoError(t, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	app, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema})
	require.NoError(t, err)
	mine := func(cl *gendurable.Client, opts *gendurable.CheckupOpts, what string) []gendurable.Finding {
		fs, err := cl.Checkup(ctx, opts)
		require.NoError(t, err)
		return slices.DeleteFunc(checks(fs, "connections"), func(f gendurable.Finding) bool {
			return !strings.Contains(f.Summary, what)
		})
	}
	var held []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	fs := mine(app, nil, "role gd_app")
	require.Len(t, fs, 1)
	require.Equal(t, "4 of the 4 connections role gd_app may hold (its CONNECTION LIMIT) are in use", fs[0].Summary)
	require.Contains(t, fs[0].Fix, `ALTER ROLE "gd_app" CONNECTION LIMIT n;`)
	for _, c := range held {
		require.NoError(t, c.Hijack().Close(ctx)) // gone from the server, not idle in the pool
	}
	// A closed connection's backend leaves pg_stat_activity when it has exited, a moment after.
	eventually(t, 10*time.Second, "the role's closed connections gone from the server", func() bool {
		return len(mine(app, nil, "role gd_app")) == 0
	})

	e.exec(t, `ALTER DATABASE postgres CONNECTION LIMIT 100`)
	one := &gendurable.CheckupOpts{Connections: 0.01}
	fs = mine(app, one, "database postgres")
	require.Len(t, fs, 1)
	require.Regexp(t, `^[0-9]+ of the 100 connections database postgres accepts \(its CONNECTION LIMIT\) are in use$`, fs[0].Summary)
	require.Contains(t, fs[0].Fix, `ALTER DATABASE "postgres" CONNECTION LIMIT n;`)
	require.Empty(t, mine(e.client(t, nil), one, "database postgres"), "a superuser is not held to the database's limit")
}
