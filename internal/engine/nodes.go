package engine

// The node registry: each started client keeps a row in the nodes table saying what it can run
// (its queues and, per machine, its version, steps and upgrades), refreshed while it runs and
// deleted at Stop. Operators' tools read it to tell which rows no running node can run.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/gendurable/gendurable/internal/store"
)

// Registry timing: a node refreshes its row every NodeRefresh; a row not refreshed for NodeLive
// is a node that is gone (killed, partitioned); rows unseen for nodeForget are deleted.
const (
	NodeRefresh = 5 * time.Second
	NodeLive    = 30 * time.Second
	nodeForget  = time.Hour
)

// manifest is this client's row in the node registry.
func (e *Engine) manifest() *store.Node {
	n := &store.Node{ID: e.Origin(), Client: e.cfg.Name, Host: e.host, Queues: e.queueNames(),
		Machines: map[string]store.MachineManifest{}}
	for name, def := range e.cfg.Machines {
		m := store.MachineManifest{Version: def.version(), Steps: slices.Sorted(maps.Keys(def.Steps))}
		for from, steps := range def.Upgrades {
			if m.Upgrades == nil {
				m.Upgrades = map[string]store.UpgradeManifest{}
			}
			m.Upgrades[strconv.Itoa(from)] = store.UpgradeManifest{Steps: steps}
		}
		n.Machines[name] = m
	}
	return n
}

