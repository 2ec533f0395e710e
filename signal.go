package gendurable

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/internal/jsonx"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Target addresses the instance a signal goes to: ByID or ByKey.
type Target struct {
	id      int64
	machine string
	key     string
}

// ByID addresses an instance by its id.
func ByID(id int64) Target { return Target{id: id} }

// ByKey addresses the live instance of machine with this correlation key. Keys are scoped by
// machine: the same key under another machine is another instance.
func ByKey(machine, key string) Target { return Target{machine: machine, key: key} }

func (t Target) String() string {
	if t.id != 0 {
		return fmt.Sprintf("instance %d", t.id)
	}
	return fmt.Sprintf("machine %q key %q", t.machine, t.key)
}

// SignalResult says where a signal went.
type SignalResult struct {
	// SignalID is the stored signal's id.
	SignalID int64
	// InstanceID is the instance it was delivered to.
	InstanceID int64
	// Woke says that the instance was parked on this name and is now runnable.
	Woke bool
}

// Signal stores a signal in the target's inbox, durably, in one statement, and wakes the target
// if it is parked awaiting that name (poking its queue, on every node with PokePostgres or Redis). A signal
// that arrives before the instance awaits it waits in the inbox. A finished or nonexistent target
// gets ErrNoTarget, and nothing is stored. payload is any JSON-encodable value, or nil.
//
// On a client that works the target's queue and has a free executor slot there, a signal that
// wakes its target also claims it, in the same statement, when nothing more urgent is due in that
// queue and the instance has no concurrency key, rate limit or fairness key: its step starts as
// Signal returns, without a poke or a pick.
func (c *Client) Signal(ctx context.Context, target Target, name string, payload any) (SignalResult, error) {
	slots := c.eng.ReserveWake()
	began := time.Now()
	res, queue, claimed, err := c.signal(ctx, c.pool, target, name, payload, slots)
	if slots != nil {
		c.eng.RunWoken(slots, claimed, time.Since(began))
	}
	if err == nil && res.Woke && claimed == nil {
		c.eng.Poke(queue)
	}
	return res, err
}

// SignalTx is Signal inside the caller's transaction: the signal exists, and wakes the target,
// only once tx commits. The target's row stays locked until then. With PokePostgres the wake's
// poke rides tx; with the other transports the queue's poll finds the woken row.
func (c *Client) SignalTx(ctx context.Context, tx pgx.Tx, target Target, name string, payload any) (SignalResult, error) {
	res, queue, _, err := c.signal(ctx, tx, target, name, payload, nil)
	if err == nil && res.Woke {
		if _, err := c.eng.PokeTx(ctx, tx, []string{queue}); err != nil {
			return SignalResult{}, err
		}
	}
	return res, err
}

// signal validates and delivers a signal; with slots (Signal's reservation) the wake may claim
// the instance, returned in claimed.
func (c *Client) signal(ctx context.Context, db store.DB, t Target, name string, payload any, slots *store.WakeSlots) (_ SignalResult, queue string, claimed *store.Claimed, _ error) {
	bad := func(field, format string, args ...any) error {
		return &InputError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case t.id < 0:
		return SignalResult{}, "", nil, bad("target", "id %d is not a valid instance id", t.id)
	case t.id == 0 && t.key == "" && t.machine == "":
		return SignalResult{}, "", nil, bad("target", "the zero Target: use ByID or ByKey")
	case t.id == 0 && t.key == "":
		return SignalResult{}, "", nil, bad("target", "ByKey with an empty key")
	case t.id == 0:
		if err := checkName("machine name", t.machine); err != nil {
			return SignalResult{}, "", nil, bad("target", "%v", err)
		}
		if err := checkKey(t.key); err != nil {
			return SignalResult{}, "", nil, bad("target", "correlation %v", err)
		}
	}
	if err := checkName("signal name", name); err != nil {
		return SignalResult{}, "", nil, bad("name", "%v", err)
	}
	var p *string
	if payload != nil {
		b, err := jsonx.Encode(payload, c.maxPayload)
		if err != nil {
			return SignalResult{}, "", nil, &InputError{Index: -1, Field: "payload", Reason: err.Error(), Err: err}
		}
		s := string(b)
		p = &s
	}
	var d store.Delivered
	var found bool
	var err error
	if slots != nil {
		d, claimed, found, err = c.store.DeliverSignalClaim(ctx, db, t.id, t.machine, t.key, name, p, slots)
	} else {
		d, found, err = c.store.DeliverSignal(ctx, db, t.id, t.machine, t.key, name, p)
	}
	if err != nil {
		return SignalResult{}, "", nil, fmt.Errorf("gendurable: signal %q to %s: %w", name, t, err)
	}
	if !found {
		return SignalResult{}, "", nil, fmt.Errorf("%w: %s", ErrNoTarget, t)
	}
	return SignalResult{SignalID: d.SignalID, InstanceID: d.InstanceID, Woke: d.Woke || claimed != nil}, d.Queue, claimed, nil
}
