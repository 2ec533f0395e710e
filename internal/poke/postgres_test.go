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
// transaction).
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
