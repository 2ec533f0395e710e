package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// flight is a claim this client holds: from the pick until its outcome commits (or is dropped).
type flight struct {
	id    int64
	owner string
	// keyed says the row has a concurrency key (any outcome of it may let another row of its
	// key run); slot is the gate slot the claim holds (a hand-back at shutdown credits it).
	keyed bool
	slot  *store.GateSlot
	// lease is the gate lease the claim took its slot from (nil: none, or settled); gaveBack
	// says its outcome was sent to give the slot back to it rather than credit the counter.
	lease    atomic.Pointer[gateLease]
	gaveBack bool
	queue    string
	machine  string
	step     string
	attempt  int
	started  time.Time
	cancel   context.CancelCauseFunc
	state    flightState
	// paused says the last heartbeat found the instance paused on its own: a row that still
	// waits (prefetched) for an executor is handed back instead of run.
	paused bool
}

type flightState int

const (
	flightRunning    flightState = iota // the step is running
	flightCommitting                    // the step's own transaction is committing its outcome
	flightHanded                        // the outcome is with the committer
	flightAbandoned                     // released at shutdown; a late outcome is dropped
)

// abandon cancels the steps still running at the end of the drain and hands their claims back.
func (e *Engine) abandon() error {
	e.mu.Lock()
	var rows []store.Outcome
	for _, f := range e.flights {
		// A step committing through its own transaction is handed back too: the hand-back
		// waits for that transaction's row lock, then finds the claim gone (the commit landed)
		// or takes it back; the step's own path, finding the flight abandoned, hands nothing.
		if f.state != flightRunning && f.state != flightCommitting {
			continue
		}
		rows = append(rows, e.giveUp(f))
	}
	e.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	if err := e.handBackAtStop(rows); err != nil {
		return err
	}
	e.log.Info("gendurable: stop deadline reached; running steps cancelled and their claims released",
		"client", e.cfg.Name, "claims", len(rows))
	return nil
}

// giveUp abandons a claim at shutdown and returns its hand-back: its step, if running, is
// cancelled, a late outcome of it is dropped, and its gate slot goes back to the counter (the
// hand-back credits it, leased slot or not). e.mu is held.
func (e *Engine) giveUp(f *flight) store.Outcome {
	f.state = flightAbandoned
	f.cancel(durabletype.ErrClientStopped)
	if gl := f.lease.Swap(nil); gl != nil {
		gl.settle(false)
	}
	if cur, ok := e.flights[f.id]; ok && cur == f {
		delete(e.flights, f.id)
	}
	return store.HandBack(store.Claim{ID: f.id, Owner: f.owner}, f.slot, 0)
}

// giveUpWaiting abandons, at shutdown, the claims of jobs no executor began, and returns their
// hand-backs.
func (e *Engine) giveUpWaiting(jobs []job) []store.Outcome {
	e.mu.Lock()
	defer e.mu.Unlock()
	rows := make([]store.Outcome, 0, len(jobs))
	for _, j := range jobs {
		if j.f.state == flightRunning {
			rows = append(rows, e.giveUp(j.f))
		}
	}
	return rows
}

// handBackAtStop applies the hand-backs of claims given up at shutdown, in one statement of at
// most 10s (not the drain's deadline: past it, the claims would wait for their leases).
func (e *Engine) handBackAtStop(rows []store.Outcome) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := e.store.ApplyOutcomes(ctx, e.pool, rows); err != nil {
		e.log.Error("gendurable: could not hand back claims at shutdown; they will be reclaimed when their lease expires",
			"client", e.cfg.Name, "claims", len(rows), "error", err)
		return fmt.Errorf("gendurable: stop: release %d claims: %w", len(rows), err)
	}
	return nil
}

// track registers a claim as in flight, with the context its step runs under.
func (e *Engine) track(queue, owner string, c *store.Claimed, gl *gateLease) (*flight, context.Context) {
	ctx, cancel := context.WithCancelCause(e.stepParent)
	f := &flight{id: c.ID, owner: owner, queue: queue, machine: c.Machine, step: c.Step,
		attempt: c.Attempt, started: time.Now(), cancel: cancel, keyed: c.ConcurrencyKey != nil, slot: c.Slot()}
	if gl != nil {
		f.lease.Store(gl)
	}
	e.mu.Lock()
	e.flights[c.ID] = f
	e.mu.Unlock()
	return f, ctx
}

// handOff moves a flight from running to handed, unless it was abandoned.
func (e *Engine) handOff(f *flight) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f.state == flightAbandoned {
		return false
	}
	f.state = flightHanded
	e.sends.Add(1)
	return true
}

// committing marks a running flight whose step's own transaction is about to commit its outcome:
// from then on a heartbeat that finds the claim gone (the commit landed) does not take the step
// for one that lost its claim.
func (e *Engine) committing(f *flight) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f.state == flightRunning {
		f.state = flightCommitting
	}
}

// settle forgets a flight whose outcome committed or was dropped.
func (e *Engine) settle(f *flight) {
	e.mu.Lock()
	if cur, ok := e.flights[f.id]; ok && cur == f {
		delete(e.flights, f.id)
	}
	e.mu.Unlock()
	f.cancel(nil)
}
