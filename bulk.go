package gendurable

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// BulkAction is what Client.Bulk does to each instance its filter matches.
type BulkAction string

// The bulk actions.
const (
	// BulkRetry retries failed and cancelled instances (as Client.Retry).
	BulkRetry BulkAction = "retry"
	// BulkCancel cancels live instances (as Client.Cancel).
	BulkCancel BulkAction = "cancel"
	// BulkDelete deletes finished instances (done, failed, cancelled), with their inboxes; a
	// child whose parent is still live is kept (its parent's join may read it).
	BulkDelete BulkAction = "delete"
)

// statuses are the statuses an action applies to.
func (a BulkAction) statuses() []Status {
	switch a {
	case BulkRetry:
		return []Status{StatusFailed, StatusCancelled}
	case BulkCancel:
		return []Status{StatusAvailable, StatusExecuting, StatusAwaiting, StatusJoining}
	case BulkDelete:
		return []Status{StatusDone, StatusFailed, StatusCancelled}
	}
	return nil
}

// BulkFilter selects the instances of a bulk action. Every field set must match; one that
// matches everything (no field set) must say so with All.
type BulkFilter struct {
	Queue   string
	Machine string
	// Step is the step the instance is at (or stopped at).
	Step string
	// Statuses narrow the action's own statuses (BulkRetry: failed, cancelled; BulkCancel:
	// available, executing, awaiting, joining; BulkDelete: done, failed, cancelled).
	Statuses []Status
	// ErrorContains matches the last error's text, case-insensitively.
	ErrorContains string
	// Since and Until bound the insertion time: Since <= inserted_at < Until.
	Since, Until time.Time
	// KeyPrefix matches correlation keys that begin with it.
	KeyPrefix string
	// All confirms a filter with no other field set: the action applies to every instance.
	All bool
}

// MatchesEverything reports whether f sets no field but All: it matches every instance.
func (f *BulkFilter) MatchesEverything() bool {
	return f.Queue == "" && f.Machine == "" && f.Step == "" && len(f.Statuses) == 0 && f.ErrorContains == "" &&
		f.Since.IsZero() && f.Until.IsZero() && f.KeyPrefix == ""
}

// BulkOpts configures Client.Bulk.
type BulkOpts struct {
	// DryRun counts the instances the action would apply to and changes nothing.
	DryRun bool
	// Reason goes into each cancelled instance's error history (BulkCancel).
	Reason string
	// Step is the step retried instances resume at (BulkRetry; default the one each stopped at).
	Step string
	// BatchSize is how many instances each transaction changes (default 100, at most 1,000).
	BatchSize int
	// Progress, if set, is called after each batch with the counts so far.
	Progress func(BulkResult)
}

// BulkResult is what Client.Bulk did.
type BulkResult struct {
	// Matched counts the instances the filter matched (DryRun: all of them; otherwise the ones
	// the batches found).
	Matched int64 `json:"matched"`
	// Changed counts the instances retried, cancelled or deleted; Skipped those that matched but
	// could not be (their status changed meanwhile, a retry's correlation key is taken, a child's
	// parent is live), each left untouched.
	Changed int64 `json:"changed"`
	Skipped int64 `json:"skipped"`
	// Batches counts the transactions.
	Batches int `json:"batches"`
}

// DefaultBulkBatch and MaxBulkBatch bound BulkOpts.BatchSize.
const (
	DefaultBulkBatch = 100
	MaxBulkBatch     = 1000
)

