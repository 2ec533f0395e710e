package engine

// The executor: one claimed row's step, from the claim to one outcome value (store.Outcome), and
// what follows the outcome's commit (events, wakes, the await bridge). The runner's executor
// goroutines call runStep; the test kit's Drain calls execute and applies the outcome itself.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// runStep executes one claimed step and hands its outcome to the committer (or, for a step that
// wrote through its transaction, commits it there). release frees the row's executor slot: once
// the outcome is handed off (the committer's bounded queue is the backpressure). A job may have
// waited for its executor (prefetched says the queue prefetches), and what happened meanwhile
// decides whether its step runs (begin).
func (e *Engine) runStep(queue string, j job, prefetched bool, release func()) {
	f, ctx, c, gl := j.f, j.ctx, j.row, j.lease
	out, run, abandoned := e.begin(queue, j, prefetched)
	if abandoned {
		e.inFlight.Add(-1)
		release()
		return
	}
	var call *Call
	if run {
		out, call = e.execute(ctx, e.pool, queue, c)
	}
	if run && (out.Kind == store.KindRetry || out.Kind == store.KindFailed) && errors.Is(context.Cause(ctx), durabletype.ErrLeaseLost) {
		// The heartbeat could not reach the database for a whole lease and cancelled the step,
		// which then failed: the cancellation's failure, not the step's. The database may still
		// show the claim as this client's (no reaper released it yet); the claim is handed back
		// as the reaper would (a recovery, no attempt spent), never charged as a try, and a job
		// on its last attempt does not fail for a heartbeat's outage. A claim that is gone makes
		// the hand-back stale.
		if call != nil {
			call.RollbackTx()
		}
		out = store.Recovery(c, c.Slot(), 0, errKindLease, e.cfg.MaxRecoveries,
			fmt.Errorf("%w: the worker's heartbeat could not reach the database for a whole lease, and it cancelled the step, which then failed: %s",
				durabletype.ErrLeaseLost, out.ErrMsg))
	}
	if fault.Enabled {
		// The step has run; its outcome is not committed yet, and this slot stays taken. An
		// error drops the outcome, as a worker dying here would: the lease runs out and the
		// reaper releases the claim.
		if err := fault.PointFor(fault.BeforeOutcome, c.Owner); err != nil {
			e.inFlight.Add(-1)
			if call != nil {
				call.RollbackTx()
			}
			release()
			e.finish(f, &out, false, err)
			return
		}
	}
	e.inFlight.Add(-1)
	if gl != nil && gl.isLive() {
		// The slot goes back to the lease when the outcome applies, not to the counter.
		out.Credit = nil
		f.gaveBack = true
	}
	if call != nil && call.tx != nil {
		e.committing(f)
		tx := call.tx
		applied, woken, err := e.commitInTx(call, &out)
		if err != nil && tx.Conn().IsClosed() && e.handOff(f) {
			// The transaction's session was lost (terminated, reset, timed out, the primary
			// changed): if the commit was sent its fate is unknown, else nothing committed. The
			// claim goes back through the committer, which retries it like any outcome: if the
			// commit did land, the hand-back finds the claim gone and is dropped; if not, the row
			// is runnable again at once rather than once its lease runs out, and the step runs
			// again (its writes rolled back). An error that leaves the session open (the step
			// misused its transaction, a value that cannot be encoded) is no such loss: it waits
			// for the lease like any failed commit, so that it cannot loop without a count.
			// The hand-back counts a recovery of the step, as a reaped claim does: a step whose
			// session is always ended (a watchdog that ends long transactions, a statement that
			// crashes its backend) fails past MaxRecoveries instead of running for ever.
			// A session the server ended because the step held its transaction idle is the
			// step's failure instead: counted as a try and handled like an error it returned.
			next, fault := e.stepTxFault(call, &out, err)
			if !fault {
				next = store.Recovery(call.Row, out.Credit, 0, errKindSession, e.cfg.MaxRecoveries,
					fmt.Errorf("the session of the step's transaction (Ctx.Tx) was lost before its commit was acknowledged: %w", err))
			}
			if next.Kind == store.KindReleased {
				e.log.Warn("gendurable: a step's transaction lost its session; handing its claim back",
					"client", e.cfg.Name, "queue", f.queue, "id", f.id, "error", err)
				e.Emit(durabletype.Event{Name: durabletype.EventCommitFailed, Queue: f.queue, Machine: f.machine, Step: f.step,
					InstanceID: f.id, Attempt: f.attempt, Count: 1, Err: err})
			} else {
				level, msg, logged := slog.LevelError,
					"gendurable: a step's transaction lost its session once more than MaxRecoveries allows; the instance failed", next.Cause
				if fault {
					level, msg, logged = slog.LevelWarn, "gendurable: a step's transaction sat idle past the server's timeout; the step failed", err
				}
				e.log.Log(context.Background(), level, msg, "client", e.cfg.Name, "queue", f.queue, "id", f.id, "error", logged)
				e.Emit(durabletype.Event{Name: durabletype.EventStepError, Queue: f.queue, Machine: f.machine, Step: f.step,
					InstanceID: f.id, Attempt: f.attempt, Err: next.Cause})
			}
			e.committer.submit(&commitReq{flight: f, out: next, release: release})
			return
		}
		release()
		e.finish(f, &out, applied, err)
		e.wakeAll(woken)
		return
	}
	if !e.handOff(f) {
		release()
		e.dropAbandoned(f, &out)
		return
	}
	e.committer.submit(&commitReq{flight: f, out: out, release: release})
}

