package durabletype

import "time"

// EventName names an event.
type EventName string

// The events the engine emits. docs/events.md is the catalogue: when each fires and what it
// carries (a test keeps it complete).
const (
	// EventSchedulerPicked: a pick claimed rows, or an Insert claimed its row for its own client.
	// Count = rows, Duration = the pick's (the Insert's) round trip.
	EventSchedulerPicked EventName = "scheduler.picked"
	// EventSchedulerReclaimed: startup reclaim released a dead predecessor's claims. Count = rows.
	EventSchedulerReclaimed EventName = "scheduler.reclaimed"
	// EventSchedulerFailed: a pick failed; the queue picks again at its next poll. Queue, Err,
	// Duration = the pick's time.
	EventSchedulerFailed EventName = "scheduler.failed"
	// EventStepStarted: a claimed step began to run.
	EventStepStarted EventName = "step.started"
	// EventStepFinished: a step's outcome committed. Outcome = the outcome's kind, Duration = the
	// time from the step's start to the commit.
	EventStepFinished EventName = "step.finished"
	// EventStepError: a step returned an error, panicked or produced an outcome that cannot be
	// applied; it was routed to the machine's Handle. Err carries the error, Panic says which.
	EventStepError EventName = "step.error"
	// EventOutcomeStale: an outcome was dropped because its worker no longer owned the claim
	// (the lease ran out and the row was reclaimed). The row keeps the new owner's progress.
	EventOutcomeStale EventName = "outcome.stale"
	// EventCommitFailed: committing outcomes failed and will be retried. Count = outcomes.
	EventCommitFailed EventName = "commit.failed"
	// EventFSMUnknown: this node claimed a row whose machine (or step) it does not know. The claim
	// was released untouched for a node that knows it; the row stays available.
	EventFSMUnknown EventName = "fsm.unknown"
	// EventHeartbeatLost: the heartbeat found claims this worker no longer owns; their steps'
	// contexts are cancelled with ErrLeaseLost. Count = claims.
	EventHeartbeatLost EventName = "heartbeat.lost"
	// EventHeartbeatBeat: the heartbeat extended the leases of this client's claims (a beat
	// with no claims in flight sends nothing and reports nothing). Count = claims sent,
	// Duration = the statement's time.
	EventHeartbeatBeat EventName = "heartbeat.beat"
	// EventHeartbeatFailed: a beat did not reach the database (or the database refused it); the
	// next one is sent soon after. Count = claims it was to extend, Duration = the statement's
	// time until it failed, Err = why.
	EventHeartbeatFailed EventName = "heartbeat.failed"
	// EventReaperSwept: a reaper sweep ran to its end (every sweep, also one that found
	// nothing). Count = rows it changed (claims released, parked rows woken at their await
	// deadline, runnable rows made due after the database's clock stepped back), Duration = the
	// sweep's time.
	EventReaperSwept EventName = "reaper.swept"
	// EventReaperFailed: a reaper sweep failed; the next sweep is at the reaper's interval.
	// Err, Duration = the time until it failed.
	EventReaperFailed EventName = "reaper.failed"
	// EventReaperReclaimed: the reaper released rows whose lease had expired. Count = rows
	// released, Failed = rows failed because they had no attempts left.
	EventReaperReclaimed EventName = "reaper.reclaimed"
	// EventConcurrencyThrottled: a pick's window held rows that their concurrency key or gate
	// could not admit in that pick (they stay available). Count = rows denied.
	EventConcurrencyThrottled EventName = "concurrency.throttled"
	// EventConcurrencyContended: a pick lost a race with another pick for a concurrency key or a
	// gate's last slot; it was retried. Err carries the refused statement's error.
	EventConcurrencyContended EventName = "concurrency.contended"
	// EventGCSwept: a GC sweep ran (every sweep, also one that found nothing). Count = finished
	// instances deleted, Buckets = rate-limit buckets pruned, Gates = gate counters repaired or
	// removed, Duration = the sweep's time.
	EventGCSwept EventName = "gc.swept"
	// EventGCFailed: a GC sweep failed; the next sweep is at GC's interval. Err, Duration = the
	// time until it failed.
	EventGCFailed EventName = "gc.failed"
	// EventRateLimitThrottled: a pick's window held rate-limited rows their bucket could not
	// afford yet (they stay available). Count = rows.
	EventRateLimitThrottled EventName = "rate_limit.throttled"
	// EventRateLimitContended: another pick's writeback took a bucket's tokens first; this pick
	// claimed none of that bucket's rows. Count = buckets.
	EventRateLimitContended EventName = "rate_limit.contended"
	// EventRateLimitUnknown: runnable rows name a rate limit this node's configuration does not;
	// they stall until it does. Key = the limit, Count = rows (the reaper of a node that runs
	// queues reports it).
	EventRateLimitUnknown EventName = "rate_limit.unknown"
	// EventAwaitTimeout: parked instances reached their await deadline and were woken without
	// the signal. Count = instances.
	EventAwaitTimeout EventName = "await.timeout"
	// EventInstanceCancelled: an operator cancelled an instance (Client.Cancel). InstanceID,
	// Queue, Machine, Step (where it stopped).
	EventInstanceCancelled EventName = "instance.cancelled"
	// EventInstanceRetried: an operator made a failed or cancelled instance runnable again
	// (Client.Retry). InstanceID, Queue, Machine, Step (where it resumes).
	EventInstanceRetried EventName = "instance.retried"
	// EventInstanceUpgraded: an instance was brought forward to a newer version of its machine
	// (on its claim, or by Client.Upgrade). InstanceID, Queue, Machine, Step (where it goes on),
	// Version (the version it is at now).
	EventInstanceUpgraded EventName = "instance.upgraded"
	// EventScheduleFired: a schedule fired. Schedule, Machine, Queue, Count = instances inserted
	// (more than one when it caught up missed fire times), InstanceID = the last one, Duration =
	// how late the last fire was (from its fire time to the commit of its insert).
	EventScheduleFired EventName = "schedule.fired"
	// EventScheduleSkipped: a schedule let fire times pass without an instance. Schedule,
	// Reason ("overlap": its last instance was still live, or a newer fire superseded it;
	// "catch-up": missed while no node fired it, outside its catch-up window), Count = fire
	// times skipped.
	EventScheduleSkipped EventName = "schedule.skipped"
	// EventScheduleFailed: firing a schedule failed; it is tried again a few seconds later (its
	// fire times stay due). Schedule, Err.
	EventScheduleFailed EventName = "schedule.failed"
)

// Event is what hooks receive. Fields that do not apply to an event are zero.
type Event struct {
	Name       EventName
	At         time.Time
	Client     string
	Queue      string
	Machine    string
	Step       string
	InstanceID int64
	Attempt    int
	// Outcome is the kind of a committed outcome: "next", "retry", "await", "spawn", "done",
	// "failed", "released", "upgrade".
	Outcome string
	Count   int
	Failed  int
	// Gates is how many gate counters a GC sweep repaired or removed; Buckets how many rate-limit
	// buckets it pruned.
	Gates   int
	Buckets int
	// Key is the rate limit an event is about.
	Key string
	// Version is the machine version an instance was brought to (instance.upgraded).
	Version int
	// Schedule is the schedule an event is about; Reason why its fire times were skipped.
	Schedule string
	Reason   string
	Duration time.Duration
	Err      error
	Panic    bool
}
