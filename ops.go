package gendurable

import (
	"context"
	"fmt"

	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Cancel makes a live instance terminal with status cancelled, wherever it is: a runnable or
// parked instance never runs again; a running step has its context cancelled (at once on this
// client, with cause ErrCancelled; on another node when its next heartbeat finds the claim gone)
// and its late outcome is dropped. Its gate slot and inbox are released, and a parent waiting on
// it settles as for any finished child. Its own children run on. reason is recorded in its error
// history. A finished instance: ErrWrongStatus; no instance: ErrNotFound.
func (c *Client) Cancel(ctx context.Context, id int64, reason string) error {
	if reason == "" {
		reason = "cancelled"
	}
	var res store.Cancelled
	err := c.inOwnTx(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = c.store.Cancel(ctx, tx, id, reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("gendurable: cancel %d: %w", id, err)
	}
	c.eng.Cancelled(id, res)
	return nil
}

// RetryOpts configures Retry.
type RetryOpts struct {
	// Step is the step to run; default the step the instance stopped at.
	Step string
}

// Retry makes a failed or cancelled instance runnable again, at the step it stopped at or at
// opts.Step, with fresh attempts; its state and error history stay. A child whose parent is still
// live cannot be retried (its parent has already counted it as finished): retry the parent's
// step instead. A live instance, a parent whose children are still live (its join would read
// them unfinished), or one whose correlation key a live instance of its machine has taken since
// it finished: ErrWrongStatus; no instance: ErrNotFound; a step the registered
// machine lacks: ErrUnknownStep.
func (c *Client) Retry(ctx context.Context, id int64, opts *RetryOpts) error {
	step := ""
	if opts != nil {
		step = opts.Step
	}
	if step != "" {
		if err := checkName("step name", step); err != nil {
			return &InputError{Index: -1, Field: "Step", Reason: err.Error()}
		}
	}
	var row store.OpRow
	err := c.inOwnTx(ctx, func(tx pgx.Tx) error {
		var err error
		row, err = c.store.Retry(ctx, tx, id, step, c.retryCheck(id, step))
		return err
	})
	if err != nil {
		return fmt.Errorf("gendurable: retry %d: %w", id, err)
	}
	c.eng.Retried(id, row.Queue, row.Machine, row.Step)
	c.eng.Poke(row.Queue)
	return nil
}

// inOwnTx runs fn in a transaction of the library's own: one that runs no caller's code, whose
// session the server ends if this process stops for longer than the store's idle bound between two
// of its statements (store.BeginOwn). A client stopped in the middle of one (a CLI suspended in its
// terminal, a paused VM) must not keep the rows it locked from every worker's outcome commits.
func (c *Client) inOwnTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, store.OwnTxs{Store: c.store, DB: c.pool}, fn)
}

// retryCheck is what Retry checks of the locked row of instance id before retrying it at step
// ("": the step it stopped at): not a child a live parent's join has counted, and a step the
// registered machine has.
func (c *Client) retryCheck(id int64, step string) func(store.OpRow) error {
	return func(r store.OpRow) error {
		if r.Parent != nil && r.ParentStatus != "" && !r.ParentStatus.Terminal() {
			return fmt.Errorf("%w: instance %d is a child of the live instance %d, whose join has already counted it; retry the parent's step instead",
				ErrWrongStatus, id, *r.Parent)
		}
		s := step
		if s == "" {
			s = r.Step
		}
		if def := c.eng.Machine(r.Machine); def != nil && !def.Steps[s] {
			return &InputError{Index: -1, Field: "Step", Err: ErrUnknownStep,
				Reason: fmt.Sprintf("the registered machine %q has no step %q", r.Machine, s)}
		}
		return nil
	}
}
