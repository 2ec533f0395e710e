// Package fault holds gendurable's named fault points: the places, at the engine's race windows,
// where the reliability tests step in (the BUGGIFY idea of FoundationDB, the test hooks of
// Temporal).
//
// A normal build compiles every point away. The functions of fault_off.go are empty, and every
// call site in the engine sits inside `if fault.Enabled { … }`, with Enabled the constant false:
// the compiler drops the whole block, arguments and all, so a normal build runs exactly the code
// it would run without the points (TestPointsCostNothingInANormalBuild checks both halves of that
// argument).
//
// Built with `-tags chaos`, a point does two things (fault_on.go):
//
//   - It runs the hooks a test registered for it (Set), in the goroutine that reached it. A hook
//     may block (a test holds a worker exactly at the window and lets it go when it wants: the
//     interleaving is the test's, not the scheduler's) or return an error, which the caller
//     handles as the failure the point stands for.
//   - With GD_FAULT_P set (a probability), it draws from a PRNG seeded by GD_FAULT_SEED (else
//     GD_SEED, else the time; the seed is printed) and, at that probability, sleeps 0-20 ms, or
//     at the points whose callers recover by themselves (heartbeat, the reaper's sweep, GC)
//     returns ErrInjected.
//
// The registry behind this is the package's only state, and it exists only under the tag: a
// fault point is reached from deep inside the engine, where no test can pass anything in, so
// the hooks have to live somewhere every goroutine of the process can see.
package fault

// The named points, and where each sits.
const (
	// AfterClaimCommit is reached by a queue's scheduler right after its pick committed the
	// claims, before the rows go to the executors (subject: the claim token). An error loses the
	// pick's result: the claims stay until their lease runs out and the reaper releases them.
	AfterClaimCommit = "after_claim_commit"
	// BeforeOutcome is reached by an executor once the step has returned, before its outcome is
	// handed to the committer (subject: the claim token); the executor's slot stays taken while it
	// waits. An error drops the outcome, as a worker that died before committing would: the claim
	// is reclaimed when its lease runs out.
	BeforeOutcome = "before_outcome"
	// AfterStepTxCommit is reached by an executor right after a step's own transaction
	// (Ctx.Tx) committed the step's outcome, before the engine hears of it (subject: the claim
	// token). A hook that blocks holds the engine in the window where the outcome has landed and
	// the step is not yet settled; an error stands for the session lost with the commit's
	// acknowledgement (the engine closes the connection).
	AfterStepTxCommit = "after_step_tx_commit"
	// AwaitBetweenStmts is reached between the park (the outcome statement that set a row
	// awaiting, holding its row lock) and the re-check of its inbox, inside the outcome
	// transaction (subject: the claim token of each parked row). See store.ApplyOutcomes.
	AwaitBetweenStmts = "await_between_stmts"
	// DeliverBeforeWake is reached by a signal delivery before its statement (which locks the
	// target, decides the wake and stores the signal) is sent (subject: the target id, or
	// "machine/key").
	DeliverBeforeWake = "deliver_before_wake"
	// Heartbeat is reached by a client's heartbeat before the statement that extends its leases
	// (subject: the client name). An error is a failed beat.
	Heartbeat = "heartbeat"
	// ReaperBetweenSelectUpdate is reached by the reaper (and a starting scheduler's reclaim)
	// after its release statement has selected and released the expired claims, holding their
	// row locks, before its transaction clears the failed rows' inboxes and commits (subject:
	// the worker-id prefix, empty for the reaper). The select and the update are one statement;
	// this is the closest window Go can see. An error rolls the sweep back.
	ReaperBetweenSelectUpdate = "reaper_between_select_update"
	// GCBetweenSelectDelete is reached by the GC's gate reconciler between the statement that
	// selects and locks the counters that look wrong and the one that repairs them and deletes
	// the retired ones (subject: empty). The GC of instances and buckets is one statement each
	// (select and delete under one snapshot), with no window Go can see. An error rolls the
	// reconciliation back.
	GCBetweenSelectDelete = "gc_between_select_delete"
	// GateBeforeCredit is reached before an outcome statement that gives gate slots back
	// (subject: each credited key), whoever applies it (the committer, a step's own
	// transaction, the shutdown release, the test kit's drain). An error fails the statement.
	GateBeforeCredit = "gate_before_credit"
	// BucketBeforeWriteback is reached before a pick that may debit rate-limit buckets is sent
	// (subject: the queue). The balance read and the writeback are one statement; the tests
	// reach the window between them from the server side (a trigger on the buckets table). An
	// error fails the pick.
	BucketBeforeWriteback = "bucket_before_writeback"
	// InboxPurge is reached before the statement that clears the inboxes of instances that
	// finished while a signal arrived for them, which follows their outcomes' statement (subject:
	// "tx" inside a step's transaction, else empty). An error fails that statement: on a pool the
	// outcomes stand and the engine clears those inboxes later; in a transaction it aborts it.
	InboxPurge = "inbox_purge"
)

// Names lists every named point.
func Names() []string {
	return []string{AfterClaimCommit, BeforeOutcome, AfterStepTxCommit, AwaitBetweenStmts, DeliverBeforeWake, Heartbeat,
		ReaperBetweenSelectUpdate, GCBetweenSelectDelete, GateBeforeCredit, BucketBeforeWriteback, InboxPurge}
}
