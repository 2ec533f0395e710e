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
// node registers here, and the watcher does every read for them, batched. Each tick, one probe
// statement reads the rows of every waiter that have settled (none while nobody waits). The
// rows of new waiters, of instances this node just committed an outcome for (a push) and of
// waiters at their deadline (their last read, which wants the row whatever its status) are read
// at once by a second reader, in one statement for all that have queued up: a burst of callers
// costs a statement, not a connection each, and a hot read never waits behind a tick's.
type awaiter struct {
	e       *Engine
	mu      sync.Mutex
	waiters map[int64][]*waiter
	hot     map[int64]struct{}
	n       atomic.Int64 // registered waiters, read without the lock on the commit path
	kick    chan struct{}
	// gone is closed when the watcher exits: its waiters fall back to reading on their own.
	gone chan struct{}
	// watching says the watcher runs (between Start and Stop).
	watching atomic.Bool
}

type waiter struct {
	id     int64
	parked bool // an awaiting row is an answer
	// Under the awaiter's mu: fresh says its first read is pending, final that its deadline
	// passed (the row is the answer whatever its status); both want the row whole. latest is
	// the last row read that did not answer it.
	fresh, final bool
	latest       *store.Probe
	answer       chan store.Probe
}

func newAwaiter(e *Engine) *awaiter {
	return &awaiter{e: e, waiters: map[int64][]*waiter{}, hot: map[int64]struct{}{},
		kick: make(chan struct{}, 1), gone: make(chan struct{})}
}

// ErrAwaitNoAnswer is Await's error when the instance's row could not be read at all by one
// AwaitTick after the deadline (a database too slow or unreachable to answer in time).
var ErrAwaitNoAnswer = fmt.Errorf("no answer: the row could not be read by a tick after the deadline: %w", context.DeadlineExceeded)

// settles says whether p answers a waiter (parked: an awaiting row counts).
func settles(p store.Probe, parked bool) bool {
	return p.Missing || p.Instance.Status.Terminal() || (parked && p.Instance.Status == durabletype.StatusAwaiting)
}

// Await waits until the instance id settles (terminal; or parked, when parked says so) and
// returns its row as it was read, or a Missing probe. At the deadline it reads the row once more,
// whatever its status, and returns it (the caller tells a settle at the last moment from busy).
// If that read cannot finish within four fifths of a tick (the last fifth is the return's), it
// returns the row as last read instead (its first read wants the whole row for this), or
// ErrAwaitNoAnswer if the row could never be read. So it returns by deadline + AwaitTick however
// slow the database, or with ctx's error if ctx ends first. On a running engine the watcher does
// the reads; otherwise Await reads the row every tick itself.
func (e *Engine) Await(ctx context.Context, db store.DB, id int64, parked bool, deadline time.Time) (store.Probe, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	tick := time.NewTicker(e.cfg.AwaitTick)
	defer tick.Stop()
	grace := deadline.Add(e.cfg.AwaitTick * 4 / 5) // the last read's bound
	var latest *store.Probe                        // the poll's last read
	// read reads the row itself (whole: whatever its status), bounded by by, a wait for a
	// connection included. It reports whether the row answers the waiter.
	read := func(by time.Time, whole bool) (store.Probe, bool, error) {
		rctx, cancel := context.WithDeadline(ctx, by)
		defer cancel()
		ps, err := e.store.AwaitProbe(rctx, db, []int64{id}, []bool{parked}, []bool{whole})
		switch {
		case err != nil && ctx.Err() == nil && rctx.Err() != nil:
			return store.Probe{}, false, errReadLate
		case err != nil && ctx.Err() == nil && store.Retryable(err):
			// A lost connection or a restarting server: the next tick reads again (the
			// watcher retries its failed reads the same way).
			return store.Probe{}, false, nil
		case err != nil:
			return store.Probe{}, false, fmt.Errorf("read instance %d: %w", id, err)
		case len(ps) == 0:
			return store.Probe{}, false, nil
		}
		if !settles(ps[0], parked) {
			latest = &ps[0]
			return ps[0], false, nil
		}
		return ps[0], true, nil
	}
	// last is the read at the deadline, by the waiter itself.
	last := func() (store.Probe, error) {
		p, _, err := read(grace, true)
		unread := err == nil && !p.Missing && p.Instance == nil // a retryable failure
		switch {
		case (errors.Is(err, errReadLate) || unread) && latest != nil:
			return *latest, nil
		case errors.Is(err, errReadLate) || unread:
			return p, ErrAwaitNoAnswer
		}
		return p, err
	}
	a := e.awaits
	var w *waiter
	var answer <-chan store.Probe
	var gone <-chan struct{}
	if a.watching.Load() {
		w = a.register(id, parked)
		defer a.unregister(w)
		// Registered first, read second: the watcher reads the row now (push), so a settle
		// before that read is seen by it, one after it by a push or the next tick.
		a.push(id)
		answer, gone = w.answer, a.gone
		tick.Stop() // the watcher reads for us
	} else {
		switch p, ok, err := read(deadline, true); {
		case errors.Is(err, errReadLate):
			return last()
		case err != nil || ok:
			return p, err
		}
	}
	var late <-chan time.Time // the watcher's last read is due by then
	for {
		select {
		case p := <-answer:
			return p, nil
		case <-gone:
			gone, answer = nil, nil
			latest = a.latestOf(w)
			if late != nil {
				return last()
			}
			tick.Reset(e.cfg.AwaitTick)
		case <-tick.C:
			switch p, ok, err := read(deadline, latest == nil); {
			case errors.Is(err, errReadLate):
				return last()
			case err != nil || ok:
				return p, err
			}
		case <-timer.C:
			if answer == nil {
				return last()
			}
			a.finalRead(w)
			g := time.NewTimer(time.Until(grace)) // from the deadline, not from a late timer
			defer g.Stop()
			late = g.C
		case <-late:
			if p := a.latestOf(w); p != nil {
				return *p, nil
			}
			return store.Probe{}, ErrAwaitNoAnswer
		case <-ctx.Done():
			return store.Probe{}, context.Cause(ctx)
		}
	}
}