// begin decides, as an executor takes a job, whether its step runs (run); if not, out is what
// goes in its place. A row Stop handed back while it waited (abandoned) has nothing left to do.
// A row whose step was cancelled before it began (its claim found lost by the heartbeat, its
// instance cancelled) is handed back unrun, as is a prefetched row once Stop has begun or if
// its queue or machine was paused while it waited, or its instance as a heartbeat saw (a pick
// would not have claimed it); a hand-back spends no attempt and counts no recovery.
func (e *Engine) begin(queue string, j job, prefetched bool) (out store.Outcome, run, abandoned bool) {
	e.mu.Lock()
	abandoned, stopping, paused := j.f.state == flightAbandoned, e.stopped, j.f.paused
	if !abandoned {
		j.f.started = time.Now()
	}
	e.mu.Unlock()
	c := j.row
	switch {
	case abandoned:
		return out, false, true
	case context.Cause(j.ctx) != nil, prefetched && (stopping || paused || e.paused.Load().queuePaused(queue) || e.paused.Load().machinePaused(c.Machine)):
		// Nothing ran, so nothing is charged: the claim goes back untouched if it is still this
		// client's, and the hand-back is dropped as stale if it is not (an operator cancelled the
		// instance, or a reaper released the claim the heartbeat found lost).
		return store.HandBack(store.Claim{ID: c.ID, Owner: c.Owner}, c.Slot(), 0), false, false
	}
	return out, true, false
}

// execute runs one claimed step and returns its outcome, fenced by the claim, and the Call (whose
// transaction, if the step began one, the outcome must commit in). A row of an older version of
// its machine is brought forward instead (KindUpgrade); one whose machine, version or step this
// node cannot run is handed back untouched (KindReleased) with an fsm.unknown event.
func (e *Engine) execute(ctx context.Context, db store.DB, queue string, c *store.Claimed) (store.Outcome, *Call) {
	out, blocked, ok := e.admit(c)
	if ok && c.HasMore() {
		// A large inbox or join: the pick loaded its first part, the rest is read here, off the
		// pick loop, for a row this node will run. A read that fails hands the claim back, the
		// reason in its error history (no attempt spent, a recovery counted), to be tried again
		// a few seconds later; past MaxRecoveries the instance fails.
		if err := e.store.LoadRest(ctx, db, c); err != nil {
			err = fmt.Errorf("read the rest of the inbox or children of the claimed row: %w", err)
			out = store.Recovery(c, c.Slot(), unknownDelay, errKindLoad, e.cfg.MaxRecoveries, err)
			if out.Kind == store.KindFailed {
				e.log.Error("gendurable: could not read a claimed row's inbox or children, once more than MaxRecoveries allows; the instance failed",
					"client", e.cfg.Name, "queue", queue, "id", c.ID, "error", out.Cause)
			} else {
				e.log.Warn("gendurable: could not read a claimed row's inbox or children; handed it back",
					"client", e.cfg.Name, "queue", queue, "id", c.ID, "error", err)
			}
			return out, nil
		}
		if c.CodecErr != nil { // a sealed value among the rest that this node cannot open
			out, blocked, ok = e.admit(c)
		}
	}
	if !ok {
		if blocked != nil {
			e.log.Warn("gendurable: claimed a row this node cannot run; handed it back for a node that can",
				"client", e.cfg.Name, "queue", queue, "id", c.ID, "machine", c.Machine, "step", c.Step,
				"version", c.MachineVersion, "reason", blocked)
			e.Emit(durabletype.Event{Name: durabletype.EventFSMUnknown, Queue: queue, Machine: c.Machine, Step: c.Step,
				InstanceID: c.ID, Attempt: c.Attempt, Err: blocked})
		}
		return out, nil
	}
	def := e.cfg.Machines[c.Machine]
	call := &Call{
		Ctx: ctx, Row: c, Queue: queue, MaxPayload: e.cfg.MaxPayload, MaxChildren: e.cfg.MaxChildren, Machine: e.Machine,
		client: e.cfg.Name, log: e.log, begin: beginner(db),
	}
	_, call.nested = db.(pgx.Tx)
	e.Emit(durabletype.Event{Name: durabletype.EventStepStarted, Queue: queue, Machine: c.Machine, Step: c.Step,
		InstanceID: c.ID, Attempt: c.Attempt})
	out = safeRun(def, call)
	if out.Cause != nil {
		e.Emit(durabletype.Event{Name: durabletype.EventStepError, Queue: queue, Machine: c.Machine, Step: c.Step,
			InstanceID: c.ID, Attempt: c.Attempt, Err: out.Cause, Panic: out.Panic})
	}
	out.Fence(c, e.cfg.Fair)
	return out, call
}

