package chaos

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/faultproxy"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// proxiedPool opens a pool to the tests' Postgres through a fault proxy of the test's own.
func proxiedPool(t *testing.T, url string, maxConns int32) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	proxy, err := faultproxy.New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(proxy.Port())
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		proxy.Heal()
		pool.Close()
		require.NoError(t, proxy.Close())
	})
	return pool, proxy
}

// timeline records when events and log lines happened.
type timeline struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (tl *timeline) mark(what string, at time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.at[what] = append(tl.at[what], at)
}

// after is how long after t0 what first happened (false: it has not). What happened before t0
// does not count: a beat that ran late on a loaded machine before the cut is no sign of the cut.
func (tl *timeline) after(what string, t0 time.Time) (time.Duration, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, at := range tl.at[what] {
		if !at.Before(t0) {
			return at.Sub(t0), true
		}
	}
	return 0, false
}

// A worker whose connections go half-open (a partition: nothing forwarded, nothing closed) is
// not pinned by them: every statement in flight gives up within StatementTimeout (a lease, at
// least 5s) and the heartbeat within its interval, so nothing of the worker hangs past lease + 5s;
// an Await caller still gets its answer by its deadline plus the grace. Once the path heals, the
// work completes. (Regression: picks and outcome commits waited 30s, and Await's own reads had
// no deadline at all.)
func TestHalfOpenConnectionsDoNotPinTheWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	pool, proxy := proxiedPool(t, e.url, 8)
	tl := &timeline{at: map[string][]time.Time{}}
	// The first steps wait for the cut, so that their outcomes are committed through the cut-off
	// connections however long a loaded machine takes to get to the cut.
	cut := make(chan struct{})
	m := linear("linear5", 300*time.Millisecond, func(*gendurable.Ctx) { <-cut })
	const lease = time.Second
	cfg := &gendurable.Config{
		Schema: e.schema, Machines: []gendurable.Machine{m}, Lease: lease, Heartbeat: 200 * time.Millisecond,
		PollInterval: 100 * time.Millisecond, Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 8}},
		Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			switch ev.Name {
			case gendurable.EventCommitFailed, gendurable.EventHeartbeatFailed, gendurable.EventSchedulerFailed:
				tl.mark(string(ev.Name), ev.At) // when it happened: hooks run behind
			}
		}},
	}
	cl, err := gendurable.NewClient(pool, cfg)
	require.NoError(t, err)
	start(t, cl)
	ctx := context.Background()
	inserter := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	const n = 4
	ids := make([]int64, n)
	for i := range ids {
		r, err := inserter.Insert(ctx, m.With(path{}), nil)
		require.NoError(t, err)
		ids[i] = r.ID
	}
	eventually(t, 10*time.Second, "steps running", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`) == n
	})

	t0 := time.Now()
	proxy.Blackhole(time.Hour)
	close(cut)
	// An Await caller on the cut-off client answers by its deadline plus the grace.
	const wait = time.Second
	a, err := cl.Await(ctx, ids[0], wait, nil)
	took := time.Since(t0)
	if err == nil {
		require.Equal(t, gendurable.AwaitBusy, a.Status)
	}
	// The deadline, plus the grace of the read of the row (a second: the database is not
	// answering), plus a loaded machine's scheduling.
	require.Less(t, took, wait+time.Second+300*time.Millisecond, "Await held its caller past its deadline + grace")
	t.Logf("Await answered after %v (%v)", took, err)

	bound := lease + 5*time.Second
	whats := []string{string(gendurable.EventHeartbeatFailed), string(gendurable.EventCommitFailed), string(gendurable.EventSchedulerFailed)}
	for deadline := time.Now().Add(bound + 2*time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		all := true
		for _, what := range whats {
			_, ok := tl.after(what, t0)
			all = all && ok
		}
		if all {
			break
		}
	}
	for _, what := range whats {
		d, ok := tl.after(what, t0)
		t.Logf("%s after %v (seen: %v)", what, d, ok)
		require.True(t, ok, "%s never happened within lease + 7s of the cut", what)
		require.LessOrEqual(t, d, bound, "%s only after %v: the worker was pinned past lease + 5s", what, d)
	}

	// Healed, the work completes.
	proxy.Heal()
	eventually(t, 60*time.Second, "all done after the heal", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'
			AND result = '{"i":5,"path":["s0","s1","s2","s3","s4"]}'::jsonb`) == n
	})
}
