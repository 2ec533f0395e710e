package engine

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// execute runs one claimed step and returns its encoded outcome and the Call (whose transaction,
// if the step began one, the outcome must commit in). A row whose machine or step this node does
// not know is handed back untouched (KindReleased) with an fsm.unknown event.
func (e *Engine) execute(ctx context.Context, db store.DB, queue string, c *store.Claimed) (Outcome, *Call) {
	def := e.cfg.Machines[c.Machine]
	if def == nil || !def.Steps[c.Step] {
		reason := fmt.Sprintf("machine %q is not registered on this client", c.Machine)
		if def != nil {
			reason = fmt.Sprintf("machine %q has no step %q on this client", c.Machine, c.Step)
		}
		e.log.Warn("gendurable: claimed a row this node cannot run; handed it back for a node that can",
			"client", e.cfg.Name, "queue", queue, "id", c.ID, "machine", c.Machine, "step", c.Step, "reason", reason)
		e.Emit(durabletype.Event{Name: durabletype.EventFSMUnknown, Queue: queue, Machine: c.Machine, Step: c.Step,
			InstanceID: c.ID, Attempt: c.Attempt, Err: fmt.Errorf("%s", reason)})
		return Outcome{Kind: store.KindReleased, Delay: unknownDelay}, nil
	}
	call := &Call{
		Ctx: ctx, Row: c, Queue: queue, MaxPayload: e.cfg.MaxPayload, MaxChildren: e.cfg.MaxChildren, Machine: e.Machine,
		client: e.cfg.Name, log: e.log, begin: beginner(db),
	}
	e.Emit(durabletype.Event{Name: durabletype.EventStepStarted, Queue: queue, Machine: c.Machine, Step: c.Step,
		InstanceID: c.ID, Attempt: c.Attempt})
	out := safeRun(def, call)
	if out.Routed != nil {
		e.Emit(durabletype.Event{Name: durabletype.EventStepError, Queue: queue, Machine: c.Machine, Step: c.Step,
			InstanceID: c.ID, Attempt: c.Attempt, Err: out.Routed, Panic: out.Panic})
	}
	return out, call
}

// safeRun is the last safety net around a machine's Run, which recovers step panics itself: if
// Run panics anyway (a bug in a handler's encoding), the instance fails with the panic recorded
// rather than crash the worker or loop through the reaper.
func safeRun(def *MachineDef, call *Call) (out Outcome) {
	defer func() {
		if r := recover(); r != nil {
			call.RollbackTx()
			msg := fmt.Sprintf("panic while running the step: %v\n%s", r, debug.Stack())
			out = Outcome{Kind: store.KindFailed, ErrKind: "panic", ErrMsg: msg,
				Routed: fmt.Errorf("panic: %v", r), Panic: true}
		}
	}()
	return def.Run(call)
}

// outcomeRow turns an outcome into its statement row.
func outcomeRow(c *store.Claimed, o *Outcome) store.OutcomeRow {
	r := store.OutcomeRow{ID: c.ID, Owner: c.Owner, Kind: o.Kind, Delay: o.Delay, Signalled: c.Signalled, Child: c.Child,
		KeyMode: o.KeyMode, CreditKey: c.ConcurrencyKey, CreditShard: c.ConcurrencyShard}
	if o.KeyMode == 1 {
		k := o.Key
		r.Key = &k
	}
	if o.RateLimit != "" {
		rl := o.RateLimit
		r.RateLimit, r.Weight = &rl, o.Weight
	}
	if o.Kind == store.KindNext || o.Kind == store.KindAwait || o.Kind == store.KindSpawn {
		step := o.Step
		r.Step = &step
		// Progress consumes exactly the awaited signals the step saw (Ctx.Awaited).
		for _, s := range c.Inbox {
			if slices.Contains(c.AwaitNames, s.Name) {
				r.Seen = append(r.Seen, s.ID)
			}
		}
	}
	if o.Kind == store.KindAwait {
		r.AwaitNames, r.AwaitTimeout = o.AwaitNames, o.AwaitTimeout
	}
	if o.Kind == store.KindSpawn {
		r.Children = o.Children
	}
	if o.State != nil {
		s := string(o.State)
		r.State = &s
	}
	if o.Kind == store.KindDone && o.Result != nil {
		s := string(o.Result)
		r.Result = &s
	}
	if o.ErrKind != "" {
		k, m := o.ErrKind, o.ErrMsg
		r.ErrKind, r.ErrMsg = &k, &m
	}
	return r
}

// commitInTx applies a step's outcome inside the transaction the step wrote through, then
// commits it: the step's writes and its progress commit together or not at all. If the claim is
// gone (stale), the transaction rolls back and the step's writes are discarded.
func (e *Engine) commitInTx(call *Call, row store.OutcomeRow) (applied bool, woken []store.Woken, err error) {
	tx := call.tx
	call.tx = nil
	ctx := context.WithoutCancel(call.Ctx)
	ctx, cancel := context.WithTimeout(ctx, StatementTimeout(e.cfg.Lease))
	defer cancel()
	ok, woken, err := e.store.ApplyOutcomes(ctx, tx, []store.OutcomeRow{row})
	if err != nil {
		_ = tx.Rollback(ctx)
		return false, nil, err
	}
	if _, applied := ok[store.Claim{ID: row.ID, Owner: row.Owner}]; !applied {
		_ = tx.Rollback(ctx)
		return false, nil, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return false, nil, err
	}
	return true, woken, nil
}
