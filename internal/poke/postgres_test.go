package poke

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/gendurable/gendurable/internal/faultproxy"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// logs captures the transport's log lines.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.lines = append(l.lines, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logs) WithGroup(string) slog.Handler      { return l }

// count is how many lines contain s.
func (l *logs) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// pool opens a pool of 4 connections on url with the exec mode, closed when the test ends.
func pool(t *testing.T, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// pokeArrives sends a poke for queue "q" through db, as another node would, and waits for the
// transport to wake the queue.
func pokeArrives(t *testing.T, st *store.Store, db *pgxpool.Pool, wakes chan string) {
	t.Helper()
	require.NoError(t, st.Notify(context.Background(), db, []string{st.PokeChannel("q")}, "another node"))
	select {
	case q := <-wakes:
		require.Equal(t, "q", q)
	case <-time.After(5 * time.Second):
		t.Fatal("no wake")
	}
}

// transport opens the transport for queue "q" with the timings; wakes receives its wakes.
func transport(t *testing.T, db *pgxpool.Pool, tm timings) (*Postgres, *store.Store, *logs, chan string) {
	t.Helper()
	st, err := store.New("poke_test")
	require.NoError(t, err)
	l := &logs{}
	wakes := make(chan string, 100)
	p, err := open(context.Background(), st, db, "test", "me", []string{"q"},
		func(q string) { wakes <- q }, slog.New(l), tm)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p, st, l, wakes
}

func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, d, 5*time.Millisecond, what)
}

// Direct to Postgres the self-check passes silently, and a poke from another node wakes the
// queue.
func TestSelfCheckPassesDirect(t *testing.T) {
	t.Parallel()
	db := pool(t, durabledbtest.URL(t), pgx.QueryExecModeCacheStatement)
	_, st, l, wakes := transport(t, db, defaultTimings)
	within(t, 5*time.Second, "the self-check passes", func() bool { return l.count("self-check passed") == 1 })
	pokeArrives(t, st, db, wakes)
	require.Zero(t, l.count("poke degraded"))
}

// Behind PgBouncer in transaction mode LISTEN is not kept by the session: the transport says so
// once ("poke degraded") and goes on (the queues are polled).
func TestSelfCheckDegradedBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := devdb.StartPgBouncer(ctx, durabledbtest.URL(t), devdb.PgBouncerOptions{PoolSize: 4})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	db := pool(t, b.URL, pgx.QueryExecModeExec)
	tm := defaultTimings
	tm.idle = 200 * time.Millisecond // the idle pings go through the pooler too, and pass
	_, _, l, _ := transport(t, db, tm)
	within(t, 5*time.Second, "poke degraded", func() bool { return l.count("poke degraded") > 0 })
	time.Sleep(time.Second) // idle pings come and go: still one warning, and no reconnect
	require.Equal(t, 1, l.count("poke degraded"))
	require.Zero(t, l.count("self-check passed"))
	require.Zero(t, l.count("lost its connection"))
}

// A listening connection that goes half-open (nothing forwarded, nothing closed) is found by its
// idle ping and replaced once the path is back; the queues are poked then, since pokes were lost
// meanwhile.
func TestHalfOpenListenerIsReplaced(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(durabledbtest.URL(t))
	require.NoError(t, err)
	proxy, err := faultproxy.New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(proxy.Port())
	cfg.MaxConns = 4
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	direct := pool(t, durabledbtest.URL(t), pgx.QueryExecModeCacheStatement)
	tm := timings{idle: 200 * time.Millisecond, ping: 200 * time.Millisecond, connect: 300 * time.Millisecond, check: time.Second}
	_, st, l, wakes := transport(t, db, tm)
	within(t, 5*time.Second, "the self-check passes", func() bool { return l.count("self-check passed") == 1 })

	const hole = 3 * time.Second
	began := time.Now()
	proxy.Blackhole(hole)
	within(t, hole, "the stalled listener noticed", func() bool { return l.count("lost its connection") == 1 })
	noticed := time.Since(began)
	require.Less(t, noticed, hole, "found during the stall, not after it")
	t.Logf("half-open listener found after %v", noticed)
	for len(wakes) > 0 {
		<-wakes
	}
	// Once the path is back the listener reconnects and pokes its queues, then hears pokes.
	select {
	case <-wakes:
	case <-time.After(hole + 10*time.Second):
		t.Fatal("no wake after the reconnect")
	}
	require.Equal(t, 1, l.count("reconnected"))
	pokeArrives(t, st, direct, wakes)
}

