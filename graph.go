package gendurable

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/engine"
)

// MinuteCount is how many instances of one queue finished in one minute.
type MinuteCount = durabletype.MinuteCount

// MachineGraph is a machine as the graph of its steps; see Client.MachineGraph.
type MachineGraph = durabletype.MachineGraph

// GraphStep is a step of a MachineGraph.
type GraphStep = durabletype.GraphStep

// GraphEdge is a transition of a MachineGraph.
type GraphEdge = durabletype.GraphEdge

// FinishedByMinute counts the instances finished per queue and minute over the given number of
// complete minutes before the current one (1 to 60; 0 means 60), by the database clock, and
// returns the current minute's start. Minutes with nothing finished are absent. Cost: the rows
// finished in the window, through the finished rows' index (as Throughput).
func (c *Client) FinishedByMinute(ctx context.Context, minutes int) ([]MinuteCount, time.Time, error) {
	if minutes == 0 {
		minutes = 60
	}
	if minutes < 1 || minutes > 60 {
		return nil, time.Time{}, &InputError{Index: -1, Field: "minutes", Reason: fmt.Sprintf("%d: must be 1 to 60, or 0 for 60", minutes)}
	}
	out, cur, err := c.store.FinishedByMinute(ctx, c.pool, minutes)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("gendurable: finished by minute: %w", err)
	}
	return out, cur, nil
}

// Machine graph sample sizes (MachineGraph's sample).
const (
	DefaultGraphSample = 10000
	MaxGraphSample     = 100000
)

// MachineGraph draws a machine as the graph of its steps: each step with its live instances by
// status, and each transition its instances took with how many times, read from the recorded
// paths of every live instance and of the sample most recently finished ones (0 means
// DefaultGraphSample). Its steps are those the node registry or this client registers for the
// machine, and those the paths name. Cost: every live row of the machine, and the sample
// through the finished rows' index by machine. A machine nobody registers and no instance
// names: ErrUnknownMachine.
func (c *Client) MachineGraph(ctx context.Context, machine string, sample int) (*MachineGraph, error) {
	if sample == 0 {
		sample = DefaultGraphSample
	}
	if sample < 1 || sample > MaxGraphSample {
		return nil, &InputError{Index: -1, Field: "sample", Reason: fmt.Sprintf("%d: must be 1 to %d, or 0 for %d", sample, MaxGraphSample, DefaultGraphSample)}
	}
	wrap := func(err error) error { return fmt.Errorf("gendurable: machine graph %q: %w", machine, err) }
	live, err := c.store.MachineLive(ctx, c.pool, machine)
	if err != nil {
		return nil, wrap(err)
	}
	edges, err := c.store.MachineEdges(ctx, c.pool, machine, sample)
	if err != nil {
		return nil, wrap(err)
	}
	nodes, err := c.store.LiveNodes(ctx, c.pool, engine.NodeLive)
	if err != nil {
		return nil, wrap(err)
	}
	steps := map[string]*GraphStep{}
	step := func(name string) *GraphStep {
		if steps[name] == nil {
			steps[name] = &GraphStep{Name: name, Live: map[Status]int64{}}
		}
		return steps[name]
	}
	if def := c.eng.Machine(machine); def != nil {
		for s := range def.Steps {
			step(s)
		}
	}
	for _, n := range nodes {
		for _, s := range n.Machines[machine].Steps {
			step(s)
		}
	}
	for s, counts := range live {
		maps.Copy(step(s).Live, counts)
	}
	g := &MachineGraph{Machine: machine}
	for _, e := range edges {
		if e.From == "" {
			step(e.To).Starts += e.Count
			g.Paths += e.Count
			continue
		}
		step(e.From)
		step(e.To)
		g.Edges = append(g.Edges, e)
	}
	if len(steps) == 0 {
		return nil, wrap(fmt.Errorf("%w: no node registers it and no instance names it", ErrUnknownMachine))
	}
	// Order: the most common first step, then a walk of the transitions, busiest first; the rest
	// by name.
	slices.SortFunc(g.Edges, func(a, b GraphEdge) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
	})
	names := slices.Sorted(maps.Keys(steps))
	var order []string
	seen := map[string]bool{}
	visit := func(s string) {
		for queue := []string{s}; len(queue) > 0; queue = queue[1:] {
			cur := queue[0]
			if seen[cur] {
				continue
			}
			seen[cur] = true
			order = append(order, cur)
			for _, e := range g.Edges {
				if e.From == cur && !seen[e.To] {
					queue = append(queue, e.To)
				}
			}
		}
	}
	starts := slices.Clone(names)
	slices.SortStableFunc(starts, func(a, b string) int { return cmp.Compare(steps[b].Starts, steps[a].Starts) })
	for _, s := range starts {
		if steps[s].Starts > 0 {
			visit(s)
		}
	}
	for _, s := range names {
		if !seen[s] {
			seen[s] = true
			order = append(order, s)
		}
	}
	for _, s := range order {
		g.Steps = append(g.Steps, *steps[s])
	}
	return g, nil
}

// Machines lists the machines this client or any node in the registry registers, by name.
func (c *Client) Machines(ctx context.Context) ([]string, error) {
	_, machines, err := c.store.RegisteredNames(ctx, c.pool)
	if err != nil {
		return nil, fmt.Errorf("gendurable: machines: %w", err)
	}
	for name := range c.eng.Config().Machines {
		if !slices.Contains(machines, name) {
			machines = append(machines, name)
		}
	}
	slices.Sort(machines)
	return machines, nil
}
