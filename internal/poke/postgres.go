// Package poke holds the PokePostgres transport: pokes over LISTEN/NOTIFY, one channel per queue,
// so that only the nodes running a queue hear its pokes.
package poke

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/spell"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is an open PokePostgres transport of one client. It listens on a connection of its
// own (not one of the pool's), opened from the pool's configuration, and sends through the pool,
// from one goroutine that coalesces pokes made while the previous send was in flight.
type Postgres struct {
	store    *store.Store
	pool     *pgxpool.Pool
	origin   string
	client   string
	log      *slog.Logger
	wake     func(string)
	queues   []string
	channels map[string]string // channel → queue, for the queues this client runs
	// check is the channel of the startup self-check, random per transport.
	check string
	t     timings

	mu      sync.Mutex
	pending map[string]struct{}
	kick    chan struct{}
	// queueFull keeps the log of PublishTx declining for a filling NOTIFY queue short.
	queueFull spell.Log
	// usage is the share of the server's NOTIFY queue in use that the transport read last
	// (float64 bits), usageAt when (Unix ns; 0: never); sample asks the sampler for a new one.
	usage, usageAt atomic.Int64
	sample         chan struct{}

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Backoff bounds of the listener's reconnects.
const (
	minRetry = 100 * time.Millisecond
	maxRetry = 5 * time.Second
)

// timings are the listener's bounds (a struct so that tests can shorten them).
type timings struct {
	// idle: a listener that heard nothing for this long pings its connection, so that a
	// half-open one (a peer or a middlebox gone without a reset) is found and replaced.
	idle time.Duration
	// ping bounds that ping; connect bounds opening the listening connection and its LISTENs.
	ping, connect time.Duration
	// check is how long the startup self-check waits for its own notification.
	check time.Duration
	// rideBelow is the share of the server's NOTIFY queue in use from which pokes no longer ride
	// callers' transactions (PublishTx). PublishTx goes by the usage read last while it is
	// younger than usageStale, and asks for a new reading once it is older than usageFresh.
	rideBelow              float64
	usageFresh, usageStale time.Duration
}

var defaultTimings = timings{idle: 30 * time.Second, ping: 5 * time.Second, connect: 10 * time.Second, check: time.Second,
	rideBelow: 0.5, usageFresh: 500 * time.Millisecond, usageStale: 5 * time.Second}

// Open starts the transport: if the client runs queues, it connects and LISTENs on their
// channels before returning (a failure is returned: Start fails with it); afterwards a broken
// listening connection is reopened with backoff, and every local queue is poked once it is back,
// since pokes sent meanwhile were lost. A listener that hears nothing for a while pings its
// connection, so that a half-open one is replaced too.
//
// Right after it starts listening, the transport checks that LISTEN works on this path: it
// notifies a random channel of its own through the pool and waits up to a second to hear it.
// Behind a transaction-pooling proxy (PgBouncer in transaction mode) a LISTEN is not kept by the
// session: the check fails, the transport logs "poke degraded" once, and the queues rely on their
// poll. Start is not held up by the check.
func Open(ctx context.Context, st *store.Store, pool *pgxpool.Pool, client, origin string, queues []string,
	wake func(string), log *slog.Logger) (*Postgres, error) {
	return open(ctx, st, pool, client, origin, queues, wake, log, defaultTimings)
}

func open(ctx context.Context, st *store.Store, pool *pgxpool.Pool, client, origin string, queues []string,
	wake func(string), log *slog.Logger, t timings) (*Postgres, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	p := &Postgres{store: st, pool: pool, origin: origin, client: client, log: log, wake: wake, queues: queues,
		channels: map[string]string{}, pending: map[string]struct{}{}, kick: make(chan struct{}, 1), sample: make(chan struct{}, 1),
		check: "gd.check." + hex.EncodeToString(b[:]), t: t}
	for _, q := range queues {
		p.channels[st.PokeChannel(q)] = q
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	if len(queues) > 0 {
		conn, keep, err := p.listen(ctx)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("PokePostgres: listen for the pokes of %d queues: %w", len(queues), err)
		}
		p.wg.Add(1)
		go p.receive(bg, conn, keep)
	}
	p.wg.Add(2)
	go p.send(bg)
	go p.sampleUsage(bg)
	return p, nil
}

// Publish queues pokes for the sender; it never blocks.
func (p *Postgres) Publish(queues []string) {
	p.mu.Lock()
	for _, q := range queues {
		p.pending[q] = struct{}{}
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// PublishTx sends the pokes inside tx: they leave when it commits, and every node running the
// queues hears them, this one included (the insert did not wake it directly). While the server's
// NOTIFY queue is half full or more it sends none and returns false: a full queue fails the
// commit of every transaction that notified, and the caller's must not fail for a poke (the
// caller then relies on its commit watch and the other nodes' poll). The usage comes from the
// sampler, read off the callers' path (reading it moves the queue's tail, under the queue's
// locks), or, when the last reading is stale, from the statement that sends the pokes.
func (p *Postgres) PublishTx(ctx context.Context, tx pgx.Tx, queues []string) (bool, error) {
	var sent bool
	var usage float64
	now := time.Now()
	at := p.usageAt.Load()
	if age := now.Sub(time.Unix(0, at)); at == 0 || age > p.t.usageStale {
		var err error
		if sent, usage, err = p.store.NotifyBelow(ctx, tx, p.chans(queues), "", p.t.rideBelow); err != nil {
			return false, fmt.Errorf("gendurable: poke in transaction: %w", err)
		}
		p.setUsage(usage, now)
	} else {
		if age > p.t.usageFresh {
			select {
			case p.sample <- struct{}{}:
			default:
			}
		}
		usage = math.Float64frombits(uint64(p.usage.Load()))
		if usage < p.t.rideBelow {
			if err := p.store.Notify(ctx, tx, p.chans(queues), ""); err != nil {
				return false, fmt.Errorf("gendurable: poke in transaction: %w", err)
			}
			sent = true
		}
	}
	if !sent {
		p.queueFull.Failed(p.log, "gendurable: the server's NOTIFY queue is filling up (a session that listens reads none of it "+
			"while it sits in a transaction): pokes no longer ride callers' transactions, whose commits would fail once it is full; "+
			"a client that works the queue starts the rows it inserted once it sees them committed, and the other nodes find them by polling",
			"client", p.client, "queue_usage", usage)
		return false, nil
	}
	p.queueFull.Succeeded(p.log, "gendurable: pokes ride callers' transactions again", "client", p.client)
	return true, nil
}

func (p *Postgres) setUsage(u float64, at time.Time) {
	p.usage.Store(int64(math.Float64bits(u)))
	p.usageAt.Store(at.UnixNano())
}

// sampleUsage reads the share of the server's NOTIFY queue in use when PublishTx asks.
func (p *Postgres) sampleUsage(ctx context.Context) {
	defer p.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.sample:
		}
		at := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		u, err := p.store.NotifyQueueUsage(sctx, p.pool)
		cancel()
		if err == nil {
			p.setUsage(u, at) // (a failed read leaves the last one to go stale)
		}
	}
}

// Close stops the listener and the sender; pokes not yet sent are dropped (the poll finds
// their rows).
func (p *Postgres) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

func (p *Postgres) chans(queues []string) []string {
	out := make([]string, len(queues))
	for i, q := range queues {
		out[i] = p.store.PokeChannel(q)
	}
	return out
}

// listen opens the listening connection and LISTENs on the queues' channels and the
// self-check's, within the connect bound. keep is how often the connection must run a statement
// to outlive the server's idle_session_timeout (0: never): a session that only waits for
// notifications is idle to the server, however many arrive.
func (p *Postgres) listen(ctx context.Context) (conn *pgx.Conn, keep time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.t.connect)
	defer cancel()
	// Dial leaves out the pool's notification callback, if the application set one: it would take
	// the notifications that WaitForNotification must return.
	conn, err = store.Dial(ctx, p.pool, "gendurable poke listener "+p.client)
	if err != nil {
		return nil, 0, err
	}
	chans := make([]string, 0, len(p.channels)+1)
	for ch := range p.channels {
		chans = append(chans, ch)
	}
	chans = append(chans, p.check)
	if err := p.store.Listen(ctx, conn, chans); err != nil {
		_ = conn.Close(context.Background())
		return nil, 0, err
	}
	idle, err := p.store.IdleSessionTimeout(ctx, conn)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, 0, err
	}
	// A third of the timeout leaves room for a late wake-up and the ping's trip.
	return conn, idle / 3, nil
}

