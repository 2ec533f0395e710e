package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/engine"
	"github.com/jackc/pgx/v5"
)

// maxVersion bounds FSM.Version: far more versions than any machine will have, small enough
// that a typo (a date, a hash) is caught.
const maxVersion = 1 << 16

// Upgrade brings an instance of version From of its machine forward to version From+1: where it
// goes on and what its stored state becomes. An FSM lists one per older version it can still
// take (FSM.Upgrades); a node that runs version N of a machine brings an instance of version
// N−k forward through k of them, in order, when it claims the instance (or when Client.Upgrade
// asks), and records each on the row. docs/upgrading.md says when a machine needs a new version.
type Upgrade struct {
	// From is the version this upgrade starts from (at least 1).
	From int
	// Steps maps the steps of version From that version From+1 renamed or removed to the step an
	// instance at that step goes on at. A step not in Steps keeps its name.
	Steps map[string]string
	// State rewrites the stored state of an instance that was at step (its name in version From)
	// for version From+1: it gets the JSON as stored and returns the JSON to store (for example
	// with a new field filled in). Nil keeps the state as it is. It works on JSON, not on the
	// state's Go type, because version From's type may no longer exist; an error leaves the
	// instance at version From, blocked, with the error as the reason.
	State func(step string, state json.RawMessage) (json.RawMessage, error)
}

// checkUpgrades validates a machine's version and upgrades against its steps.
func checkUpgrades(name string, version int, ups []Upgrade, steps map[string]bool) error {
	if version < 0 || version > maxVersion {
		return fmt.Errorf("machine %q: Version %d must be between 1 and %d (0 means 1)", name, version, maxVersion)
	}
	version = max(version, 1)
	seen := map[int]bool{}
	for _, u := range ups {
		if u.From < 1 || u.From >= version {
			return fmt.Errorf("machine %q: an Upgrade from version %d: versions 1 to %d can be brought forward to Version %d",
				name, u.From, version-1, version)
		}
		if seen[u.From] {
			return fmt.Errorf("machine %q: two Upgrades from version %d", name, u.From)
		}
		seen[u.From] = true
		for from, to := range u.Steps {
			if err := checkName("step name", from); err != nil {
				return fmt.Errorf("machine %q: Upgrade from version %d: %w", name, u.From, err)
			}
			if err := checkName("step name", to); err != nil {
				return fmt.Errorf("machine %q: Upgrade from version %d: %w", name, u.From, err)
			}
			// The last upgrade lands on this version: its targets must be steps of it.
			if u.From == version-1 && !steps[to] {
				return fmt.Errorf("machine %q: Upgrade from version %d maps step %q to %q, which is not in Steps",
					name, u.From, from, to)
			}
		}
	}
	return nil
}

// upgradeSteps returns, for each upgrade, the steps it renames (the node registry's manifest).
func upgradeSteps(ups []Upgrade) map[int]map[string]string {
	if len(ups) == 0 {
		return nil
	}
	out := make(map[int]map[string]string, len(ups))
	for _, u := range ups {
		out[u.From] = maps.Clone(u.Steps)
	}
	return out
}

// upgradeChain returns the function that brings a row of an older version forward to version
// through ups, one version at a time.
func upgradeChain(name string, version int, ups []Upgrade) func(from int, step string, state []byte) (string, []byte, error) {
	byFrom := map[int]Upgrade{}
	for _, u := range slices.Clone(ups) {
		byFrom[u.From] = u
	}
	return func(from int, step string, state []byte) (string, []byte, error) {
		for v := from; v < version; v++ {
			u, ok := byFrom[v]
			if !ok {
				return "", nil, fmt.Errorf("machine %q declares no Upgrade from version %d", name, v)
			}
			if u.State != nil {
				next, err := u.State(step, json.RawMessage(state))
				if err != nil {
					return "", nil, fmt.Errorf("Upgrade from version %d, State at step %q: %w", v, step, err)
				}
				if !json.Valid(next) {
					return "", nil, fmt.Errorf("Upgrade from version %d, State at step %q returned invalid JSON", v, step)
				}
				state = next
			}
			if to, ok := u.Steps[step]; ok {
				step = to
			}
		}
		return step, state, nil
	}
}

// UpgradeResult is what a bulk upgrade did.
type UpgradeResult struct {
	// Upgraded counts the instances brought forward.
	Upgraded int64
	// Blocked counts the instances the machine's Upgrades cannot bring forward (no Upgrade from
	// their version, a step mapped nowhere, a failing State); they stay as they are.
	Blocked int64
}

// UpgradeRequest is an operator's request for a bulk upgrade (RequestUpgrade), as recorded.
type UpgradeRequest = durabletype.UpgradeRequest

// Upgrade brings the live instances of machine that no worker holds (runnable, scheduled,
// parked on signals, joining) forward to this client's version of it (FSM.Version), in batches
// of a few hundred, each one short transaction that skips rows another transaction holds. An
// instance brought forward records the upgrade, and emits instance.upgraded; instances left
// behind (held at the time, or blocked) are brought forward when a worker claims them, which
// needs no call at all: Upgrade is for instances parked for long, so that the old version's
// steps can be removed from the code. machine must be registered on this client
// (ErrUnknownMachine otherwise).
func (c *Client) Upgrade(ctx context.Context, machine string) (UpgradeResult, error) {
	up, blocked, err := c.eng.UpgradeAll(ctx, machine, "Client.Upgrade on "+c.eng.Origin(), nil)
	return UpgradeResult{Upgraded: up, Blocked: blocked}, err
}

// RequestUpgrade asks the running nodes for a bulk upgrade of machine, as Upgrade does, and
// returns the request's id: a started client that registers machine at the newest version any
// running node knows takes the request within a few seconds, works it, and records the result
// (UpgradeRequestStatus). For operators' tools, which do not register the machines themselves
// (gendurable upgrade). If no running node registers machine at a version above 1, nothing is
// recorded: ErrUnknownMachine.
func (c *Client) RequestUpgrade(ctx context.Context, machine string) (int64, error) {
	if err := checkName("machine name", machine); err != nil {
		return 0, &InputError{Index: -1, Field: "machine", Reason: err.Error()}
	}
	nodes, err := c.store.LiveNodes(ctx, c.pool, engine.NodeLive)
	if err != nil {
		return 0, fmt.Errorf("gendurable: request an upgrade of %q: read the node registry: %w", machine, err)
	}
	newest := 0
	for _, n := range nodes {
		newest = max(newest, n.Machines[machine].Version)
	}
	if newest < 2 {
		return 0, fmt.Errorf("gendurable: request an upgrade of %q: %w: no running node registers it at a version above 1",
			machine, ErrUnknownMachine)
	}
	id, err := c.store.RequestUpgrade(ctx, c.pool, machine)
	if err != nil {
		return 0, fmt.Errorf("gendurable: request an upgrade of %q: %w", machine, err)
	}
	return id, nil
}

// UpgradeRequestStatus reads a bulk-upgrade request; ErrNotFound if there is none.
func (c *Client) UpgradeRequestStatus(ctx context.Context, id int64) (*UpgradeRequest, error) {
	r, err := c.store.UpgradeStatus(ctx, c.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: upgrade request %d", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("gendurable: %w", err)
	}
	return r, nil
}
