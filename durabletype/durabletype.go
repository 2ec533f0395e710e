// Package durabletype holds the leaf types of gendurable: the status of an instance, the view of
// an instance row, events and the sentinel errors. It depends on the standard library only, so
// any package (a hook, a dashboard, a test kit) can use it without pulling in the engine. The
// root package re-exports every name here by alias.
package durabletype

import (
	"encoding/json"
	"time"
)

// Status is where an instance is in its life. The values are the database enum's labels.
type Status string

// The statuses of an instance.
const (
	// StatusAvailable: runnable once its scheduled time has passed.
	StatusAvailable Status = "available"
	// StatusExecuting: claimed by a worker that holds a lease on it.
	StatusExecuting Status = "executing"
	// StatusAwaiting: parked until one of a set of signals arrives (or its await deadline).
	StatusAwaiting Status = "awaiting"
	// StatusJoining: parked until its children settle.
	StatusJoining Status = "joining"
	// StatusDone: finished with a result. Terminal.
	StatusDone Status = "done"
	// StatusFailed: finished with an error (Stop, or attempts exhausted). Terminal.
	StatusFailed Status = "failed"
	// StatusCancelled: stopped by an operator. Terminal.
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is a final status: done, failed or cancelled.
func (s Status) Terminal() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCancelled
}

// Valid reports whether s is one of the statuses above.
func (s Status) Valid() bool {
	switch s {
	case StatusAvailable, StatusExecuting, StatusAwaiting, StatusJoining,
		StatusDone, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// ErrorEntry is one error in an instance's history, oldest first on the row.
type ErrorEntry struct {
	// At is when the error was recorded (database clock).
	At time.Time `json:"at"`
	// Step is the step that failed.
	Step string `json:"step"`
	// Attempt is the try of that step that failed.
	Attempt int `json:"attempt"`
	// Kind says where the error came from: "error" (a step returned it), "panic", "outcome"
	// (the step's outcome could not be applied: unknown step, unencodable state, too large),
	// "lease" (the worker lost its claim; found by the reaper), "stop" (the step returned Stop),
	// "rejected" (the database refused the step's outcome; the instance failed with the state it
	// had), "decode" (the stored state could not be decoded), "retry" (Retry past MaxAttempts),
	// "cancel" (an operator cancelled it), "tx" (the step's transaction could not commit for a
	// reason of the step's making, ErrTxIdleTimeout), "codec" (a sealed value the step would read
	// could not be opened on the node that claimed it), "load" (the rest of a large inbox or join
	// could not be read after the claim); the last two hand the claim back, no attempt spent.
	Kind string `json:"kind"`
	// Error is the error's text.
	Error string `json:"error"`
}

// Instance is a row of the instances table as the operator's tools and the test kit see it.
// State and Result are the raw JSON documents.
type Instance struct {
	ID       int64
	Machine  string
	Step     string
	Queue    string
	Status   Status
	Priority int
	// Attempt counts the tries of the current step (its claims, less those lost to a crashed or
	// stalled worker); MaxAttempts bounds it. Recoveries counts the claims of the current step
	// that were lost to a crashed or stalled worker and released (ReaperConfig.MaxRecoveries
	// bounds it); both start again when the instance moves on.
	Attempt        int
	MaxAttempts    int
	Recoveries     int
	ScheduledAt    time.Time
	LockedBy       string
	LockedUntil    *time.Time
	State          []byte
	Result         []byte
	Errors         []ErrorEntry
	CorrelationKey string
	// AwaitNames are the signal names the instance is parked on (or, once woken, was parked on
	// until its next step's outcome); AwaitDeadline is when the reaper wakes it anyway.
	AwaitNames    []string
	AwaitDeadline *time.Time
	ParentID      *int64
	// Path is the steps taken so far, oldest first (the last 50): each step whose outcome moved
	// the instance on or finished it. Step is where it is now.
	Path        []string
	InsertedAt  time.Time
	UpdatedAt   time.Time
	FinalizedAt *time.Time
	// MachineVersion is the version of its machine the instance was last brought to (1 for a
	// machine that declares none); Upgrades are the upgrades applied to it, oldest first.
	MachineVersion int
	Upgrades       []UpgradeEntry
	// CodecError, when not empty, says why some of the instance's sealed documents (State,
	// Result, error texts, an inspected inbox's payloads) could not be opened with this client's
	// Config.Codec: those are left as stored (a JSON string "gdc1:<key>:…").
	CodecError string
}

// UpgradeEntry is one upgrade of an instance to a newer version of its machine.
type UpgradeEntry struct {
	// From and To are the machine versions before and after.
	From int `json:"from"`
	To   int `json:"to"`
	// At is when it was applied (database clock).
	At time.Time `json:"at"`
	// StepFrom and StepTo are the instance's step before and after.
	StepFrom string `json:"step_from"`
	StepTo   string `json:"step_to"`
	// By is the claim (on a worker) or the bulk upgrade that applied it.
	By string `json:"by"`
}

// Signal is a message in an instance's inbox.
type Signal struct {
	// ID orders signals by arrival.
	ID int64
	// Name is what awaits match on.
	Name string
	// Payload is the JSON document sent with it, or nil.
	Payload []byte
	// At is when it was delivered (database clock).
	At time.Time
}

// Decode unmarshals the payload into v.
func (s Signal) Decode(v any) error {
	if s.Payload == nil {
		return json.Unmarshal([]byte("null"), v)
	}
	return json.Unmarshal(s.Payload, v)
}

// InstanceSummary is an instance as lists show it: no state or result documents.
type InstanceSummary struct {
	ID             int64
	Machine        string
	Step           string
	Queue          string
	Status         Status
	Attempt        int
	MaxAttempts    int
	CorrelationKey string
	ScheduledAt    time.Time
	InsertedAt     time.Time
	UpdatedAt      time.Time
	ParentID       *int64
	// LastError is the text of the last error in its history, or "".
	LastError string
}
