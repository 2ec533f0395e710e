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
// and runs the node's hot statements on each with nothing to claim, apply or insert.

// warmTimeout bounds the warm-up. It takes a connection only while the pool has one idle or room
// for one, waits at most warmWait for it, and never holds more than half the pool: the
// application and the node's own loops (or other clients on the same pool) must not wait on it.
const (
	warmTimeout = 10 * time.Second
	warmWait    = 100 * time.Millisecond
)

// warmPool is what the warm-up needs of the pool: a *pgxpool.Pool.
type warmPool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Stat() *pgxpool.Stat
}

// warmConns is how many pool connections this node's loops may hold at once: a pick per queue,
// the committers, and each sweep (registry, pauses, reaper, schedules, GC) and the inserts and
// awaits, capped by half the pool's size.
func (e *Engine) warmConns(maxConns int) int {
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
	return min(n, maxConns/2)
}

// warm opens the connections the node's loops use together and runs its hot statements on each:
// an insert of no rows, and on a node with queues a pick that may claim none and an outcome batch
// of none. None of them writes a row. It gives up quietly: a cold connection is slow, not wrong.
func (e *Engine) warm() {
	defer e.bg.Done()
	p, ok := e.pool.(warmPool)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(e.bgCtx, warmTimeout)
	defer cancel()
	want := e.warmConns(int(p.Stat().MaxConns()))
	conns := make([]*pgxpool.Conn, 0, want)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range want {
		if st := p.Stat(); st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns() {
			break
		}
		actx, acancel := context.WithTimeout(ctx, warmWait)
		c, err := p.Acquire(actx)
		acancel()
		if err != nil {
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
			if err := e.warmConn(ctx, c, queue); err != nil && ctx.Err() == nil {
				e.log.Debug("gendurable: could not warm a pool connection", "client", e.cfg.Name, "error", err)
			}
		}()
	}
	wg.Wait()
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