// Error kinds of recoveries: a claim handed back because the rest of its inbox or children could
// not be read (load), because the session of the step's transaction was lost (session), or
// because the heartbeat presumed it lost and cancelled its step (lease, the reaper's kind too).
const (
	errKindLoad    = "load"
	errKindSession = "session"
	errKindLease   = "lease"
)

// safeRun is the last safety net around a machine's Run, which recovers step panics itself: if
// Run panics anyway (a bug in a handler's encoding), the instance fails with the panic recorded
// rather than crash the worker or loop through the reaper.
func safeRun(def *MachineDef, call *Call) (out store.Outcome) {
	defer func() {
		if r := recover(); r != nil {
			call.RollbackTx()
			msg := fmt.Sprintf("panic while running the step: %v\n%s", r, debug.Stack())
			out = store.Outcome{Kind: store.KindFailed, ErrKind: "panic", ErrMsg: msg,
				Cause: fmt.Errorf("panic: %v", r), Panic: true}
		}
	}()
	return def.Run(call)
}

// commitInTx applies a step's outcome inside the transaction the step wrote through, then
// commits it: the step's writes and its progress commit together or not at all. If the claim is
// gone (stale), the transaction rolls back and the step's writes are discarded.
func (e *Engine) commitInTx(call *Call, out *store.Outcome) (applied bool, woken []store.Woken, err error) {
	tx := call.tx
	call.tx = nil
	ctx := context.WithoutCancel(call.Ctx)
	ctx, cancel := context.WithTimeout(ctx, StatementTimeout(e.cfg.Lease))
	defer cancel()
	// The batch's settings end with a transaction of the step's own, committed below; a savepoint
	// of a caller's transaction would hand them on to the rest of it.
	var db store.DB = store.EndingTx{Tx: tx}
	if call.nested {
		db = tx
	}
	ok, woken, err := e.store.ApplyOutcomes(ctx, db, []store.Outcome{*out})
	if err != nil {
		_ = tx.Rollback(ctx)
		return false, nil, err
	}
	if _, applied := ok[out.Claim]; !applied {
		_ = tx.Rollback(ctx)
		return false, nil, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return false, nil, err
	}
	if fault.Enabled {
		if err := fault.PointFor(fault.AfterStepTxCommit, out.Claim.Owner); err != nil {
			// The session "lost" with the commit's acknowledgement: the fate is unknown here.
			_ = tx.Conn().Close(ctx)
			return false, nil, err
		}
	}
	return true, woken, nil
}

// stepTxFault returns, when err says that the server ended the session of the step's transaction
// because the step held it idle past idle_in_transaction_session_timeout, the outcome the
// machine's error handling gives that (ErrTxIdleTimeout) in place of out, fenced like out. The
// session was idle in the transaction when it ended, so the commit was never sent: nothing of the
// step's committed. Any other error is not the step's: ok is false.
func (e *Engine) stepTxFault(call *Call, out *store.Outcome, err error) (alt store.Outcome, ok bool) {
	def := e.cfg.Machines[call.Row.Machine]
	if err == nil || !store.IdleInTransaction(err) || def == nil || def.Fail == nil {
		return store.Outcome{}, false
	}
	alt = def.Fail(call, fmt.Errorf("%w: the server ended the session of the step's transaction (Ctx.Tx) and rolled "+
		"back its writes; make slow calls before the step calls Ctx.Tx, or give the role a longer timeout: %w",
		durabletype.ErrTxIdleTimeout, err))
	alt.Fence(call.Row, e.cfg.Fair)
	alt.Credit = out.Credit
	return alt, true
}

