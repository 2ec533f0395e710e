package durabletype

import "time"

// QueueStats is one queue's instances by status, as Client.QueueStats reads them.
type QueueStats struct {
	// Queue is the queue's name.
	Queue string
	// Counts holds an entry for every status the call asked for, zero included.
	Counts map[Status]int64
	// Runnable is how many of the available rows are due now (scheduled at or before the
	// database's now()); the rest of Counts[StatusAvailable] is scheduled for later. Zero unless
	// the call asked for StatusAvailable.
	Runnable int64
	// OldestRunnable is how long the longest-waiting due row has been due (now() minus its
	// scheduled time, by the database clock): the queue's lag. Zero when nothing is due.
	OldestRunnable time.Duration
	// Paused says the queue is paused (Client.Pause): no node claims its rows.
	Paused bool
}

// StuckKind says why a group of instances cannot make progress on its own.
type StuckKind string

// The kinds of stuck instances.
const (
	// StuckUnknownRateLimit: available rows name a rate limit the client's configuration does
	// not; no pick of that client admits them (the maintenance sweep reports the same as
	// rate_limit.unknown).
	StuckUnknownRateLimit StuckKind = "unknown_rate_limit"
	// StuckUnknownMachine: available rows of a machine the client does not register; its
	// workers hand them back untouched (fsm.unknown) for a node that knows the machine.
	StuckUnknownMachine StuckKind = "unknown_machine"
	// StuckUnknownStep: available rows of a registered machine, at a step the client's version
	// of it does not have (fsm.unknown).
	StuckUnknownStep StuckKind = "unknown_step"
	// StuckAwaitOverdue: parked instances whose await deadline has passed. The reaper wakes them
	// within its interval; rows overdue for longer mean no node runs the reaper.
	StuckAwaitOverdue StuckKind = "await_overdue"
	// StuckBlocked: live rows (available, awaiting or joining) that no running node can run, as
	// the node registry says: none works their queue, registers their machine, knows their
	// version of it, can bring that version forward from their step, or has their step. Reason
	// says which. They wait, untouched, for a node that can (docs/upgrading.md). Reported only
	// while at least one node runs.
	StuckBlocked StuckKind = "blocked"
)

// StuckGroup is a group of stuck instances: one kind, one queue, one machine (or step, or rate
// limit).
type StuckGroup struct {
	Kind  StuckKind
	Queue string
	// Machine is the instances' machine (every kind but StuckUnknownRateLimit).
	Machine string
	// Step is the step the client does not know (StuckUnknownStep), or the rows' step
	// (StuckBlocked).
	Step string
	// Version is the rows' machine version (StuckBlocked only).
	Version int
	// Reason says why no running node can run the rows (StuckBlocked only).
	Reason string
	// RateLimit is the unknown limit's name, the part of the rows' keys before the first ':'
	// (StuckUnknownRateLimit only).
	RateLimit string
	// Count is how many instances are in the group.
	Count int64
	// Oldest is the earliest scheduled time among the rows (StuckUnknown…, StuckBlocked: it may
	// lie in the future for rows not yet due), or the earliest await deadline
	// (StuckAwaitOverdue).
	Oldest time.Time
	// FirstID is the lowest id in the group: an example to look at.
	FirstID int64
}

// ChildSummary is one child of an instance, as Client.Inspect lists them.
type ChildSummary struct {
	ID      int64
	Machine string
	Step    string
	Queue   string
	Status  Status
	Attempt int
	// Wave is the parent's Spawn that started it: 1 for its first, 2 for its second, …
	Wave int
	// Error is the child's last recorded error, or "".
	Error     string
	UpdatedAt time.Time
}

// InstanceDetail is an instance with a page of its inbox and a page of its children, read in one
// snapshot by Client.Inspect.
type InstanceDetail struct {
	Instance Instance
	// Inbox is a page of the instance's inbox, oldest first.
	Inbox []Signal
	// InboxSize is how many signals the whole inbox holds.
	InboxSize int64
	// Children is a page of the instance's children (of every wave), by id.
	Children []ChildSummary
	// ChildCounts counts all of its children by status (only the statuses that occur).
	ChildCounts map[Status]int64
	// Blocked says why no running node can run the instance, as the node registry says (see
	// StuckBlocked); empty if one can, if it is finished, or if no node runs at all.
	Blocked string
	// PausedAt is when the instance itself was paused (Client.Pause); nil if it is not.
	PausedAt *time.Time
}

// QueueThroughput is how many instances of one queue finished within a recent window, by how
// they finished, as Client.Throughput reads them.
type QueueThroughput struct {
	// Queue is the queue's name.
	Queue string
	// Done, Failed and Cancelled count the instances that reached each terminal status within
	// the window (by finalized_at, database clock).
	Done, Failed, Cancelled int64
}

// UpgradeRequest is an operator's request for a bulk upgrade of a machine's instances, as
// recorded.
type UpgradeRequest struct {
	ID          int64
	Machine     string
	RequestedAt time.Time
	// TakenBy is the node working (or that worked) the request; empty until one takes it.
	TakenBy string
	// FinishedAt is when it ended (nil: not yet).
	FinishedAt *time.Time
	// Version is the machine version the instances were brought to.
	Version int
	// Upgraded and Blocked count the instances brought forward and those that could not be.
	Upgraded int64
	Blocked  int64
	// Error is why the work stopped early ("" for none).
	Error string
}