// The transport's sender notifies in a transaction of its own that commits without waiting for
// its flush (NotifyAlone): the notification arrives, and the connection it used, which the pool
// hands to data-writing statements next, still commits synchronously afterwards, in every
// query mode the library supports (the setting is local to the statement's implicit
// transaction). In each mode a poke inside a caller's transaction, its NOTIFY-queue limit a
// parameter, leaves with the commit too.
func TestNotifyAloneLeavesTheSessionDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.New("poke_test")
	require.NoError(t, err)
	listener, err := pgx.Connect(ctx, durabledbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	ch := st.PokeChannel("alone")
	require.NoError(t, st.Listen(ctx, listener, []string{ch}))
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		db := pool(t, durabledbtest.URL(t), mode)
		// One connection throughout, released before the pool closes whatever fails.
		before, after, err := func() (before, after string, err error) {
			conn, err := db.Acquire(ctx)
			if err != nil {
				return "", "", err
			}
			defer conn.Release()
			if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&before); err != nil {
				return "", "", err
			}
			if err := st.NotifyAlone(ctx, conn, []string{ch}, mode.String()); err != nil {
				return "", "", err
			}
			err = conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after)
			return before, after, err
		}()
		require.NoError(t, err)
		require.Equal(t, "on", before, "the server's default, which the test relies on")
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err, "mode %v: the notification arrives", mode)
		require.Equal(t, ch, n.Channel)
		require.Equal(t, mode.String(), n.Payload)
		require.Equal(t, "on", after, "mode %v: the session commits synchronously after the poke", mode)

		// A poke inside a caller's transaction (its limit a float parameter) leaves with the commit.
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		sent, usage, err := st.NotifyBelow(ctx, tx, []string{ch}, "tx "+mode.String(), 0.5)
		require.NoError(t, err, "mode %v", mode)
		require.True(t, sent, "mode %v", mode)
		require.Less(t, usage, 0.5)
		require.NoError(t, tx.Commit(ctx))
		wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		n, err = listener.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err, "mode %v: the transaction's notification arrives", mode)
		require.Equal(t, "tx "+mode.String(), n.Payload)
	}
}

// A role with idle_session_timeout (Postgres 14+) ends sessions that run no statement for that
// long, and a listening connection runs none while it waits, however many notifications arrive:
// the listener pings often enough to stay under it, so it keeps its connection (no reconnect, no
// poke lost meanwhile) over many times the timeout, while pokes keep arriving.
func TestListenerOutlivesIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	db := durabledbtest.Pool(t, 4, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "1s"
	})
	direct := pool(t, durabledbtest.URL(t), pgx.QueryExecModeCacheStatement)
	_, st, l, wakes := transport(t, db, defaultTimings)
	within(t, 5*time.Second, "the self-check passes", func() bool { return l.count("self-check passed") == 1 })
	// Five times the timeout, a poke every 250ms from another connection: each arrives.
	for range 20 {
		pokeArrives(t, st, direct, wakes)
		time.Sleep(250 * time.Millisecond)
	}
	require.Zero(t, l.count("lost its connection"), "the server ended the listening session")
	require.Zero(t, l.count("reconnected"))
}

// An application's pool may carry an OnNotification callback of its own: the listener, which
// copies the pool's connection settings, does not let it take the pokes it waits for.
func TestListenerIgnoresThePoolsNotificationCallback(t *testing.T) {
	t.Parallel()
	var taken sync.Mutex
	tookOne := false
	db := durabledbtest.Pool(t, 4, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {
			taken.Lock()
			tookOne = true
			taken.Unlock()
		}
	})
	direct := pool(t, durabledbtest.URL(t), pgx.QueryExecModeCacheStatement)
	_, st, l, wakes := transport(t, db, defaultTimings)
	within(t, 5*time.Second, "the self-check passes", func() bool { return l.count("self-check passed") == 1 })
	pokeArrives(t, st, direct, wakes)
	taken.Lock()
	defer taken.Unlock()
	require.False(t, tookOne, "the pool's callback saw the listener's notifications")
}

