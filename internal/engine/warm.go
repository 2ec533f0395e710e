package engine

import (
	"context"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Warming the pool. A connection's first run of a statement is slow: the server builds its caches
// of the tables, indexes and trigger functions the statement touches and plans it, and pgx
// prepares it (a round trip). On the instances table that took up to 35 ms for an outcome (parse,
// plan and trigger compilation) where a warm connection takes 0.3 ms. A pool opens a connection
// when every open one is busy, which happens first when a node's sweeps coincide with its picks
// and outcomes (the reaper's and the registry's first rounds, 5 s after Start): a step's pickup
// then waited on that connection's first statements. So Start warms the pool in the background:
// it holds as many connections at once as the node's loops can use together, which opens them,
// and runs on each the statements that have nothing to do when given nothing: an insert of no
// rows (the table's caches), and on a node with queues the plain pick with a limit of 0 and the
// plain outcome batch of no outcomes, which a queue without gates, rate limits or fairness keys
// runs for every step.

// warmTimeout bounds the warm-up, opening its connections included. It takes a connection only
// while the pool has one idle or room for one and while less than half the pool is in use (its
// own included), and waits at most warmWait for an idle one: the application and the node's own
// loops (or other clients on the same pool) must not wait on it.
const (
	warmTimeout = 3 * time.Second
	warmWait    = 100 * time.Millisecond
)

// warmPool is what the warm-up needs of the pool: a *pgxpool.Pool.
type warmPool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Stat() *pgxpool.Stat
}

// warmConns is how many pool connections this node's loops may hold at once: a pick per queue,
// the committers, and each sweep (registry, pauses, reaper, schedules, GC) and the inserts and
// awaits.
func (e *Engine) warmConns() int {
	n := 2 // the registry, and an insert or await of the application's
	if len(e.runners) > 0 {
		n += len(e.runners) + e.cfg.Committers + 1 // + the pauses
	}
	if e.cfg.ReaperInterval > 0 {
		n++
	}
	if e.firer != nil {
		n++
	}
	if e.cfg.GCInterval > 0 {
		n++
	}
	return n
}

// warm opens the connections the node's loops use together and runs the hot statements on each,
// releasing each connection once its statements ran. None of them writes a row. It gives up
// quietly: a cold connection is slow, not wrong.
func (e *Engine) warm() {
	defer e.bg.Done()
	p, ok := e.pool.(warmPool)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(e.bgCtx, warmTimeout)
	defer cancel()
	want := e.warmConns()
	conns := make([]*pgxpool.Conn, 0, want)
	for range want {
		c := warmAcquire(ctx, p)
		if c == nil {
			break
		}
		conns = append(conns, c)
	}
	var queue string
	for q := range e.runners {
		queue = q
		break
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Release()
			if err := e.warmConn(ctx, c, queue); err != nil && ctx.Err() == nil {
				e.log.Debug("gendurable: could not warm a pool connection", "client", e.cfg.Name, "error", err)
			}
		}()
	}
	wg.Wait()
}

// warmAcquire takes a connection for the warm-up, or returns nil: half the pool is in use, or it
// is full and none is idle within warmWait.
func warmAcquire(ctx context.Context, p warmPool) *pgxpool.Conn {
	st := p.Stat()
	if 2*st.AcquiredConns() >= st.MaxConns() {
		return nil
	}
	if st.TotalConns() >= st.MaxConns() {
		if st.IdleConns() == 0 {
			return nil
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, warmWait)
		defer cancel()
	} // else there is room for one: opening it may take a while (TLS, a remote server)
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil
	}
	return c
}

// warmConn runs the hot statements on c: queue, if not empty, is one of the node's queues (the
// pick's text is the same for every queue of a node).
func (e *Engine) warmConn(ctx context.Context, c *pgxpool.Conn, queue string) error {
	if err := e.store.WarmInsert(ctx, c); err != nil {
		return err
	}
	if queue == "" {
		return nil
	}
	if _, err := e.pickOnce(ctx, c, queue, 0, e.workerPrefix(queue)+"warm", 0, store.Hint{}, store.Lane{}); err != nil {
		return err
	}
	_, _, err := e.store.ApplyOutcomes(ctx, c, nil)
	return err
}
