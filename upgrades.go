package gendurable

import (
	"context"
	"errors"
	"fmt"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/engine"
	"github.com/jackc/pgx/v5"
)

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