// Bulk retries, cancels or deletes every instance f matches, in batches: each batch is one
// short transaction over at most BatchSize rows, each instance in it changed as the single-instance
// call would (a savepoint each, so one that cannot be changed is skipped and the rest of its
// batch commits). A run stopped halfway (ctx cancelled, a lost connection) leaves every instance
// changed or untouched, never half-changed; running it again finishes the work. DryRun only
// counts. The filter is read afresh by each batch, walking ids upward: an instance inserted
// during the run may be included. An unknown action, or a filter that matches everything without
// All, is an *InputError.
func (c *Client) Bulk(ctx context.Context, action BulkAction, f BulkFilter, opts *BulkOpts) (*BulkResult, error) {
	if opts == nil {
		opts = &BulkOpts{}
	}
	bad := func(field, format string, args ...any) error {
		return &InputError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	statuses := action.statuses()
	if statuses == nil {
		return nil, bad("action", "%q is not a bulk action (retry, cancel or delete)", action)
	}
	if f.MatchesEverything() && !f.All {
		return nil, bad("BulkFilter", "it matches every instance: set All to %s them all", action)
	}
	if len(f.Statuses) > 0 {
		var narrowed []Status
		for _, s := range f.Statuses {
			if !s.Valid() {
				return nil, bad("Statuses", "%q is not a status", s)
			}
			if slices.Contains(statuses, s) && !slices.Contains(narrowed, s) {
				narrowed = append(narrowed, s)
			}
		}
		if len(narrowed) == 0 {
			return nil, bad("Statuses", "%s applies to %v instances only", action, statuses)
		}
		statuses = narrowed
	}
	for _, t := range []struct {
		field string
		at    time.Time
	}{{"Since", f.Since}, {"Until", f.Until}} {
		if err := checkTimestamp(t.at); err != nil {
			return nil, bad(t.field, "%v", err)
		}
	}
	batch := opts.BatchSize
	if batch == 0 {
		batch = DefaultBulkBatch
	}
	if batch < 0 || batch > MaxBulkBatch {
		return nil, bad("BatchSize", "%d: must be 1 to %d, or 0 for %d", batch, MaxBulkBatch, DefaultBulkBatch)
	}
	if opts.Step != "" {
		if action != BulkRetry {
			return nil, bad("Step", "only a retry resumes at a step")
		}
		if err := checkName("step name", opts.Step); err != nil {
			return nil, bad("Step", "%v", err)
		}
	}
	if len(opts.Reason) > 1024 {
		return nil, bad("Reason", "%d bytes long; the limit is 1024", len(opts.Reason))
	}
	sf := &store.BulkFilter{Statuses: statuses, Queue: f.Queue, Machine: f.Machine, Step: f.Step, Error: f.ErrorContains,
		Since: f.Since, Until: f.Until, KeyPrefix: f.KeyPrefix}
	res := &BulkResult{}
	if opts.DryRun {
		n, err := c.store.BulkCount(ctx, c.pool, sf, math.MaxInt32)
		if err != nil {
			return nil, fmt.Errorf("gendurable: bulk %s (dry run): %w", action, err)
		}
		res.Matched = n
		return res, nil
	}
	var after int64
	for {
		ids, err := c.store.BulkBatch(ctx, c.pool, sf, after, batch)
		if err != nil {
			return res, fmt.Errorf("gendurable: bulk %s: read batch %d: %w", action, res.Batches+1, err)
		}
		if len(ids) == 0 {
			return res, nil
		}
		after = ids[len(ids)-1]
		changed, err := c.bulkBatch(ctx, action, ids, opts)
		if err != nil {
			return res, fmt.Errorf("gendurable: bulk %s: batch %d (ids %d to %d, untouched): %w", action, res.Batches+1, ids[0], after, err)
		}
		res.Batches++
		res.Matched += int64(len(ids))
		res.Changed += int64(changed)
		res.Skipped += int64(len(ids) - changed)
		if opts.Progress != nil {
			opts.Progress(*res)
		}
		if len(ids) < batch {
			return res, nil
		}
	}
}

// bulkBatch applies the action to ids in one transaction and returns how many it changed; the
// engine's follow-ups (events, pokes, cancelling local steps) run after the commit.
func (c *Client) bulkBatch(ctx context.Context, action BulkAction, ids []int64, opts *BulkOpts) (int, error) {
	if action == BulkDelete {
		deleted, err := c.store.BulkDelete(ctx, c.pool, ids)
		return len(deleted), err
	}
	reason := opts.Reason
	if reason == "" {
		reason = "cancelled in bulk"
	}
	var after []func()
	err := c.inOwnTx(ctx, func(tx pgx.Tx) error {
		after = after[:0]
		for _, id := range ids {
			sp, err := tx.Begin(ctx) // a savepoint: a refused instance rolls back alone
			if err != nil {
				return err
			}
			var follow func()
			switch action {
			case BulkCancel:
				var res store.Cancelled
				if res, err = c.store.Cancel(ctx, sp, id, reason); err == nil {
					follow = func() { c.eng.Cancelled(id, res) }
				}
			case BulkRetry:
				var row store.OpRow
				if row, err = c.store.Retry(ctx, sp, id, opts.Step, c.retryCheck(id, opts.Step)); err == nil {
					follow = func() { c.eng.Retried(id, row.Queue, row.Machine, row.Step); c.eng.Poke(row.Queue) }
				}
			}
			if err != nil {
				if rbErr := sp.Rollback(ctx); rbErr != nil {
					return rbErr
				}
				if refused(err) {
					continue
				}
				return err
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			after = append(after, follow)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, f := range after {
		f()
	}
	return len(after), nil
}

// refused reports whether err is an instance's own refusal of a bulk action (it is skipped),
// not a failure of the batch.
func refused(err error) bool {
	var in *InputError
	return errors.Is(err, ErrWrongStatus) || errors.Is(err, ErrNotFound) || errors.As(err, &in)
}
