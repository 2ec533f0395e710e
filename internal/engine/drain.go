package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/store"
)

// DrainOpts configures an inline drain.
type DrainOpts struct {
	// Queues limits the drain to these queues; empty means every queue with runnable rows.
	Queues []string
	// MaxSteps fails the drain once it has run this many steps (a runaway machine).
	MaxSteps int
	// KeepDelays runs only rows already due; by default scheduled and backoff delays collapse.
	KeepDelays bool
}

// DrainResult says what a drain did.
type DrainResult struct {
	// Steps is how many steps ran.
	Steps int
	// Outcomes counts the committed outcomes by kind ("next", "done", …).
	Outcomes map[string]int
}

// ErrMaxSteps is returned by a drain that ran more than its MaxSteps.
var ErrMaxSteps = errors.New("gendurable: drain ran more than MaxSteps steps (a machine that never settles?)")

// horizon is how far ahead a collapsing drain looks: far enough to cover any delay.
const horizon = 100 * 365 * 24 * time.Hour

// Drain runs every runnable row in the caller's goroutine through the production pick, executor
// and outcome statements, on db (the client's pool, or a caller's transaction), until nothing is
// runnable. Steps that begin a transaction get a savepoint of db when db is a transaction.
func (e *Engine) Drain(ctx context.Context, db store.DB, opts DrainOpts) (DrainResult, error) {
	res := DrainResult{Outcomes: map[string]int{}}
	h := horizon
	if opts.KeepDelays {
		h = 0
	}
	owner := e.cfg.Name + ":drain@" + e.host + "-" + e.uniq
	seq := 0
	for {
		queues := opts.Queues
		if len(queues) == 0 {
			var err error
			if queues, err = e.store.RunnableQueues(ctx, db, h); err != nil {
				return res, fmt.Errorf("gendurable: drain: list queues: %w", err)
			}
		}
		progressed := false
		for _, q := range queues {
			seq++
			token := owner + "#" + strconv.Itoa(seq)
			rows, err := e.pickOnce(ctx, db, q, 1, token, h, store.Hint{}, store.Lane{})
			if err != nil {
				return res, fmt.Errorf("gendurable: drain: pick %q: %w", q, err)
			}
			for i := range rows {
				if opts.MaxSteps > 0 && res.Steps >= opts.MaxSteps {
					_ = e.handBack(ctx, db, &rows[i])
					return res, fmt.Errorf("%w (MaxSteps %d; last: instance %d, machine %q, step %q)",
						ErrMaxSteps, opts.MaxSteps, rows[i].ID, rows[i].Machine, rows[i].Step)
				}
				if err := e.drainOne(ctx, db, q, &rows[i], &res); err != nil {
					return res, err
				}
				progressed = true
			}
		}
		if !progressed {
			return res, nil
		}
	}
}

func (e *Engine) drainOne(ctx context.Context, db store.DB, queue string, c *store.Claimed, res *DrainResult) error {
	if out, blocked, ok := e.admit(c); !ok {
		if blocked != nil {
			_ = e.handBack(ctx, db, c)
			return fmt.Errorf("gendurable: drain: instance %d: %w", c.ID, blocked)
		}
		// The row brought forward to this client's version of its machine: not a step.
		applied, _, err := e.store.ApplyOutcomes(ctx, db, []store.Outcome{out})
		if err != nil {
			return fmt.Errorf("gendurable: drain: upgrade instance %d: %w", c.ID, err)
		}
		if _, ok := applied[out.Claim]; ok {
			res.Outcomes[out.Kind.String()]++
			e.Emit(durabletype.Event{Name: durabletype.EventInstanceUpgraded, Queue: queue, Machine: c.Machine,
				Step: out.Step, InstanceID: c.ID, Attempt: c.Attempt, Version: out.Version})
		}
		return nil
	}
	res.Steps++
	started := time.Now()
	out, call := e.execute(ctx, db, queue, c)
	var applied bool
	inTx := call != nil && call.tx != nil
	if inTx {
		ok, _, err := e.commitInTx(call, &out)
		if alt, fault := e.stepTxFault(call, &out, err); fault {
			// The step's own failure (see runStep): its outcome is applied like any other.
			e.Emit(durabletype.Event{Name: durabletype.EventStepError, Queue: queue, Machine: c.Machine, Step: c.Step,
				InstanceID: c.ID, Attempt: c.Attempt, Err: alt.Cause})
			out, inTx = alt, false
		} else if err != nil {
			return fmt.Errorf("gendurable: drain: commit instance %d: %w", c.ID, err)
		}
		applied = ok
	}
	if !inTx {
		ok, _, err := e.store.ApplyOutcomes(ctx, db, []store.Outcome{out})
		if err = e.committed(err); err != nil {
			return fmt.Errorf("gendurable: drain: commit instance %d: %w", c.ID, err)
		}
		_, applied = ok[out.Claim]
	}
	f := &flight{id: c.ID, owner: c.Owner, queue: queue, machine: c.Machine, step: c.Step, attempt: c.Attempt, started: started}
	if !applied {
		e.stale(f, &out)
		return nil
	}
	res.Outcomes[out.Kind.String()]++
	e.Emit(durabletype.Event{Name: durabletype.EventStepFinished, Queue: queue, Machine: c.Machine, Step: c.Step,
		InstanceID: c.ID, Attempt: c.Attempt, Outcome: out.Kind.String(), Duration: time.Since(started)})
	return nil
}

// handBack hands a claim this client will not run back untouched, attempt restored. The drain
// ignores its error (it is failing anyway, and a claim left behind runs out with its lease).
func (e *Engine) handBack(ctx context.Context, db store.DB, c *store.Claimed) error {
	_, _, err := e.store.ApplyOutcomes(ctx, db, []store.Outcome{store.HandBack(store.Claim{ID: c.ID, Owner: c.Owner}, c.Slot(), 0)})
	return err
}
