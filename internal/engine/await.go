package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/internal/store"
)

// awaiter is the await bridge's watcher: every caller waiting for an instance to settle on this
// node registers here. Each tick, one probe statement reads the rows of every waiter that have
// settled (none while nobody waits); an outcome this node commits for a waited-on instance is
// pushed: its id is probed at once instead of at the next tick.
type awaiter struct {
	e       *Engine
	mu      sync.Mutex
	waiters map[int64][]*waiter
	hot     map[int64]struct{}
	n       atomic.Int64 // registered waiters, read without the lock on the commit path
	kick    chan struct{}
	// gone is closed when the watcher exits: its waiters fall back to polling on their own.
	gone chan struct{}
	// watching says the watcher runs (between Start and Stop).
	watching atomic.Bool
}

type waiter struct {
	id     int64
	parked bool // an awaiting row is an answer
	answer chan store.Probe
}

func newAwaiter(e *Engine) *awaiter {
	return &awaiter{e: e, waiters: map[int64][]*waiter{}, hot: map[int64]struct{}{},
		kick: make(chan struct{}, 1), gone: make(chan struct{})}
}

// ErrAwaitDeadline is returned by Await when timeout passed before the instance settled.
var ErrAwaitDeadline = errors.New("await deadline passed")

// AwaitGrace bounds the read an Await caller makes of the row at its deadline (to answer busy
// with it): one await tick, at least 100ms. A caller therefore gets its answer by its timeout
// plus this grace, even when the database hangs.
func (e *Engine) AwaitGrace() time.Duration { return max(e.cfg.AwaitTick, 100*time.Millisecond) }

// Await waits until the instance id settles (terminal; or parked, when parked says so) and
// returns its row as the probe read it, or the probe's Missing answer. It returns
// ErrAwaitDeadline once timeout has passed, and ctx's error if ctx ends first. On a running
// engine the watcher answers; otherwise Await polls the row every tick itself. Its own reads are
// bounded by the deadline: a hung connection cannot hold the caller past it.
func (e *Engine) Await(ctx context.Context, db store.DB, id int64, parked bool, timeout time.Duration) (store.Probe, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A read that fails for a reason worth retrying (a lost connection, a restarting server) is
	// tried again at the next tick, until the deadline: the caller gets an answer, or busy, or
	// (if the database still cannot be read then) an error.
	probe := func() (store.Probe, bool, error) {
		p, ok, err := e.probeOne(rctx, db, id, parked)
		switch {
		case err == nil || ctx.Err() != nil:
			return p, ok, err
		case rctx.Err() != nil:
			return store.Probe{}, false, ErrAwaitDeadline
		case store.Retryable(err):
			return store.Probe{}, false, nil
		}
		return p, ok, err
	}
	a := e.awaits
	var w *waiter
	if a.watching.Load() {
		w = a.register(id, parked)
		defer a.unregister(w)
	}
	// Registered first, read second: a settle between the two is seen by this read, one
	// after it by the push or the next tick.
	if p, ok, err := probe(); err != nil || ok {
		return p, err
	}
	tick := time.NewTicker(e.cfg.AwaitTick)
	defer tick.Stop()
	var answer <-chan store.Probe
	var gone <-chan struct{}
	if w != nil {
		answer, gone = w.answer, a.gone
		tick.Stop() // the watcher polls for us (and retries its failed probes)
	}
	for {
		select {
		case p := <-answer:
			return p, nil
		case <-gone:
			gone, answer = nil, nil
			tick.Reset(e.cfg.AwaitTick)
		case <-tick.C:
			if p, ok, err := probe(); err != nil || ok {
				return p, err
			}
		case <-deadline.C:
			return store.Probe{}, ErrAwaitDeadline
		case <-ctx.Done():
			return store.Probe{}, context.Cause(ctx)
		}
	}
}

func (e *Engine) probeOne(ctx context.Context, db store.DB, id int64, parked bool) (store.Probe, bool, error) {
	ps, err := e.store.AwaitProbe(ctx, db, []int64{id}, []bool{parked})
	if err != nil {
		return store.Probe{}, false, fmt.Errorf("read instance %d: %w", id, err)
	}
	if len(ps) == 0 {
		return store.Probe{}, false, nil
	}
	return ps[0], true, nil
}

func (a *awaiter) register(id int64, parked bool) *waiter {
	w := &waiter{id: id, parked: parked, answer: make(chan store.Probe, 1)}
	a.mu.Lock()
	a.waiters[id] = append(a.waiters[id], w)
	a.mu.Unlock()
	a.n.Add(1)
	return w
}

func (a *awaiter) unregister(w *waiter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ws := a.waiters[w.id]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			a.n.Add(-1)
			break
		}
	}
	if len(ws) == 0 {
		delete(a.waiters, w.id)
	} else {
		a.waiters[w.id] = ws
	}
}

// push asks for an immediate probe of id if someone waits on it: this node just committed an
// outcome that may have settled it.
func (a *awaiter) push(id int64) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	_, waited := a.waiters[id]
	if waited {
		a.hot[id] = struct{}{}
	}
	a.mu.Unlock()
	if waited {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

// watch probes every tick while anyone waits, and at once for pushed ids, until stop closes.
func (a *awaiter) watch(stop <-chan struct{}) {
	a.watching.Store(true)
	defer func() {
		a.watching.Store(false)
		close(a.gone)
	}()
	t := time.NewTicker(a.e.cfg.AwaitTick)
	defer t.Stop()
	for {
		all := false
		select {
		case <-stop:
			return
		case <-a.kick:
		case <-t.C:
			all = true
		}
		ids, parked := a.batch(all)
		if len(ids) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(a.e.baseCtx, 10*time.Second)
		ps, err := a.e.store.AwaitProbe(ctx, a.e.pool, ids, parked)
		cancel()
		if err != nil {
			if a.e.baseCtx.Err() == nil {
				a.e.log.Warn("gendurable: await probe failed; retrying at the next tick", "client", a.e.cfg.Name,
					"waiters", len(ids), "error", err)
			}
			continue
		}
		a.answer(ps)
	}
}

// batch lists the ids to probe: every waited-on id (all), or the pushed ones. An id with
// waiters of both kinds is probed as parked; answer sorts out who a parked row answers.
func (a *awaiter) batch(all bool) ([]int64, []bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []int64
	var parked []bool
	add := func(id int64, ws []*waiter) {
		p := false
		for _, w := range ws {
			p = p || w.parked
		}
		ids = append(ids, id)
		parked = append(parked, p)
	}
	if all {
		for id, ws := range a.waiters {
			add(id, ws)
		}
	} else {
		for id := range a.hot {
			if ws, ok := a.waiters[id]; ok {
				add(id, ws)
			}
		}
	}
	clear(a.hot)
	return ids, parked
}

// answer hands each settled row to the waiters it answers and forgets them.
func (a *awaiter) answer(ps []store.Probe) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range ps {
		ws := a.waiters[p.ID]
		keep := ws[:0]
		for _, w := range ws {
			if !p.Missing && !p.Instance.Status.Terminal() && !w.parked {
				keep = append(keep, w)
				continue
			}
			w.answer <- p // buffered, one answer per waiter
			a.n.Add(-1)
		}
		if len(keep) == 0 {
			delete(a.waiters, p.ID)
		} else {
			a.waiters[p.ID] = keep
		}
	}
}