func (p *Postgres) receive(ctx context.Context, conn *pgx.Conn, keep time.Duration) {
	defer p.wg.Done()
	defer func() {
		if conn != nil {
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
	}()
	// The listening connection's last statement was listen's; the self-check goes through the
	// pool and may take a while.
	lastStatement := time.Now()
	checkUntil := p.sendCheck(ctx) // zero: no self-check pending
	for {
		checking := !checkUntil.IsZero()
		wait := p.t.idle
		if checking {
			wait = time.Until(checkUntil)
		}
		if keep > 0 {
			wait = min(wait, time.Until(lastStatement.Add(keep)))
		}
		// With wait <= 0 the context is done at once: pgx still returns a notification it has
		// buffered (one that arrived during a ping, say) before reporting the deadline.
		wctx, cancel := context.WithTimeout(ctx, wait)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed() {
			// Nothing heard for a while, or the keep-alive is due (the connection is still
			// usable after such a timeout).
			if checking && !time.Now().Before(checkUntil) {
				checkUntil = time.Time{}
				p.log.Warn("gendurable: poke degraded: this client's LISTEN does not hear notifications "+
					"(a transaction-pooling proxy such as PgBouncer?); pokes from other nodes are lost and "+
					"its queues find their rows by polling (PollInterval)", "client", p.client, "waited", p.t.check)
				continue
			}
			// A half-open connection (a peer or middlebox gone without a reset) would never
			// deliver again: make sure this one still answers. The ping is also the statement
			// that keeps the session from the server's idle_session_timeout.
			pctx, pcancel := context.WithTimeout(ctx, p.t.ping)
			err = conn.Ping(pctx)
			pcancel()
			lastStatement = time.Now()
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			err = fmt.Errorf("the idle listening connection did not answer a ping: %w", err)
		}
		if err != nil {
			p.log.Warn("gendurable: poke listener lost its connection; reconnecting (queues are polled meanwhile)",
				"client", p.client, "error", err)
			checkUntil = time.Time{}
			_ = conn.Close(context.Background())
			if conn, keep = p.reconnect(ctx); conn == nil {
				return
			}
			lastStatement = time.Now()
			continue
		}
		if n.Channel == p.check {
			if checking {
				checkUntil = time.Time{}
				p.log.Debug("gendurable: poke self-check passed: LISTEN hears notifications", "client", p.client)
			}
			continue
		}
		if n.Payload == p.origin {
			continue // this client woke its own scheduler already
		}
		if q, ok := p.channels[n.Channel]; ok {
			p.wake(q)
		}
	}
}

// sendCheck notifies the self-check's channel through the pool and returns until when to wait
// for it (zero if it could not be sent: the sender logs failures to send).
func (p *Postgres) sendCheck(ctx context.Context) time.Time {
	sctx, cancel := context.WithTimeout(ctx, p.t.ping)
	defer cancel()
	if err := p.store.NotifyAlone(sctx, p.pool, []string{p.check}, p.origin); err != nil {
		p.log.Debug("gendurable: poke self-check not sent", "client", p.client, "error", err)
		return time.Time{}
	}
	return time.Now().Add(p.t.check)
}

// reconnect reopens the listening connection with backoff until it succeeds (nil once ctx ends),
// then pokes every local queue: pokes sent while it was down are lost.
func (p *Postgres) reconnect(ctx context.Context) (*pgx.Conn, time.Duration) {
	wait := minRetry
	for {
		select {
		case <-ctx.Done():
			return nil, 0
		case <-time.After(wait):
		}
		conn, keep, err := p.listen(ctx)
		if err == nil {
			p.log.Info("gendurable: poke listener reconnected", "client", p.client)
			for _, q := range p.queues {
				p.wake(q)
			}
			return conn, keep
		}
		if ctx.Err() != nil {
			return nil, 0
		}
		// The loss was logged as a warning; the retries are detail.
		p.log.Debug("gendurable: poke listener could not reconnect; retrying", "client", p.client, "in", wait, "error", err)
		wait = min(wait*2, maxRetry)
	}
}

func (p *Postgres) send(ctx context.Context) {
	defer p.wg.Done()
	var failing spell.Log
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		p.mu.Lock()
		queues := make([]string, 0, len(p.pending))
		for q := range p.pending {
			queues = append(queues, q)
		}
		clear(p.pending)
		p.mu.Unlock()
		if len(queues) == 0 {
			continue
		}
		// After a restart or a change of primary the pool hands out its dead connections one by
		// one: a poke sent on one is sent again at once on the next (a poke twice is harmless),
		// not lost until the poll finds its rows.
		sendCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := store.RetryConnLost(sendCtx, func() error {
			return p.store.NotifyAlone(sendCtx, p.pool, p.chans(queues), p.origin)
		})
		cancel()
		switch {
		case err == nil:
			failing.Succeeded(p.log, "gendurable: pokes are sent again", "client", p.client)
		case !errors.Is(err, context.Canceled):
			failing.Failed(p.log, "gendurable: pokes could not be sent; other nodes find the rows by polling",
				"client", p.client, "error", err)
		}
	}
}

var _ engine.TxPoker = (*Postgres)(nil)
