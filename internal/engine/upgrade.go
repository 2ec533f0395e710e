package engine

// Machine versions at claim time: whether this node can run a claimed row's step as the row
// stands, brings it forward to the node's version of its machine first, or hands it back for a
// node that can run it.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// admit decides what becomes of a claimed row before its step runs. ok: this node runs the step
// as the row stands. Otherwise out replaces running it: the row brought forward to this node's
// version of its machine (KindUpgrade; blocked nil), or handed back untouched because this node
// cannot run it (KindReleased; blocked says why, wrapping ErrUnknownMachine, ErrUnknownVersion,
// ErrUnknownStep or ErrUpgrade).
func (e *Engine) admit(c *store.Claimed) (out store.Outcome, blocked error, ok bool) {
	def := e.cfg.Machines[c.Machine]
	hand := func(err error) (store.Outcome, error, bool) {
		return store.HandBack(store.Claim{ID: c.ID, Owner: c.Owner}, c.Slot(), unknownDelay), err, false
	}
	version := max(c.MachineVersion, 1)
	switch {
	case c.CodecErr != nil:
		// The step would read a value this node cannot open. Hand the row back with the reason
		// in its error history (no attempt spent): a node with the key runs it, and an operator
		// sees why it does not move.
		out, err, ok := hand(fmt.Errorf("machine %q, step %q: %w", c.Machine, c.Step, c.CodecErr))
		out.ErrKind, out.ErrMsg = store.ErrKindCodec, err.Error()
		return out, err, ok
	case def == nil:
		return hand(fmt.Errorf("%w %q: it is not registered on this client", durabletype.ErrUnknownMachine, c.Machine))
	case version > def.version():
		return hand(fmt.Errorf("%w: the row is at version %d of machine %q, this client knows version %d",
			durabletype.ErrUnknownVersion, version, c.Machine, def.version()))
	case version < def.version():
		if def.Upgrade == nil {
			return hand(fmt.Errorf("%w: machine %q declares no way from version %d to %d",
				durabletype.ErrUpgrade, c.Machine, version, def.version()))
		}
		step, state, err := def.Upgrade(version, c.Step, c.State)
		if err != nil {
			return hand(fmt.Errorf("%w: machine %q, version %d to %d, step %q: %w",
				durabletype.ErrUpgrade, c.Machine, version, def.version(), c.Step, err))
		}
		if !def.Steps[step] {
			return hand(fmt.Errorf("%w: machine %q, version %d to %d: step %q became %q, which version %d lacks",
				durabletype.ErrUpgrade, c.Machine, version, def.version(), c.Step, step, def.version()))
		}
		out := store.Outcome{Kind: store.KindUpgrade, Step: step, State: state, Version: def.version()}
		out.Fence(c, e.cfg.Fair)
		// An upgrade is not a run: the pick's claim is handed back (its attempt restored) and
		// the gate slot with it.
		return out, nil, false
	case !def.Steps[c.Step]:
		return hand(fmt.Errorf("%w %q in machine %q (version %d)", durabletype.ErrUnknownStep, c.Step, c.Machine, version))
	}
	return store.Outcome{}, nil, true
}

// version is the machine's version: 1 unless it declares one.
func (d *MachineDef) version() int { return max(d.Version, 1) }

// upgradeBatch is how many rows one transaction of a bulk upgrade locks and writes.
const upgradeBatch = 500

