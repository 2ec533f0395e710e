package gendurable

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/store"
)

// The inspection API: read-only views of a schema for operators' tools, the CLI, dashboards and
// metric collectors. Each call states what it reads and what that costs on a table of millions
// of rows; none takes a lock or writes.

// QueueStats is one queue's instances by status, and its lag.
type QueueStats = durabletype.QueueStats

// StuckKind says why a group of instances cannot make progress on its own.
type StuckKind = durabletype.StuckKind

// The kinds of stuck instances; see durabletype for each.
const (
	StuckUnknownRateLimit = durabletype.StuckUnknownRateLimit
	StuckUnknownMachine   = durabletype.StuckUnknownMachine
	StuckUnknownStep      = durabletype.StuckUnknownStep
	StuckAwaitOverdue     = durabletype.StuckAwaitOverdue
	StuckBlocked          = durabletype.StuckBlocked
)

// StuckGroup is a group of stuck instances of one kind, queue and machine (or step, or limit).
type StuckGroup = durabletype.StuckGroup

// ChildSummary is one child of an instance, as Inspect lists them.
type ChildSummary = durabletype.ChildSummary

// InstanceDetail is an instance with a page of its inbox and a page of its children.
type InstanceDetail = durabletype.InstanceDetail

// QueueThroughput is how many instances of one queue finished within a recent window.
type QueueThroughput = durabletype.QueueThroughput

// allStatuses are the statuses QueueStats counts by default.
var allStatuses = []Status{StatusAvailable, StatusExecuting, StatusAwaiting, StatusJoining,
	StatusDone, StatusFailed, StatusCancelled}

// QueueStatsOpts selects what QueueStats counts.
type QueueStatsOpts struct {
	// Statuses are the statuses to count; empty means all of them. None costs a read that grows
	// with the history: StatusAvailable (which also yields Runnable and OldestRunnable),
	// StatusExecuting, StatusAwaiting and StatusJoining are read from their partial indexes, in
	// time proportional to the rows in those statuses (the live work); StatusDone, StatusFailed
	// and StatusCancelled from counts that triggers on the instances table keep as rows finish,
	// are retried or deleted (a few rows per queue and status, which GC folds every sweep).
	Statuses []Status
}

// QueueStats counts instances by queue and status in one round trip: every queue holding a row
// in one of the statuses asked for, in name order, with an entry for each of those statuses
// (zero included). The counts come from one snapshot per status family (available, executing,
// parked, finished), so they may be a few milliseconds apart.
func (c *Client) QueueStats(ctx context.Context, opts *QueueStatsOpts) ([]QueueStats, error) {
	statuses := allStatuses
	if opts != nil && len(opts.Statuses) > 0 {
		statuses = nil
		for _, s := range opts.Statuses {
			if !s.Valid() {
				return nil, &InputError{Index: -1, Field: "Statuses", Reason: fmt.Sprintf("%q is not a status", s)}
			}
			if !slices.Contains(statuses, s) {
				statuses = append(statuses, s)
			}
		}
	}
	out, err := c.store.QueueStats(ctx, c.pool, statuses)
	if err != nil {
		return nil, fmt.Errorf("gendurable: queue stats: %w", err)
	}
	pauses, err := c.store.Pauses(ctx, c.pool)
	if err != nil {
		return nil, fmt.Errorf("gendurable: queue stats: %w", err)
	}
	for _, p := range pauses {
		if p.Kind != store.PauseQueue {
			continue
		}
		for i := range out {
			if out[i].Queue == p.Name {
				out[i].Paused = true
			}
		}
	}
	return out, nil
}

// Stuck lists the instances that cannot make progress on their own, grouped by kind, queue and
// machine (or step, or rate limit), as this client sees them:
//
//   - StuckUnknownRateLimit: available rows (due or not) naming a rate limit this client's
//     RateLimits lack. Cost: the rate-limited available rows, through their partial index.
//   - StuckUnknownMachine, StuckUnknownStep: available rows (due or not), in the queues this
//     client works (every queue if it works none), of a machine or a step this client does not
//     register. Cost: every available row of those queues, through the pick's index, with a heap
//     visit each. A client that registers no machine skips this check.
//   - StuckAwaitOverdue: parked instances past their await deadline. The reaper wakes these
//     within its interval; a group whose Oldest is further back than that means no node runs
//     the reaper. Cost: the overdue rows, through the await-deadline index.
//   - StuckBlocked: live rows (available, awaiting, joining) that no running node can run,
//     whatever this client registers: the node registry (every started client's queues,
//     machines, versions, steps and upgrades, refreshed every few seconds) is compared with the
//     live rows grouped by queue, machine, version and step. With no node running at all nothing
//     is reported (there is no fleet to compare with). Cost: every live row, through the pick's
//     and the parked rows' indexes, with a heap visit each.
//
// Ask a client configured like the workers in question: what is unknown to one node may be
// known to another.
func (c *Client) Stuck(ctx context.Context) ([]StuckGroup, error) {
	cfg := c.eng.Config()
	known := &store.Known{Queues: slices.Sorted(maps.Keys(cfg.Queues))}
	for _, name := range slices.Sorted(maps.Keys(cfg.Machines)) {
		for _, step := range slices.Sorted(maps.Keys(cfg.Machines[name].Steps)) {
			known.Machines = append(known.Machines, name)
			known.Steps = append(known.Steps, step)
		}
	}
	if cfg.Rates != nil {
		known.Rates = cfg.Rates.Names
	}
	out, err := c.store.Stuck(ctx, c.pool, known)
	if err != nil {
		return nil, fmt.Errorf("gendurable: stuck instances: %w", err)
	}
	blocked, err := c.blocked(ctx)
	if err != nil {
		return nil, fmt.Errorf("gendurable: stuck instances: %w", err)
	}
	return append(out, blocked...), nil
}

