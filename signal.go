package gendurable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
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
// On a client that works the target's queue and has two or more free executor slots there, a
// signal that wakes its target also claims it, in the same statement, when nothing more urgent is
// due in that queue and the instance has no concurrency key, rate limit or fairness key: its step
// starts as Signal returns, without a poke or a pick (docs/signals.md).
func (c *Client) Signal(ctx context.Context, target Target, name string, payload any) (SignalResult, error) {
	p, err := c.signalInput(target, name, payload)
	if err != nil {
		return SignalResult{}, err
	}
	if res, tried, err := c.deliverClaiming(ctx, target, name, p); tried && !errors.Is(err, store.ErrDeliverPlainly) {
		return res, err
	}
	res, queue, err := c.deliver(ctx, c.pool, target, name, p)
	if err == nil && res.Woke {
		c.eng.Poke(queue)
	}
	return res, err
}

// SignalTx is Signal inside the caller's transaction: the signal exists, and wakes the target,
// only once tx commits. The target's row stays locked until then. With PokePostgres the wake's
// poke rides tx (unless the server's NOTIFY queue is half full or more: a full one fails every
// commit that notified); with the other transports, or without the poke, the queue's poll finds
// the woken row.
func (c *Client) SignalTx(ctx context.Context, tx pgx.Tx, target Target, name string, payload any) (SignalResult, error) {
	p, err := c.signalInput(target, name, payload)
	if err != nil {
		return SignalResult{}, err
	}
	res, queue, err := c.deliver(ctx, tx, target, name, p)
	if err == nil && res.Woke {
		if _, err := c.eng.PokeTx(ctx, tx, []string{queue}); err != nil {
			return SignalResult{}, err
		}
	}
	return res, err
}

// signalInput validates a signal and encodes its payload (nil: none).
func (c *Client) signalInput(t Target, name string, payload any) (*string, error) {
	bad := func(field, format string, args ...any) error {
		return &InputError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case t.id < 0:
		return nil, bad("target", "id %d is not a valid instance id", t.id)
	case t.id == 0 && t.key == "" && t.machine == "":
		return nil, bad("target", "the zero Target: use ByID or ByKey")
	case t.id == 0 && t.key == "":
		return nil, bad("target", "ByKey with an empty key")
	case t.id == 0:
		if err := checkName("machine name", t.machine); err != nil {
			return nil, bad("target", "%v", err)
		}
		if err := checkKey(t.key); err != nil {
			return nil, bad("target", "correlation %v", err)
		}
	}
	if err := checkName("signal name", name); err != nil {
		return nil, bad("name", "%v", err)
	}
	if payload == nil {
		return nil, nil
	}
	b, err := jsonx.Encode(payload, c.maxPayload)
	if err != nil {
		return nil, &InputError{Index: -1, Field: "payload", Reason: err.Error(), Err: err}
	}
	s := string(b)
	return &s, nil
}

// deliver stores a validated signal (store.DeliverSignal) and says where it went.
func (c *Client) deliver(ctx context.Context, db store.DB, t Target, name string, p *string) (SignalResult, string, error) {
	d, found, err := c.store.DeliverSignal(ctx, db, t.id, t.machine, t.key, name, p)
	if err = deliveryErr(t, name, found, err); err != nil {
		return SignalResult{}, "", err
	}
	return SignalResult{SignalID: d.SignalID, InstanceID: d.InstanceID, Woke: d.Woke}, d.Queue, nil
}

// deliverClaiming delivers a validated signal claiming the instance it wakes for this client
// (store.DeliverSignalClaim, see Signal). tried is false when the client had no slot to reserve
// (nothing was sent); an error matching store.ErrDeliverPlainly says nothing was stored and the
// signal should go by deliver. The statement runs detached from ctx, on a goroutine of its own:
// a claim that commits reaches an executor even if the caller gives up waiting (it then gets
// ctx's error, as for any call whose fate it did not wait to learn), where a claim whose reply
// was lost to a cancellation would wait out its lease.
func (c *Client) deliverClaiming(ctx context.Context, t Target, name string, p *string) (_ SignalResult, tried bool, _ error) {
	if err := ctx.Err(); err != nil {
		return SignalResult{}, true, fmt.Errorf("gendurable: signal %q to %s: %w", name, t, context.Cause(ctx))
	}
	slots := c.eng.ReserveWake()
	if slots == nil {
		return SignalResult{}, false, nil
	}
	type result struct {
		res SignalResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		began := time.Now()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engine.StatementTimeout(c.eng.Lease()))
		d, claimed, found, err := c.store.DeliverSignalClaim(sctx, c.pool, t.id, t.machine, t.key, name, p, slots)
		cancel()
		c.eng.RunWoken(slots, claimed, time.Since(began))
		if err == nil && d.Woke {
			c.eng.Poke(d.Queue) // a plain wake: the queue's picks take it
		}
		if errors.Is(err, store.ErrDeliverPlainly) {
			done <- result{err: err}
			return
		}
		if err = deliveryErr(t, name, found, err); err != nil {
			done <- result{err: err}
			return
		}
		done <- result{res: SignalResult{SignalID: d.SignalID, InstanceID: d.InstanceID, Woke: d.Woke || claimed != nil}}
	}()
	select {
	case r := <-done:
		return r.res, true, r.err
	case <-ctx.Done():
		return SignalResult{}, true, fmt.Errorf("gendurable: signal %q to %s: %w", name, t, context.Cause(ctx))
	}
}

// deliveryErr is a delivery's error for the caller: the store's wrapped, or ErrNoTarget.
func deliveryErr(t Target, name string, found bool, err error) error {
	if err != nil {
		return fmt.Errorf("gendurable: signal %q to %s: %w", name, t, err)
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrNoTarget, t)
	}
	return nil
}