// UpgradeAll brings the live rows of machine that no worker holds (available, due or not,
// awaiting, joining) forward to this client's version of it, in batches of one short
// transaction each, recorded as by; progress (may be nil) is told the counts after each batch.
// A row the upgrade cannot bring forward stays as it is and is counted as blocked; a row locked
// at the time (being claimed, signalled) is skipped: its claim brings it forward.
func (e *Engine) UpgradeAll(ctx context.Context, machine, by string, progress func(upgraded, blocked int64) error) (upgraded, blocked int64, err error) {
	def := e.cfg.Machines[machine]
	if def == nil {
		return 0, 0, fmt.Errorf("%w %q: register it on this client to upgrade its instances", durabletype.ErrUnknownMachine, machine)
	}
	version := def.version()
	var after int64
	for {
		tx, err := e.store.BeginOwn(ctx, e.pool)
		if err != nil {
			return upgraded, blocked, fmt.Errorf("gendurable: upgrade %q: %w", machine, err)
		}
		rows, err := e.store.UpgradeBatch(ctx, tx, machine, version, after, upgradeBatch)
		if err != nil || len(rows) == 0 {
			_ = tx.Rollback(ctx)
			if err != nil {
				return upgraded, blocked, fmt.Errorf("gendurable: upgrade %q: lock a batch: %w", machine, err)
			}
			return upgraded, blocked, nil
		}
		after = rows[len(rows)-1].ID
		var ids []int64
		var steps []string
		var states [][]byte
		for _, r := range rows {
			if r.CodecErr != nil {
				blocked++ // its state cannot be read here; a claim on a node with the key upgrades it
				continue
			}
			step, state, err := def.Upgrade(max(r.Version, 1), r.Step, r.State)
			if err != nil || !def.Steps[step] {
				blocked++
				continue
			}
			ids, steps, states = append(ids, r.ID), append(steps, step), append(states, state)
		}
		done, err := e.store.UpgradeApply(ctx, tx, ids, steps, states, version, by)
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return upgraded, blocked, fmt.Errorf("gendurable: upgrade %q: write a batch: %w", machine, err)
		}
		upgraded += int64(len(done))
		stepOf := make(map[int64]string, len(ids))
		for i, id := range ids {
			stepOf[id] = steps[i]
		}
		var queues []string
		for _, u := range done {
			e.Emit(durabletype.Event{Name: durabletype.EventInstanceUpgraded, Queue: u.Queue, Machine: machine,
				Step: stepOf[u.ID], InstanceID: u.ID, Version: version})
			if u.Due && !slices.Contains(queues, u.Queue) {
				queues = append(queues, u.Queue)
			}
		}
		e.Poke(queues...)
		if progress != nil {
			if err := progress(upgraded, blocked); err != nil {
				return upgraded, blocked, err
			}
		}
	}
}

// upgradeLease is how long a node holds an operator's bulk-upgrade request between batches.
const upgradeLease = 30 * time.Second

// serveUpgrades takes an operator's open bulk-upgrade request for a machine this node runs at its
// newest version, if there is one, and works it to the end (gendurable upgrade).
func (e *Engine) serveUpgrades() {
	if len(e.versions.Names) == 0 || !e.upgrading.CompareAndSwap(false, true) {
		return
	}
	defer e.upgrading.Store(false)
	by := e.Origin()
	ctx, cancel := context.WithTimeout(e.baseCtx, StatementTimeout(e.cfg.Lease))
	id, machine, ok, err := e.store.TakeUpgrade(ctx, e.pool, by, e.versions, upgradeLease, NodeLive)
	cancel()
	if err != nil {
		e.spells.upgrades.Failed(e.log, "gendurable: could not look for bulk-upgrade requests", "client", e.cfg.Name, "error", err)
		return
	}
	e.spells.upgrades.Succeeded(e.log, "gendurable: bulk-upgrade requests are looked for again", "client", e.cfg.Name)
	if !ok {
		return
	}
	e.log.Info("gendurable: bulk upgrade requested", "client", e.cfg.Name, "machine", machine, "request", id)
	// Stop interrupts the work between batches; the request's lease then runs out and another
	// node (or this one, restarted) takes it up again.
	work, stop := context.WithCancel(e.baseCtx)
	defer stop()
	go func() {
		select {
		case <-e.bgStop:
			stop()
		case <-work.Done():
		}
	}()
	upgraded, blocked, err := e.UpgradeAll(work, machine, fmt.Sprintf("upgrade request %d on %s", id, by),
		func(upgraded, blocked int64) error {
			return e.store.ProgressUpgrade(work, e.pool, id, by, upgradeLease, upgraded, blocked)
		})
	if work.Err() != nil {
		return
	}
	msg := ""
	if err != nil {
		msg = err.Error()
		e.log.Warn("gendurable: bulk upgrade failed", "client", e.cfg.Name, "machine", machine, "request", id, "error", err)
	}
	ctx, cancel = context.WithTimeout(context.WithoutCancel(e.baseCtx), StatementTimeout(e.cfg.Lease))
	defer cancel()
	if err := e.store.FinishUpgrade(ctx, e.pool, id, by, upgraded, blocked, msg); err != nil {
		e.log.Warn("gendurable: could not record the end of a bulk upgrade; another node takes it again", "client", e.cfg.Name,
			"request", id, "error", err)
	}
}
