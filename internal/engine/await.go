package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
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
	// final: the waiter's deadline came; the row in any status is its answer (guarded by the
	// awaiter's lock).
	final  bool
	answer chan store.Probe
}

func newAwaiter(e *Engine) *awaiter {
	return &awaiter{e: e, waiters: map[int64][]*waiter{}, hot: map[int64]struct{}{},
		kick: make(chan struct{}, 1), gone: make(chan struct{})}
}

// ErrAwaitUnread is returned by Await when the row could not be read at the deadline (to answer
// busy with it) within AwaitGrace: the database did not answer.
var ErrAwaitUnread = errors.New("the instance could not be read at the await deadline")

// AwaitGrace bounds the read of the row an Await caller answers busy with at its deadline: a
// second, or one await tick if longer. The read normally takes milliseconds (on a started
// engine the watcher makes it for every caller whose deadline came, in one statement); the
// grace only bounds a database that does not answer.
func (e *Engine) AwaitGrace() time.Duration { return max(e.cfg.AwaitTick, time.Second) }

// Await waits until the instance id settles (terminal; or parked, when parked says so) and
// returns its row as the probe read it, or the probe's Missing answer. Once timeout has passed
// it returns the row as it is then (not settled: busy), read within AwaitGrace, or
// ErrAwaitUnread; ctx's error if ctx ends first. On a running engine the watcher answers;
// otherwise Await polls the row every tick itself. Every read is bounded by the deadline (and
// the last by the grace): a hung connection cannot hold the caller.
func (e *Engine) Await(ctx context.Context, db store.DB, id int64, parked bool, timeout time.Duration) (store.Probe, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A read that fails for a reason worth retrying (a lost connection, a restarting server) is
	// tried again at the next tick, until the deadline: the caller gets an answer, or busy, or
	// (if the database still cannot be read then) an error.
	late := false // the deadline passed during a read
	// probe reports whether the read answered the caller (with p, or with err).
	probe := func() (p store.Probe, answered bool, err error) {
		p, ok, err := e.probeOne(rctx, db, id, parked, false)
		switch {
		case err == nil:
			return p, ok, nil
		case ctx.Err() != nil:
			return store.Probe{}, true, err
		case rctx.Err() != nil:
			late = true
			return store.Probe{}, false, err
		case store.Retryable(err):
			return store.Probe{}, false, err
		}
		return store.Probe{}, true, err
	}
	a := e.awaits
	var w *waiter
	if a.watching.Load() {
		w = a.register(id, parked)
		defer a.unregister(w)
	}
	// Registered first, read second: a settle between the two is seen by this read, one
	// after it by the push or the next tick.
	if p, answered, err := probe(); answered {
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
	for !late {
		select {
		case p := <-answer:
			return p, nil
		case <-gone:
			gone, answer = nil, nil
			tick.Reset(e.cfg.AwaitTick)
		case <-tick.C:
			if p, answered, err := probe(); answered {
				return p, err
			}
		case <-deadline.C:
			late = true
		case <-ctx.Done():
			return store.Probe{}, context.Cause(ctx)
		}
	}
	return e.finalRead(ctx, db, w, answer, gone, id, parked)
}

// finalRead reads the row at the deadline, within AwaitGrace: through the watcher when it runs
// (one statement for every caller whose deadline came), else itself.
func (e *Engine) finalRead(ctx context.Context, db store.DB, w *waiter, answer <-chan store.Probe, gone <-chan struct{},
	id int64, parked bool) (store.Probe, error) {
	grace := time.NewTimer(e.AwaitGrace())
	defer grace.Stop()
	if answer != nil {
		e.awaits.finalize(w)
		select {
		case p := <-answer:
			return p, nil
		case <-gone: // the watcher stopped: read the row here
		case <-grace.C:
			return store.Probe{}, ErrAwaitUnread
		case <-ctx.Done():
			return store.Probe{}, context.Cause(ctx)
		}
	}
	gctx, cancel := context.WithTimeout(ctx, e.AwaitGrace())
	defer cancel()
	p, _, err := e.probeOne(gctx, db, id, parked, true)
	if err != nil {
		if ctx.Err() != nil {
			return store.Probe{}, context.Cause(ctx)
		}
		return store.Probe{}, fmt.Errorf("%w: %w", ErrAwaitUnread, err)
	}
	return p, nil
}

func (e *Engine) probeOne(ctx context.Context, db store.DB, id int64, parked, final bool) (store.Probe, bool, error) {
	ps, err := e.store.AwaitProbe(ctx, db, []int64{id}, []bool{parked}, []bool{final})
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

// finalize marks a waiter whose deadline came: the next probe reads its row whatever its
// status, at once.
func (a *awaiter) finalize(w *waiter) {
	a.mu.Lock()
	w.final = true
	a.hot[w.id] = struct{}{}
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
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
		ids, parked, final := a.batch(all)
		if len(ids) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(a.e.baseCtx, 10*time.Second)
		ps, err := a.e.store.AwaitProbe(ctx, a.e.pool, ids, parked, final)
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
// waiters of both kinds is probed as parked, and as final if one of its waiters' deadline came;
// answer sorts out who a row answers.
func (a *awaiter) batch(all bool) ([]int64, []bool, []bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []int64
	var parked, final []bool
	add := func(id int64, ws []*waiter) {
		p, f := false, false
		for _, w := range ws {
			p, f = p || w.parked, f || w.final
		}
		ids = append(ids, id)
		parked, final = append(parked, p), append(final, f)
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
	return ids, parked, final
}

// answer hands each settled row to the waiters it answers and forgets them.
func (a *awaiter) answer(ps []store.Probe) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range ps {
		ws := a.waiters[p.ID]
		keep := ws[:0]
		for _, w := range ws {
			settled := p.Missing || p.Instance.Status.Terminal() ||
				(w.parked && p.Instance.Status == durabletype.StatusAwaiting)
			if !settled && !w.final {
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
