package engine

// Pauses: a node does not claim rows of a paused queue or machine (nor a paused instance, which
// every pick filters out by itself). The paused queues and machines live in the pauses table;
// a node with queues reads it at Start, before its first pick, and then every PauseRefresh, and
// at once after an operator's call on this client.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gendurable/gendurable/internal/store"
)

// PauseRefresh is how often a node with queues reads the pauses table: a pause or resume on any
// client reaches every node within this (plus a statement) of the call returning.
const PauseRefresh = 500 * time.Millisecond

// pauseSet is what a node obeys: the paused queues (of any node) and machines, sorted.
type pauseSet struct {
	queues   []string
	machines []string
}

func (p *pauseSet) queuePaused(q string) bool {
	return p != nil && slices.Contains(p.queues, q)
}

func (p *pauseSet) machinePaused(m string) bool {
	return p != nil && slices.Contains(p.machines, m)
}

// RefreshPauses reads the pauses table and applies it: the runners of queues or machines that
// were resumed are woken at once.
func (e *Engine) RefreshPauses(ctx context.Context) error {
	rows, err := e.store.Pauses(ctx, e.pool)
	if err != nil {
		return err
	}
	next := &pauseSet{}
	for _, r := range rows {
		switch r.Kind {
		case store.PauseQueue:
			next.queues = append(next.queues, r.Name)
		case store.PauseMachine:
			next.machines = append(next.machines, r.Name)
		}
	}
	prev := e.paused.Swap(next)
	if prev == nil {
		return nil
	}
	for _, q := range prev.queues {
		if !next.queuePaused(q) {
			e.Wake(q)
		}
	}
	for _, m := range prev.machines {
		if !next.machinePaused(m) {
			for q := range e.runners { // its rows may be in any queue
				e.Wake(q)
			}
			break
		}
	}
	return nil
}

// loadPauses is Start's first read of the pauses, before any pick.
func (e *Engine) loadPauses(ctx context.Context) error {
	if len(e.runners) == 0 {
		return nil
	}
	if err := e.startTry(ctx, e.RefreshPauses); err != nil {
		return fmt.Errorf("gendurable: start: read the paused queues and machines: %w", err)
	}
	return nil
}

// pauseLoop reads the pauses every PauseRefresh until Stop. A failed read keeps the last set.
func (e *Engine) pauseLoop() {
	defer e.bg.Done()
	t := time.NewTicker(PauseRefresh)
	defer t.Stop()
	for {
		select {
		case <-e.bgStop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(e.baseCtx, StatementTimeout(e.cfg.Lease))
		err := store.RetryConnLost(ctx, func() error { return e.RefreshPauses(ctx) })
		cancel()
		switch {
		case err == nil:
			e.spells.pauses.Succeeded(e.log, "gendurable: the paused queues and machines are read again", "client", e.cfg.Name)
		case e.baseCtx.Err() == nil:
			e.spells.pauses.Failed(e.log, "gendurable: could not read the paused queues and machines; keeping the last read", "client", e.cfg.Name, "error", err)
		}
	}
}

// QueuePaused reports whether this node last read queue as paused.
func (e *Engine) QueuePaused(queue string) bool { return e.paused.Load().queuePaused(queue) }

// pausedMachines are the machines this node's picks leave alone.
func (e *Engine) pausedMachines() []string {
	if p := e.paused.Load(); p != nil {
		return p.machines
	}
	return nil
}