// finish reports an outcome that committed, or was found stale, or failed to commit.
func (e *Engine) finish(f *flight, out *store.Outcome, applied bool, err error) {
	defer e.settle(f)
	if gl := f.lease.Swap(nil); gl != nil {
		gl.settle(f.gaveBack && applied && err == nil)
	}
	switch {
	case err != nil:
		e.log.Error("gendurable: outcome commit failed; the claim will be reclaimed when its lease expires",
			"client", e.cfg.Name, "queue", f.queue, "id", f.id, "error", err)
		e.Emit(durabletype.Event{Name: durabletype.EventCommitFailed, Queue: f.queue, Machine: f.machine, Step: f.step,
			InstanceID: f.id, Attempt: f.attempt, Count: 1, Err: err})
	case !applied:
		e.stale(f, out)
	default:
		e.Emit(durabletype.Event{Name: durabletype.EventStepFinished, Queue: f.queue, Machine: f.machine, Step: f.step,
			InstanceID: f.id, Attempt: f.attempt, Outcome: out.Kind.String(), Duration: time.Since(f.started)})
		if out.Kind == store.KindUpgrade {
			e.Emit(durabletype.Event{Name: durabletype.EventInstanceUpgraded, Queue: f.queue, Machine: f.machine,
				Step: out.Step, InstanceID: f.id, Attempt: f.attempt, Version: out.Version})
		}
		if (out.Kind == store.KindNext || out.Kind == store.KindRetry || out.Kind == store.KindReleased ||
			out.Kind == store.KindUpgrade) && out.Delay <= 0 {
			e.Wake(f.queue)
		}
		if f.keyed {
			// The execution held its key (or a slot of its gate): another row of that key may
			// run now.
			e.Wake(f.queue)
		}
		if out.Kind == store.KindSpawn {
			// The children are runnable now (those without a delay), in their own queues,
			// perhaps on other nodes; a spawn of none made the parent runnable.
			if len(out.Children) == 0 {
				e.Wake(f.queue)
			}
			var queues []string
			for i := range out.Children {
				ch := &out.Children[i]
				if ch.ScheduledAt == nil && ch.Delay == 0 && !slices.Contains(queues, ch.Queue) {
					queues = append(queues, ch.Queue)
				}
			}
			e.Poke(queues...)
		}
		e.awaits.push(f.id)
	}
}

// wakeAll pokes the queues of the instances an outcome batch woke (parents whose join the last
// child completed), on every node.
func (e *Engine) wakeAll(woken []store.Woken) {
	var queues []string
	for _, w := range woken {
		if !slices.Contains(queues, w.Queue) {
			queues = append(queues, w.Queue)
		}
	}
	e.Poke(queues...)
}

func (e *Engine) stale(f *flight, out *store.Outcome) {
	e.log.Warn("gendurable: dropped a stale outcome: the claim was lost (its lease expired and the row was reclaimed, or the instance was cancelled)",
		"client", e.cfg.Name, "queue", f.queue, "id", f.id, "machine", f.machine, "step", f.step, "outcome", out.Kind.String())
	e.Emit(durabletype.Event{Name: durabletype.EventOutcomeStale, Queue: f.queue, Machine: f.machine, Step: f.step,
		InstanceID: f.id, Attempt: f.attempt, Outcome: out.Kind.String()})
}

// dropAbandoned drops the outcome of a step that outlived the drain deadline: its claim was
// already handed back, so the outcome is stale by construction.
func (e *Engine) dropAbandoned(f *flight, out *store.Outcome) {
	e.log.Info("gendurable: dropped the outcome of a step cancelled at shutdown; its claim was already handed back",
		"client", e.cfg.Name, "queue", f.queue, "id", f.id, "machine", f.machine, "step", f.step, "outcome", out.Kind.String())
	e.Emit(durabletype.Event{Name: durabletype.EventOutcomeStale, Queue: f.queue, Machine: f.machine, Step: f.step,
		InstanceID: f.id, Attempt: f.attempt, Outcome: out.Kind.String()})
	f.cancel(nil)
}
