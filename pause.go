package gendurable

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/store"
)

// PauseTarget names what Pause and Resume act on: exactly one of a queue, a machine or an
// instance.
type PauseTarget struct {
	Queue    string
	Machine  string
	Instance int64
}

func (t PauseTarget) String() string {
	switch {
	case t.Queue != "":
		return fmt.Sprintf("queue %q", t.Queue)
	case t.Machine != "":
		return fmt.Sprintf("machine %q", t.Machine)
	default:
		return fmt.Sprintf("instance %d", t.Instance)
	}
}

// PauseInfo is a paused queue or machine (Client.Pauses).
type PauseInfo struct {
	// Kind is "queue" or "machine".
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Reason is the reason the pause gave (may be empty); By the node that paused it.
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
}

// PauseRefresh is how often every running client with queues reads the paused queues and
// machines: a Pause or Resume is obeyed by every node within it (and a statement) of returning.
const PauseRefresh = engine.PauseRefresh

// Pause stops the claiming of a queue's rows, of a machine's rows (in any queue), or of one
// instance, on every node, until Resume; it is stored, so it survives restarts. Steps already
// running finish, and their outcomes commit; nothing else changes: inserts, signals, timeouts
// and children finishing go on as usual, and what they make runnable waits. A paused instance
// holds no gate slot while it waits. Pausing what is already paused is no error (a non-empty
// reason replaces the first one's). A queue or machine neither this client nor any node in the
// registry knows (nor, for a queue, an available or finished instance): ErrUnknownQueue or
// ErrUnknownMachine; a finished instance: ErrWrongStatus; no
// instance: ErrNotFound.
func (c *Client) Pause(ctx context.Context, target PauseTarget, reason string) error {
	if err := c.setPaused(ctx, target, reason, true); err != nil {
		return fmt.Errorf("gendurable: pause %s: %w", target, err)
	}
	return nil
}

// Resume undoes Pause: the target's runnable rows are claimed again (the nodes that work them
// are poked). Resuming what is not paused is no error; a name nobody knows is, as for Pause.
func (c *Client) Resume(ctx context.Context, target PauseTarget) error {
	if err := c.setPaused(ctx, target, "", false); err != nil {
		return fmt.Errorf("gendurable: resume %s: %w", target, err)
	}
	return nil
}

// Pauses lists the paused queues and machines (paused instances are listed by List's Paused
// filter and shown by Inspect).
func (c *Client) Pauses(ctx context.Context) ([]PauseInfo, error) {
	rows, err := c.store.Pauses(ctx, c.pool)
	if err != nil {
		return nil, fmt.Errorf("gendurable: pauses: %w", err)
	}
	out := make([]PauseInfo, len(rows))
	for i, r := range rows {
		out[i] = PauseInfo{Kind: r.Kind, Name: r.Name, Reason: r.Reason, By: r.By, At: r.At}
	}
	return out, nil
}

func (c *Client) setPaused(ctx context.Context, t PauseTarget, reason string, paused bool) error {
	set := 0
	for _, ok := range []bool{t.Queue != "", t.Machine != "", t.Instance != 0} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return &InputError{Index: -1, Field: "PauseTarget", Reason: "name exactly one of Queue, Machine and Instance"}
	}
	if len(reason) > 1024 {
		return &InputError{Index: -1, Field: "reason", Reason: fmt.Sprintf("%d bytes long; the limit is 1024", len(reason))}
	}
	if t.Instance != 0 {
		res, err := c.store.PauseInstance(ctx, c.pool, t.Instance, paused)
		if err != nil {
			return err
		}
		if !paused && res.Was && res.Status == StatusAvailable {
			c.eng.Poke(res.Queue)
		}
		return nil
	}
	kind, name := store.PauseQueue, t.Queue
	if t.Machine != "" {
		kind, name = store.PauseMachine, t.Machine
	}
	var err error
	if paused {
		if err = c.checkPausable(ctx, kind, name); err == nil {
			_, err = c.store.SetPause(ctx, c.pool, kind, name, reason, c.eng.Origin())
		}
	} else {
		var was bool
		if was, err = c.store.ClearPause(ctx, c.pool, kind, name); err == nil && !was {
			err = c.checkPausable(ctx, kind, name)
		}
	}
	if err != nil {
		return err
	}
	// This client obeys at once; the others within PauseRefresh.
	if c.eng.Running() {
		if err := c.eng.RefreshPauses(ctx); err != nil {
			c.eng.Config().Logger.Warn("gendurable: could not read the pauses back; the next refresh will", "error", err)
		}
	}
	if !paused && kind == store.PauseQueue {
		c.eng.Poke(name)
	}
	return nil
}

// checkPausable returns ErrUnknownQueue or ErrUnknownMachine for a name neither this client nor
// the node registry knows (nor, for a queue, any available or finished instance).
func (c *Client) checkPausable(ctx context.Context, kind, name string) error {
	cfg := c.eng.Config()
	if kind == store.PauseQueue {
		if _, ok := cfg.Queues[name]; ok {
			return nil
		}
		for _, m := range cfg.Machines {
			if m.Queue == name {
				return nil
			}
		}
	} else if cfg.Machines[name] != nil {
		return nil
	}
	queues, machines, err := c.store.RegisteredNames(ctx, c.pool)
	if err != nil {
		return err
	}
	if kind == store.PauseQueue {
		if slices.Contains(queues, name) {
			return nil
		}
		has, err := c.store.QueueHasRows(ctx, c.pool, name)
		if err != nil {
			return err
		}
		if !has {
			return fmt.Errorf("%w: %q: no node in the registry works it, no machine of this client defaults to it, and it holds no runnable or finished instance", ErrUnknownQueue, name)
		}
	} else if !slices.Contains(machines, name) {
		return fmt.Errorf("%w: %q: neither this client nor any node in the registry registers it", ErrUnknownMachine, name)
	}
	return nil
}