// register writes this client's registry row at Start and forgets the rows of nodes long gone.
func (e *Engine) register(ctx context.Context) error {
	node := e.manifest()
	if err := e.startTry(ctx, func(ctx context.Context) error {
		_, _, err := e.store.UpsertNode(ctx, e.pool, node)
		return err
	}); err != nil {
		return fmt.Errorf("gendurable: start: register in the node registry: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, StatementTimeout(e.cfg.Lease))
	defer cancel()
	if err := e.store.ForgetNodes(ctx, e.pool, nodeForget); err != nil {
		e.log.Warn("gendurable: could not forget the registry rows of nodes long gone", "client", e.cfg.Name, "error", err)
	}
	e.retentionsSet = e.setRetentions(ctx)
	return nil
}

// setRetentions records the retention of each machine this client registers (GC sweeps each
// machine by it). A failure is logged and tried again at the registry's next refresh.
func (e *Engine) setRetentions(ctx context.Context) bool {
	if len(e.cfg.Machines) == 0 {
		return true
	}
	r := make(map[string]time.Duration, len(e.cfg.Machines))
	for name, m := range e.cfg.Machines {
		r[name] = m.Retention
	}
	if err := e.store.SetRetentions(ctx, e.pool, r, e.Origin()); err != nil {
		e.spells.retentions.Failed(e.log, "gendurable: could not record the machines' retentions; retrying", "client", e.cfg.Name, "error", err)
		return false
	}
	e.spells.retentions.Succeeded(e.log, "gendurable: the machines' retentions are recorded", "client", e.cfg.Name)
	return true
}

// registryLoop refreshes this client's registry row until Stop, then deletes it; on each refresh
// it also looks for an operator's bulk-upgrade request this node should work.
func (e *Engine) registryLoop() {
	defer e.bg.Done()
	node := e.manifest()
	every := e.cfg.NodeRefresh
	if every <= 0 {
		every = NodeRefresh
	}
	t := time.NewTicker(every)
	defer t.Stop()
	schemaProblem := "" // the last refresh's finding on the schema's version
	for {
		select {
		case <-e.bgStop:
			ctx, cancel := context.WithTimeout(context.Background(), StatementTimeout(e.cfg.Lease))
			if err := e.store.DeleteNode(ctx, e.pool, node.ID); err != nil {
				e.log.Warn("gendurable: could not leave the node registry; the row ages out", "client", e.cfg.Name, "error", err)
			}
			cancel()
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(e.baseCtx, StatementTimeout(e.cfg.Lease))
			if version, readers, err := e.store.UpsertNode(ctx, e.pool, node); err != nil {
				e.spells.registry.Failed(e.log, "gendurable: node registry refresh failed", "client", e.cfg.Name, "error", err)
			} else {
				e.spells.registry.Succeeded(e.log, "gendurable: the node registry is refreshed again", "client", e.cfg.Name)
				schemaProblem = e.checkSchema(version, readers, schemaProblem)
			}
			if !e.retentionsSet {
				e.retentionsSet = e.setRetentions(ctx)
			}
			cancel()
			// An operator's bulk upgrade runs beside the refreshes, which must go on. Only a node
			// with a machine past version 1 can take one.
			if len(e.versions.Names) > 0 {
				e.bg.Add(1)
				go func() { defer e.bg.Done(); e.serveUpgrades() }()
			}
		}
	}
}

// checkSchema logs, once per change, that the schema's version (read by a registry refresh) is
// one this library does not run against: a migration under the running client, down below
// what it reads, or up to a version whose readers it is too old for. Its statements fail, or may
// misbehave, until the schema or the client is brought back in step; the error says how. It
// returns the finding, "" when there is none.
func (e *Engine) checkSchema(version, readers int, last string) string {
	if e.cfg.CheckSchema == nil || version == 0 {
		return last
	}
	problem := ""
	if err := e.cfg.CheckSchema(version, readers); err != nil {
		problem = err.Error()
	}
	switch {
	case problem != "" && problem != last:
		e.log.Error("gendurable: the schema was migrated under this running client to a version it does not run against",
			"client", e.cfg.Name, "version", version, "readers", readers, "error", problem)
	case problem == "" && last != "":
		e.log.Info("gendurable: the schema is at a version this client runs against again", "client", e.cfg.Name, "version", version)
	}
	return problem
}

// Blocked says why no node in nodes can run the live rows of g ("" if one can): none works the
// queue, none registers the machine, none knows the rows' version, none can bring that version
// forward from the rows' step, or none has the step. With no nodes at all there is nothing to
// compare with (the fleet is down): "".
func Blocked(nodes []store.Node, g store.LiveGroup) string {
	if len(nodes) == 0 {
		return ""
	}
	var reasons []string
	for _, n := range nodes {
		if !slices.Contains(n.Queues, g.Queue) {
			continue
		}
		r := cannotRun(n.Machines[g.Machine], g.Machine, max(g.Version, 1), g.Step)
		if r == "" {
			return ""
		}
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	switch len(reasons) {
	case 0:
		return fmt.Sprintf("no running node works queue %q", g.Queue)
	case 1:
		return reasons[0]
	}
	slices.Sort(reasons)
	return fmt.Sprintf("%s (and %d other reasons on other nodes)", reasons[0], len(reasons)-1)
}

// cannotRun says why a node with manifest m cannot run a row of machine at version at step (""
// if it can).
func cannotRun(m store.MachineManifest, machine string, version int, step string) string {
	switch {
	case m.Version == 0:
		return fmt.Sprintf("no running node of its queue registers machine %q", machine)
	case version > m.Version:
		return fmt.Sprintf("the rows are at version %d of machine %q; running nodes know version %d", version, machine, m.Version)
	}
	at := step
	for v := version; v < m.Version; v++ {
		u, ok := m.Upgrades[strconv.Itoa(v)]
		if !ok {
			return fmt.Sprintf("machine %q at version %d declares no Upgrade from version %d", machine, m.Version, v)
		}
		if to, ok := u.Steps[at]; ok {
			at = to
		}
	}
	switch {
	case slices.Contains(m.Steps, at):
	case version < m.Version:
		return fmt.Sprintf("the Upgrades of machine %q take step %q of version %d to %q, which version %d lacks",
			machine, step, version, at, m.Version)
	default:
		return fmt.Sprintf("version %d of machine %q has no step %q", m.Version, machine, step)
	}
	return ""
}
