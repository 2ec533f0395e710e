package engine

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
)

// eventBuffer is how many events may wait for slow hooks before new ones are dropped.
const eventBuffer = 16384

// dispatcher delivers events to hooks on its own goroutine, so a slow hook never blocks the
// engine: when the buffer is full, events are dropped and counted (and the count logged). With
// no hooks, emitting costs nothing.
type dispatcher struct {
	client  string
	hooks   []func(durabletype.Event)
	log     *slog.Logger
	ch      chan durabletype.Event
	done    chan struct{}
	mu      sync.RWMutex
	closed  bool
	dropped atomic.Int64
}

func newDispatcher(client string, hooks []func(durabletype.Event), log *slog.Logger) *dispatcher {
	return &dispatcher{client: client, hooks: hooks, log: log}
}

func (d *dispatcher) start() {
	if len(d.hooks) == 0 {
		return
	}
	d.ch = make(chan durabletype.Event, eventBuffer)
	d.done = make(chan struct{})
	go d.run()
}

func (d *dispatcher) emit(ev durabletype.Event) {
	if len(d.hooks) == 0 {
		return
	}
	ev.Client = d.client
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.ch == nil {
		// Not started: the test kit's Drain runs without the runtime, in the caller's
		// goroutine; its events are delivered there, in order.
		for _, h := range d.hooks {
			d.call(h, ev)
		}
		return
	}
	if d.closed {
		return
	}
	select {
	case d.ch <- ev:
	default:
		if d.dropped.Add(1)%1000 == 1 {
			d.log.Warn("gendurable: event hooks are too slow; events dropped", "client", d.client, "dropped", d.dropped.Load())
		}
	}
}

func (d *dispatcher) run() {
	defer close(d.done)
	for ev := range d.ch {
		for _, h := range d.hooks {
			d.call(h, ev)
		}
	}
}

func (d *dispatcher) call(h func(durabletype.Event), ev durabletype.Event) {
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("gendurable: event hook panicked", "client", d.client, "event", string(ev.Name), "panic", fmt.Sprint(r))
		}
	}()
	h(ev)
}

// stop delivers what is buffered, then returns.
func (d *dispatcher) stop() {
	if len(d.hooks) == 0 {
		return
	}
	d.mu.Lock()
	if d.closed || d.ch == nil {
		d.mu.Unlock()
		return
	}
	d.closed = true
	close(d.ch)
	d.mu.Unlock()
	<-d.done
}
