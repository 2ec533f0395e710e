// Package redispoke is gendurable's poke transport over Redis Pub/Sub: Config.Poke =
// redispoke.New(&redis.Options{Addr: "redis:6379"}) makes an insert on one node start at once on
// every node that runs its queue, instead of at their next poll.
//
// # Channels and messages
//
// Each queue of each schema is a channel of its own, "gendurable:<schema>:<queue>" (schema names
// hold no ':', so the name is unambiguous), and a client subscribes only to the queues it runs,
// so Redis delivers a poke only to the nodes that can act on it. The message is the publishing
// client's origin tag; a client ignores its own messages, since an insert wakes the inserting
// client's schedulers directly. Publishing never blocks the caller: pokes made while a send is in
// flight coalesce, and one goroutine per client sends them pipelined.
//
// # When to choose it over PokePostgres
//
// gendurable.PokePostgres needs nothing but the database, and its pokes of InsertTx and
// SignalTx leave with the caller's commit (while the server's NOTIFY queue is less than half
// full). Choose this transport instead when:
//   - the database's connections are scarce: PokePostgres holds one LISTEN connection per client
//     outside the pool, this transport holds none;
//   - the clients reach Postgres through PgBouncer in transaction pooling mode, where LISTEN does
//     not work;
//   - there are many nodes: Redis fans the pokes out, where NOTIFY takes a lock at every commit
//     that sends one, and every listening backend scans every notification sent, on any channel.
//
// # Costs
//
//   - A Redis to run, reachable from every node, and one more thing that can be down. Pokes are
//     best effort: while Redis is unreachable, each queue finds its rows by polling
//     (Config.PollInterval), and nothing is lost.
//   - Two Redis connections per client (one subscribed, one publishing), opened from a copy of
//     the options at Start and closed at Stop.
//   - Pokes of InsertTx, InsertManyTx and SignalTx are not published: the transport cannot see
//     the caller's commit, and a poke must not arrive before its rows are visible. Other nodes
//     find those rows by polling.
//
// # Failures
//
// Client.Start fails if Redis cannot be reached (or refuses the credentials), with an error
// naming its address: a wrong address or password then shows at deploy time, rather than as
// every cross-node insert quietly waiting out the poll interval. Once started, the transport rides out outages on its own: a lost
// subscription (a broken connection, or a silent one that leaves a ping unanswered) is logged
// once and re-established with backoff; once it is back, every queue the client runs is woken,
// since the pokes sent meanwhile were lost. Failed sends are logged once until sending works
// again. Logs go to the client's Config.Logger; go-redis logs its own dial failures through its
// package-level logger (redis.SetLogger).
package redispoke

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/redis/go-redis/v9"
)

const (
	// channelPrefix starts every channel name: "gendurable:<schema>:<queue>".
	channelPrefix = "gendurable:"
	// minRetry and maxRetry bound the backoff between attempts to subscribe again.
	minRetry = 100 * time.Millisecond
	maxRetry = 5 * time.Second
	// confirmTimeout bounds the wait for Redis to confirm a subscription.
	confirmTimeout = 5 * time.Second
	// sendTimeout bounds one pipelined send.
	sendTimeout = 5 * time.Second
	// pingAfter is how long a subscription may be silent before it is pinged; one that does not
	// answer within as long again is considered lost (a half-open connection never errors).
	pingAfter = 15 * time.Second
)

// New returns a transport that pokes over Redis Pub/Sub at the server opts describes (nil: the
// go-redis defaults, localhost:6379). The options are copied: each client that uses the
// transport opens a redis.Client of its own from them at Start, and closes it at Stop. Timeouts
// and retries are the options' (DialTimeout, MaxRetries, DialerRetries): they bound how long
// Start takes to fail when Redis is unreachable.
func New(opts *redis.Options) gendurable.PokeTransport {
	var o redis.Options
	if opts != nil {
		o = *opts
	}
	return transport{opts: o, pingAfter: pingAfter}
}

type transport struct {
	opts      redis.Options
	pingAfter time.Duration
}

// Open connects for one client: it pings Redis and subscribes to the channels of node.Queues,
// and returns once Redis has confirmed every subscription. An unreachable Redis is an error that
// names its address.
func (t transport) Open(ctx context.Context, node gendurable.PokeNode) (gendurable.PokeConn, error) {
	opts := t.opts
	client := redis.NewClient(&opts)
	addr := client.Options().Addr
	log := node.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &conn{
		client:    client,
		addr:      addr,
		origin:    node.Origin,
		schema:    node.Schema,
		queues:    append([]string(nil), node.Queues...),
		wake:      node.Wake,
		log:       log.With("client", node.Client, "redis", addr),
		channels:  map[string]string{},
		pending:   map[string]struct{}{},
		kick:      make(chan struct{}, 1),
		pingAfter: t.pingAfter,
	}
	for _, q := range c.queues {
		c.channels[c.channel(q)] = q
	}
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redispoke: connect to Redis at %s: %w", addr, err)
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	if len(c.queues) > 0 {
		ps, err := c.subscribe(ctx)
		if err != nil {
			cancel()
			_ = client.Close()
			return nil, fmt.Errorf("redispoke: subscribe to the pokes of %d queues at Redis %s: %w", len(c.queues), addr, err)
		}
		c.wg.Add(1)
		go c.listen(bg, ps)
	}
	c.wg.Add(1)
	go c.send(bg)
	return c, nil
}

