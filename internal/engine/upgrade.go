package engine

// Machine versions at claim time: whether this node can run a claimed row's step as the row
// stands, brings it forward to the node's version of its machine first, or hands it back for a
// node that can run it.

import (
	"fmt"

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
		out.Fence(c)
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