// errReadLate says a read of Await's did not finish by its bound.
var errReadLate = errors.New("await read did not finish in time")

func (a *awaiter) register(id int64, parked bool) *waiter {
	w := &waiter{id: id, parked: parked, fresh: true, answer: make(chan store.Probe, 1)}
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

// latestOf returns the last row read for w that did not answer it (nil: none yet).
func (a *awaiter) latestOf(w *waiter) *store.Probe {
	a.mu.Lock()
	defer a.mu.Unlock()
	return w.latest
}

// finalRead asks the watcher for w's last read: the row, whatever its status, at once.
func (a *awaiter) finalRead(w *waiter) {
	a.mu.Lock()
	w.final = true
	a.hot[w.id] = struct{}{}
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// probeFlags are the await_probe flags for an id's waiters: parked if any of them counts a park
// as an answer, whole if any wants the row whatever its status (a first or a last read).
func probeFlags(ws []*waiter) (parked, whole bool) {
	for _, w := range ws {
		parked = parked || w.parked
		whole = whole || w.final || w.fresh
	}
	return parked, whole
}

// want lists, for a commit to read back in its own transaction (store.ProbeReq), the rows of outs
// that have waiters here and whose outcome may settle them (done, failed, or parked on
// signals), with their probe flags as batch gives them. Empty when nobody waits.
func (a *awaiter) want(outs []store.Outcome) store.ProbeReq {
	var req store.ProbeReq
	if a.n.Load() == 0 {
		return req
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range outs {
		o := &outs[i]
		if o.Kind != store.KindDone && o.Kind != store.KindFailed && o.Kind != store.KindAwait {
			continue
		}
		ws, ok := a.waiters[o.Claim.ID]
		if !ok {
			continue
		}
		p, f := probeFlags(ws)
		if o.Kind == store.KindAwait && !p && !f {
			continue // a park answers none of them: the push's read is theirs, as before
		}
		req.IDs = append(req.IDs, o.Claim.ID)
		req.Parked = append(req.Parked, p)
		req.Whole = append(req.Whole, f)
	}
	return req
}

// push asks for an immediate probe of id if someone waits on it: this node just committed an
// outcome that may have settled it (or a waiter just registered).
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
	// Two readers: the ticks' probe of every waiter, and the hot reads (pushes, first reads,
	// last reads), so that a hot read never waits behind a tick's probe of a thousand rows.
	var hot sync.WaitGroup
	hot.Add(1)
	go func() {
		defer hot.Done()
		for {
			select {
			case <-stop:
				return
			case <-a.kick:
				a.probe(false)
			}
		}
	}()
	defer hot.Wait()
	t := time.NewTicker(a.e.cfg.AwaitTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			a.probe(true)
		}
	}
}

// probe reads the rows of every waiter (all) or of the hot ids, and answers whom they answer.
func (a *awaiter) probe(all bool) {
	ids, parked, whole := a.batch(all)
	if len(ids) == 0 {
		return
	}
	sp := &a.e.spells.awaitHot // the two kinds of probe run side by side
	if all {
		sp = &a.e.spells.awaitTicks
	}
	ctx, cancel := context.WithTimeout(a.e.baseCtx, 10*time.Second)
	ps, err := a.e.store.AwaitProbe(ctx, a.e.pool, ids, parked, whole)
	cancel()
	if err != nil {
		if a.e.baseCtx.Err() == nil {
			sp.Failed(a.e.log, "gendurable: await probe failed; retrying at the next tick", "client", a.e.cfg.Name,
				"waiters", len(ids), "error", err)
		}
		return
	}
	sp.Succeeded(a.e.log, "gendurable: await probes succeed again", "client", a.e.cfg.Name)
	a.answer(ps)
}

// batch lists the ids to probe: every waited-on id (all), or the pushed ones. An id with
// waiters of both kinds is probed as parked, and whole if any of its waiters is at its last read;
// answer sorts out whom a row answers.
func (a *awaiter) batch(all bool) ([]int64, []bool, []bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []int64
	var parked, whole []bool
	add := func(id int64, ws []*waiter) {
		p, f := probeFlags(ws)
		ids = append(ids, id)
		parked = append(parked, p)
		whole = append(whole, f)
	}
	if all {
		for id, ws := range a.waiters {
			add(id, ws)
		}
		return ids, parked, whole // the hot reads stay the hot reader's: it may well be faster
	}
	for id := range a.hot {
		if ws, ok := a.waiters[id]; ok {
			add(id, ws)
		}
	}
	clear(a.hot)
	return ids, parked, whole
}

// answer hands each row to the waiters it answers (settled for them, or their last read) and
// forgets them; to the others it is their latest read.
func (a *awaiter) answer(ps []store.Probe) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range ps {
		ws := a.waiters[p.ID]
		keep := ws[:0]
		for _, w := range ws {
			if !settles(p, w.parked) && !w.final {
				w.fresh = false
				w.latest = &p
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
