package engine

import "github.com/gendurable/gendurable/durabletype"

// Cancelled reports an instance an operator cancelled: a step of it running on this client has
// its context cancelled now (on another node, its heartbeat finds the claim gone), and its
// waiters are answered.
func (e *Engine) Cancelled(id int64, queue, machine, step string) {
	e.mu.Lock()
	if f, ok := e.flights[id]; ok && f.state == flightRunning {
		f.cancel(durabletype.ErrCancelled)
	}
	e.mu.Unlock()
	e.awaits.push(id)
	e.Emit(durabletype.Event{Name: durabletype.EventInstanceCancelled, InstanceID: id, Queue: queue, Machine: machine, Step: step})
}

// Retried reports an instance an operator made runnable again.
func (e *Engine) Retried(id int64, queue, machine, step string) {
	e.Emit(durabletype.Event{Name: durabletype.EventInstanceRetried, InstanceID: id, Queue: queue, Machine: machine, Step: step})
}
