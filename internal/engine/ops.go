package engine

import (
	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// Cancelled reports, after its commit, an instance an operator (or a schedule's overlap policy)
// cancelled: a step of it running on this client has its context cancelled now (on another
// node, its heartbeat finds the claim gone), its waiters are answered, and the queue of a parent
// the cancel made runnable is poked.
func (e *Engine) Cancelled(id int64, c store.Cancelled) {
	e.mu.Lock()
	if f, ok := e.flights[id]; ok && f.state == flightRunning {
		f.cancel(durabletype.ErrCancelled)
	}
	e.mu.Unlock()
	e.awaits.push(id)
	e.Emit(durabletype.Event{Name: durabletype.EventInstanceCancelled, InstanceID: id, Queue: c.Was.Queue,
		Machine: c.Was.Machine, Step: c.Was.Step})
	if c.Woke != "" {
		e.Poke(c.Woke)
	}
}

// Retried reports an instance an operator made runnable again.
func (e *Engine) Retried(id int64, queue, machine, step string) {
	e.Emit(durabletype.Event{Name: durabletype.EventInstanceRetried, InstanceID: id, Queue: queue, Machine: machine, Step: step})
}
