package durabletype

import "time"

// MinuteCount is how many instances of one queue finished in one minute, by how they finished
// (Client.FinishedByMinute).
type MinuteCount struct {
	Queue string
	// Minute is the minute's start (database clock, UTC).
	Minute                  time.Time
	Done, Failed, Cancelled int64
}

// MachineGraph is a machine as the graph of its steps (Client.MachineGraph): the live instances
// at each step, and the transitions its instances' recorded paths took.
type MachineGraph struct {
	Machine string
	// Steps are every step the node registry or a path names, the most common first step first,
	// then in the order a walk of the transitions from it reaches them, then the rest by name.
	Steps []GraphStep
	// Edges are the transitions taken, each with how many times.
	Edges []GraphEdge
	// Paths is how many instances' paths were read: every live one and up to the sample of the
	// most recently finished.
	Paths int64
}

// GraphStep is one step of a MachineGraph: its live instances by status (only the statuses that
// occur), and how many of the paths read began there.
type GraphStep struct {
	Name   string
	Live   map[Status]int64
	Starts int64
}

// GraphEdge is a transition from one step to the next, taken Count times in the paths read.
type GraphEdge struct {
	From, To string
	Count    int64
}