// blocked compares the node registry with the live rows (StuckBlocked).
func (c *Client) blocked(ctx context.Context) ([]StuckGroup, error) {
	nodes, err := c.store.LiveNodes(ctx, c.pool, engine.NodeLive)
	if err != nil {
		return nil, fmt.Errorf("read the node registry: %w", err)
	}
	groups, err := c.store.LiveGroups(ctx, c.pool)
	if err != nil {
		return nil, fmt.Errorf("group the live rows: %w", err)
	}
	var out []StuckGroup
	for _, g := range groups {
		if reason := engine.Blocked(nodes, g); reason != "" {
			out = append(out, StuckGroup{Kind: StuckBlocked, Queue: g.Queue, Machine: g.Machine, Step: g.Step,
				Version: max(g.Version, 1), Reason: reason, Count: g.Count, Oldest: g.Oldest, FirstID: g.FirstID})
		}
	}
	return out, nil
}

// InspectOpts pages Inspect's lists. Both lists are ordered by id; to read the next page, pass
// the last id of the previous one.
type InspectOpts struct {
	// InboxAfter returns only signals with a greater id.
	InboxAfter int64
	// InboxLimit caps the signals returned: default 100, at most 1,000.
	InboxLimit int
	// ChildrenAfter returns only children with a greater id.
	ChildrenAfter int64
	// ChildrenLimit caps the children returned: default 100, at most 1,000.
	ChildrenLimit int
}

// Inspect pages defaults and caps.
const (
	DefaultInspectLimit = 100
	MaxInspectLimit     = 1000
)

// Inspect reads an instance with a page of its inbox, the size of its inbox, a page of its
// children (of every wave) and their counts by status, in one statement (one snapshot);
// ErrNotFound if there is no such instance. Cost: the row by primary key, the inbox through its
// index (its size in time proportional to the inbox), and every child of the instance through
// the parent index (at most Config.MaxChildren per wave); for a live instance, the node registry
// too (Blocked).
func (c *Client) Inspect(ctx context.Context, id int64, opts *InspectOpts) (*InstanceDetail, error) {
	if opts == nil {
		opts = &InspectOpts{}
	}
	inbox := store.Page{After: opts.InboxAfter, Limit: opts.InboxLimit}
	children := store.Page{After: opts.ChildrenAfter, Limit: opts.ChildrenLimit}
	for _, p := range []struct {
		field string
		page  *store.Page
	}{{"InboxLimit", &inbox}, {"ChildrenLimit", &children}} {
		if p.page.Limit == 0 {
			p.page.Limit = DefaultInspectLimit
		}
		if p.page.Limit < 0 || p.page.Limit > MaxInspectLimit {
			return nil, &InputError{Index: -1, Field: p.field,
				Reason: fmt.Sprintf("%d: must be between 1 and %d, or 0 for %d", p.page.Limit, MaxInspectLimit, DefaultInspectLimit)}
		}
	}
	d, err := c.store.Inspect(ctx, c.pool, id, inbox, children)
	if err != nil {
		return nil, fmt.Errorf("gendurable: inspect %d: %w", id, err)
	}
	if in := &d.Instance; !in.Status.Terminal() {
		nodes, err := c.store.LiveNodes(ctx, c.pool, engine.NodeLive)
		if err != nil {
			return nil, fmt.Errorf("gendurable: inspect %d: read the node registry: %w", id, err)
		}
		d.Blocked = engine.Blocked(nodes, store.LiveGroup{Queue: in.Queue, Machine: in.Machine, Version: in.MachineVersion, Step: in.Step})
	}
	return d, nil
}

// Throughput window bounds.
const (
	DefaultThroughputWindow = time.Minute
	MaxThroughputWindow     = time.Hour
)

// Throughput counts the instances that finished within the last window (0: one minute; at most
// an hour), by queue and by how they finished, by the database clock: every queue with a row
// finished in the window, in name order. Divide by the window for a rate. Cost: the finished
// rows' index from the window's start, with a heap visit per row finished in the window, so a
// minute of a busy schema costs a minute's worth of rows, not the table. Rows that GC already
// deleted are not counted: with a GC.Retention shorter than the window it undercounts.
func (c *Client) Throughput(ctx context.Context, window time.Duration) ([]QueueThroughput, error) {
	if window == 0 {
		window = DefaultThroughputWindow
	}
	if window < time.Millisecond || window > MaxThroughputWindow {
		return nil, &InputError{Index: -1, Field: "window",
			Reason: fmt.Sprintf("%v: must be between 1ms and %v, or 0 for %v", window, MaxThroughputWindow, DefaultThroughputWindow)}
	}
	out, err := c.store.Throughput(ctx, c.pool, window)
	if err != nil {
		return nil, fmt.Errorf("gendurable: throughput: %w", err)
	}
	return out, nil
}
