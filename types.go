package gendurable

import "github.com/gendurable/gendurable/durabletype"

// Status is where an instance is in its life.
type Status = durabletype.Status

// The statuses of an instance.
const (
	StatusAvailable = durabletype.StatusAvailable
	StatusExecuting = durabletype.StatusExecuting
	StatusAwaiting  = durabletype.StatusAwaiting
	StatusJoining   = durabletype.StatusJoining
	StatusDone      = durabletype.StatusDone
	StatusFailed    = durabletype.StatusFailed
	StatusCancelled = durabletype.StatusCancelled
)

// Instance is an instance row as Client.Get returns it.
type Instance = durabletype.Instance

// Signal is a message in an instance's inbox; a step sees them on Ctx.Inbox and Ctx.Awaited.
type Signal = durabletype.Signal

// ErrorEntry is one error in an instance's history.
type ErrorEntry = durabletype.ErrorEntry

// Event is what hooks in Config.Hooks receive.
type Event = durabletype.Event

// EventName names an event.
type EventName = durabletype.EventName

// The events; docs/events.md describes each.
const (
	EventSchedulerPicked      = durabletype.EventSchedulerPicked
	EventSchedulerReclaimed   = durabletype.EventSchedulerReclaimed
	EventSchedulerFailed      = durabletype.EventSchedulerFailed
	EventStepStarted          = durabletype.EventStepStarted
	EventStepFinished         = durabletype.EventStepFinished
	EventStepError            = durabletype.EventStepError
	EventOutcomeStale         = durabletype.EventOutcomeStale
	EventCommitFailed         = durabletype.EventCommitFailed
	EventFSMUnknown           = durabletype.EventFSMUnknown
	EventHeartbeatLost        = durabletype.EventHeartbeatLost
	EventHeartbeatBeat        = durabletype.EventHeartbeatBeat
	EventHeartbeatFailed      = durabletype.EventHeartbeatFailed
	EventReaperSwept          = durabletype.EventReaperSwept
	EventReaperReclaimed      = durabletype.EventReaperReclaimed
	EventReaperFailed         = durabletype.EventReaperFailed
	EventAwaitTimeout         = durabletype.EventAwaitTimeout
	EventInstanceCancelled    = durabletype.EventInstanceCancelled
	EventInstanceRetried      = durabletype.EventInstanceRetried
	EventInstanceUpgraded     = durabletype.EventInstanceUpgraded
	EventConcurrencyThrottled = durabletype.EventConcurrencyThrottled
	EventConcurrencyContended = durabletype.EventConcurrencyContended
	EventGCSwept              = durabletype.EventGCSwept
	EventGCFailed             = durabletype.EventGCFailed
	EventRateLimitThrottled   = durabletype.EventRateLimitThrottled
	EventRateLimitContended   = durabletype.EventRateLimitContended
	EventRateLimitUnknown     = durabletype.EventRateLimitUnknown
	EventScheduleFired        = durabletype.EventScheduleFired
	EventScheduleSkipped      = durabletype.EventScheduleSkipped
	EventScheduleFailed       = durabletype.EventScheduleFailed
)

// Sentinel errors; see durabletype for their meaning.
var (
	ErrNotFound          = durabletype.ErrNotFound
	ErrNoTarget          = durabletype.ErrNoTarget
	ErrPayloadTooLarge   = durabletype.ErrPayloadTooLarge
	ErrInvalidPayload    = durabletype.ErrInvalidPayload
	ErrCodec             = durabletype.ErrCodec
	ErrUnknownMachine    = durabletype.ErrUnknownMachine
	ErrUnknownStep       = durabletype.ErrUnknownStep
	ErrUnknownVersion    = durabletype.ErrUnknownVersion
	ErrUpgrade           = durabletype.ErrUpgrade
	ErrInvalidIdentifier = durabletype.ErrInvalidIdentifier
	ErrInvalidInput      = durabletype.ErrInvalidInput
	ErrInvalidConfig     = durabletype.ErrInvalidConfig
	ErrSchemaMismatch    = durabletype.ErrSchemaMismatch
	ErrNotMigrated       = durabletype.ErrNotMigrated
	ErrClientStopped     = durabletype.ErrClientStopped
	ErrLeaseLost         = durabletype.ErrLeaseLost
	ErrCancelled         = durabletype.ErrCancelled
	ErrWrongStatus       = durabletype.ErrWrongStatus
	ErrTxIdleTimeout     = durabletype.ErrTxIdleTimeout
	ErrUnknownSchedule   = durabletype.ErrUnknownSchedule
	ErrUnknownQueue      = durabletype.ErrUnknownQueue
	ErrScheduleOwned     = durabletype.ErrScheduleOwned
)

// ConfigError names an invalid Config field.
type ConfigError = durabletype.ConfigError

// InputError names an invalid argument (and, in a batch, its row).
type InputError = durabletype.InputError
