package engine

import (
	"context"
	"sync"
	"time"
)

// commitWatch starts the rows an InsertTx made due in this node's queues as soon as the
// caller's transaction commits, when the poke transport cannot send with that commit (the
// default local transport, or Redis): no hook tells this node that a transaction it did not run
// committed, so it looks. Each watched row is probed by primary key every millisecond for its
// first ten, then at doubling gaps, until its queue's poll interval has passed (the poll finds it
// by then) or it is seen. One statement probes every row due for a probe; nothing runs while no
// row is watched. A row seen wakes its queue's scheduler, which picks it.
type commitWatch struct {
	e    *Engine
	kick chan struct{}

	mu   sync.Mutex
	rows map[int64]*watched
}

// watched is one row waiting for its transaction's commit.
type watched struct {
	queue    string
	next     time.Time // the next probe
	gap      time.Duration
	probes   int
	deadline time.Time // its queue's poll finds it by then
}

const (
	// watchFast is the gap of a watched row's first watchFastProbes probes: a transaction that
	// commits right after its InsertTx, the usual case, is seen within about a millisecond.
	watchFast       = time.Millisecond
	watchFastProbes = 10
	// watchMaxRows bounds the rows watched at once; rows beyond it are left to the poll.
	watchMaxRows = 1000
	// watchTimeout bounds a probe statement; a failed probe is tried again at the row's next gap.
	watchTimeout = time.Second
)

func newCommitWatch(e *Engine) *commitWatch {
	return &commitWatch{e: e, kick: make(chan struct{}, 1), rows: map[int64]*watched{}}
}

// add watches ids (each with its queue) from now.
func (w *commitWatch) add(ids []int64, queues []string) {
	now := time.Now()
	w.mu.Lock()
	for i, id := range ids {
		if len(w.rows) >= watchMaxRows {
			break
		}
		r, ok := w.e.runners[queues[i]]
		if !ok {
			continue
		}
		w.rows[id] = &watched{queue: queues[i], next: now.Add(watchFast), gap: watchFast, deadline: now.Add(r.poll)}
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run probes until stop is closed.
func (w *commitWatch) run(ctx context.Context, stop <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wait <-chan time.Time
		if next, ok := w.nextProbe(); ok {
			timer.Reset(time.Until(next))
			wait = timer.C
		}
		select {
		case <-stop:
			return
		case <-w.kick:
			continue
		case <-wait:
		}
		w.probe(ctx)
	}
}

func (w *commitWatch) nextProbe() (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var next time.Time
	for _, r := range w.rows {
		if next.IsZero() || r.next.Before(next) {
			next = r.next
		}
	}
	return next, !next.IsZero()
}

// probe reads which of the rows due for a probe are visible, wakes their queues, and schedules
// the others' next probes (dropping those past their deadline).
func (w *commitWatch) probe(ctx context.Context) {
	now := time.Now()
	var ids []int64
	w.mu.Lock()
	for id, r := range w.rows {
		if !r.next.After(now) {
			ids = append(ids, id)
		}
	}
	w.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, watchTimeout)
	seen, err := w.e.store.Committed(pctx, w.e.pool, ids)
	cancel()
	if err != nil && ctx.Err() == nil {
		w.e.log.Debug("gendurable: the commit watcher's probe failed; its rows are probed again", "client", w.e.cfg.Name, "error", err)
	}
	woken := map[string]bool{}
	now = time.Now()
	w.mu.Lock()
	for _, id := range seen {
		if r, ok := w.rows[id]; ok {
			woken[r.queue] = true
			delete(w.rows, id)
		}
	}
	for _, id := range ids {
		r, ok := w.rows[id]
		if !ok {
			continue
		}
		r.probes++
		if r.probes >= watchFastProbes {
			r.gap *= 2
		}
		r.next = now.Add(r.gap)
		if r.next.After(r.deadline) {
			delete(w.rows, id)
		}
	}
	w.mu.Unlock()
	for q := range woken {
		w.e.Wake(q)
	}
}