// Once the server's NOTIFY queue is full, every transaction that notified fails at its commit,
// so a poke that rode a caller's transaction would fail the caller's insert. The queue fills
// behind a session that listens and then sits in a transaction (it reads nothing meanwhile).
// From rideBelow on (here 0.1%, which 14 MB of notifications pass), PublishTx sends nothing
// once the transport has read the usage (off the callers' path, within a second): the caller's
// transaction commits without a notification, and the transport says so once; once the session
// ends, pokes ride transactions again. On a private cluster: the
// queue is the whole server's.
func TestPokesStopRidingTransactionsWhileTheNotifyQueueFills(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, err := devdb.StartCluster(ctx, devdb.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cluster.Close()) })
	db := pool(t, cluster.URL, pgx.QueryExecModeCacheStatement)
	tm := defaultTimings
	tm.rideBelow = 0.001
	p, st, l, _ := transport(t, db, tm)
	within(t, 5*time.Second, "the self-check passes", func() bool { return l.count("self-check passed") == 1 })

	// A session of the test's own hears the queue's channel, payloads included, in commit order.
	ch := st.PokeChannel("q")
	heard, err := pgx.Connect(ctx, cluster.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = heard.Close(context.Background()) })
	require.NoError(t, st.Listen(ctx, heard, []string{ch}))
	next := func() string {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		n, err := heard.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Payload
	}
	// insertTx is a caller's transaction that pokes and commits, followed by a marker poke sent
	// on its own: what the test's session hears first tells whether the transaction notified
	// (its commit comes first).
	marker := 0
	insertTx := func() (sent bool, first string) {
		t.Helper()
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		sent, err = p.PublishTx(ctx, tx, []string{"q"})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx), "the caller's transaction commits")
		marker++
		require.NoError(t, st.NotifyAlone(ctx, db, []string{ch}, "marker "+strconv.Itoa(marker)))
		first = next()
		if first == "" { // the transaction's poke (no origin), then the marker
			require.Equal(t, "marker "+strconv.Itoa(marker), next())
		}
		return sent, first
	}

	sent, first := insertTx()
	require.True(t, sent)
	require.Empty(t, first, "below the limit the poke rides the transaction")

	// batch sends n notifications of about 7,000 bytes each, all different (a transaction sends
	// identical ones once), on a channel only the stuck session listens to.
	batch := 0
	notify := func(n int) {
		batch++
		_, err := db.Exec(ctx, `SELECT count(pg_notify('gd_stuck', repeat(md5(($1::int * 100000 + g)::text), 218)))
			FROM generate_series(1, $2::int) AS g`, batch, n)
		require.NoError(t, err)
	}
	stuck, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer stuck.Release()
	_, err = stuck.Exec(ctx, "LISTEN gd_stuck")
	require.NoError(t, err)
	stx, err := stuck.Begin(ctx)
	require.NoError(t, err)
	_, err = stx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	for range 20 { // 14 MB: about 0.17% of the queue
		notify(100)
	}
	var usage float64
	require.NoError(t, db.QueryRow(ctx, "SELECT pg_notification_queue_usage()").Scan(&usage))
	require.Greater(t, usage, tm.rideBelow, "the stuck session holds the queue")

	// The transport reads the usage off the callers' path once its last reading is half a
	// second old: the transactions that come before it may still carry their pokes (harmless:
	// the queue is far from full); from then on none does.
	rode := 0
	for sent, first := insertTx(); sent; sent, first = insertTx() {
		require.Empty(t, first, "a transaction that carried its poke")
		rode++
		require.Less(t, rode, 100, "the transport never read the filling queue")
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 3 {
		sent, first := insertTx()
		require.False(t, sent, "try %d", i)
		require.Equal(t, "marker "+strconv.Itoa(marker), first, "try %d: the transaction committed without a notification", i)
	}
	require.Equal(t, 1, l.count("NOTIFY queue is filling up"), "said once")

	// The session ends (its connection closed, not read into the pool's: the queue holds 14 MB),
	// and the queue's tail moves past what it held (reading the usage moves it); pokes ride
	// transactions again.
	require.NoError(t, stuck.Conn().Close(ctx))
	for deadline := time.Now().Add(30 * time.Second); usage >= tm.rideBelow; time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the queue read: %.4f in use", usage)
		require.NoError(t, db.QueryRow(ctx, "SELECT pg_notification_queue_usage()").Scan(&usage))
	}
	declined := 0
	for sent, first = insertTx(); !sent; sent, first = insertTx() {
		require.Equal(t, "marker "+strconv.Itoa(marker), first)
		declined++
		require.Less(t, declined, 100, "the transport never read the emptied queue")
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, first, "the transaction carried its poke")
	require.Equal(t, 1, l.count("pokes ride callers' transactions again"))
}