// conn is the transport opened for one client.
type conn struct {
	client    *redis.Client
	addr      string
	origin    string
	schema    string
	queues    []string
	wake      func(string)
	log       *slog.Logger
	channels  map[string]string // channel → queue, for the queues this client runs
	pingAfter time.Duration

	mu      sync.Mutex
	pending map[string]struct{} // queues to poke at the next send
	sub     *redis.PubSub       // the subscription being made or used, closed by Close
	closed  bool

	kick      chan struct{}
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// channel is the Pub/Sub channel of one queue of this client's schema.
func (c *conn) channel(queue string) string {
	return channelPrefix + c.schema + ":" + queue
}

// Publish queues pokes for the sender; it never blocks.
func (c *conn) Publish(queues []string) {
	c.mu.Lock()
	for _, q := range queues {
		c.pending[q] = struct{}{}
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Close stops listening and sending, and closes the client's Redis connections. Pokes not yet
// sent are dropped (the poll finds their rows).
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.mu.Lock()
		c.closed = true
		sub := c.sub
		c.sub = nil
		c.mu.Unlock()
		if sub != nil {
			_ = sub.Close() // ends a receive blocked on the connection
		}
		if err := c.client.Close(); err != nil {
			c.closeErr = fmt.Errorf("redispoke: close the connections to Redis %s: %w", c.addr, err)
		}
		c.wg.Wait()
	})
	return c.closeErr
}

// errClosed ends a subscription attempt that raced with Close.
var errClosed = errors.New("redispoke: closed")

// subscribe subscribes to the channels of the client's queues and waits until Redis has
// confirmed them all: from then on, every poke published to them is heard.
func (c *conn) subscribe(ctx context.Context) (*redis.PubSub, error) {
	sub := c.client.Subscribe(ctx) // no channels yet: connects on the first command
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = sub.Close()
		return nil, errClosed
	}
	c.sub = sub // Close may now end any wait below
	c.mu.Unlock()
	fail := func(err error) (*redis.PubSub, error) {
		c.drop(sub)
		return nil, err
	}
	chans := make([]string, 0, len(c.channels))
	for ch := range c.channels {
		chans = append(chans, ch)
	}
	if err := sub.Subscribe(ctx, chans...); err != nil {
		return fail(err)
	}
	for {
		msg, err := sub.ReceiveTimeout(ctx, confirmTimeout)
		if err != nil {
			return fail(err)
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Count == len(chans) {
				return sub, nil
			}
		case *redis.Message:
			c.deliver(m)
		}
	}
}

// drop closes sub and forgets it.
func (c *conn) drop(sub *redis.PubSub) {
	c.mu.Lock()
	if c.sub == sub {
		c.sub = nil
	}
	c.mu.Unlock()
	_ = sub.Close()
}

// listen wakes the local scheduler of every queue poked by another client, and subscribes again
// whenever the subscription is lost, until ctx ends.
func (c *conn) listen(ctx context.Context, sub *redis.PubSub) {
	defer c.wg.Done()
	for {
		err := c.receive(ctx, sub)
		c.drop(sub)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("redispoke: lost the subscription to Redis; subscribing again with backoff (queues are polled meanwhile)",
			"error", err)
		if sub = c.resubscribe(ctx); sub == nil {
			return
		}
		c.log.Info("redispoke: subscribed to Redis again; waking every queue, since pokes sent meanwhile were lost")
		for _, q := range c.queues {
			c.wake(q)
		}
	}
}

// receive delivers the messages of sub until it fails. A subscription silent for pingAfter is
// pinged: a half-open connection never reports an error, but leaves the ping unanswered.
func (c *conn) receive(ctx context.Context, sub *redis.PubSub) error {
	pinged := false
	for {
		msg, err := sub.ReceiveTimeout(ctx, c.pingAfter)
		var ne net.Error
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && errors.As(err, &ne) && ne.Timeout():
			if pinged {
				return fmt.Errorf("no answer to a ping within %v", c.pingAfter)
			}
			if err := sub.Ping(ctx); err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			pinged = true
			continue
		case err != nil:
			return err
		}
		pinged = false
		if m, ok := msg.(*redis.Message); ok {
			c.deliver(m)
		}
	}
}

// deliver wakes the queue of a poke, unless this client sent it (it woke itself already).
func (c *conn) deliver(m *redis.Message) {
	if m.Payload == c.origin {
		return
	}
	if q, ok := c.channels[m.Channel]; ok {
		c.wake(q)
	}
}

// resubscribe subscribes again, with jittered exponential backoff so that the nodes of a cluster
// do not all return at once after an outage, until it succeeds (nil once ctx ends).
func (c *conn) resubscribe(ctx context.Context) *redis.PubSub {
	wait := minRetry
	for {
		timer := time.NewTimer(wait/2 + rand.N(wait))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		sub, err := c.subscribe(ctx)
		if err == nil {
			return sub
		}
		if ctx.Err() != nil {
			return nil
		}
		c.log.Debug("redispoke: could not subscribe again; retrying", "in", wait, "error", err)
		wait = min(wait*2, maxRetry)
	}
}

// send publishes pending pokes, one pipelined batch at a time: pokes made while a batch is in
// flight coalesce into the next. Failures are logged once until a send succeeds again.
func (c *conn) send(ctx context.Context) {
	defer c.wg.Done()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		}
		c.mu.Lock()
		queues := make([]string, 0, len(c.pending))
		for q := range c.pending {
			queues = append(queues, q)
		}
		clear(c.pending)
		c.mu.Unlock()
		if len(queues) == 0 {
			continue
		}
		sendCtx, cancel := context.WithTimeout(ctx, sendTimeout)
		pipe := c.client.Pipeline()
		for _, q := range queues {
			pipe.Publish(sendCtx, c.channel(q), c.origin)
		}
		_, err := pipe.Exec(sendCtx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			failing = true
			c.log.Warn("redispoke: pokes could not be sent; other nodes find the rows by polling", "error", err)
		case err == nil && failing:
			failing = false
			c.log.Info("redispoke: pokes are sent again")
		}
	}
}
