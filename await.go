package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/store"
)

// AwaitStatus is the kind of answer Await gives.
type AwaitStatus string

// Await's answers.
const (
	// AwaitDone: the instance finished; Result holds its result.
	AwaitDone AwaitStatus = "done"
	// AwaitFailed: the instance failed; Err returns its last error.
	AwaitFailed AwaitStatus = "failed"
	// AwaitCancelled: an operator cancelled the instance.
	AwaitCancelled AwaitStatus = "cancelled"
	// AwaitAwaiting: the instance is parked waiting for a signal (unless UntilTerminal).
	AwaitAwaiting AwaitStatus = "awaiting"
	// AwaitBusy: the timeout passed first. The work goes on; call Await again with the id to
	// keep waiting.
	AwaitBusy AwaitStatus = "busy"
	// AwaitNotFound: there is no instance with that id.
	AwaitNotFound AwaitStatus = "not_found"
)

// AwaitOpts configures Await.
type AwaitOpts struct {
	// UntilTerminal waits through parks: an instance awaiting a signal is not an answer, only
	// done, failed and cancelled are (or busy at the timeout).
	UntilTerminal bool
}

// AwaitResult is Await's answer, read from the instance's row.
type AwaitResult struct {
	Status AwaitStatus
	// Instance is the row as it was read when the answer was decided; nil for AwaitNotFound.
	Instance *Instance
}

// Decode unmarshals the result of a done instance into v.
func (r *AwaitResult) Decode(v any) error {
	if r.Status != AwaitDone || r.Instance == nil {
		return fmt.Errorf("gendurable: await answered %s, not done: there is no result to decode", r.Status)
	}
	if r.Instance.Result == nil {
		return json.Unmarshal([]byte("null"), v)
	}
	return json.Unmarshal(r.Instance.Result, v)
}

// Err returns, for a failed or cancelled instance, an *InstanceError with its last recorded
// error; nil for the other answers.
func (r *AwaitResult) Err() error {
	if r.Instance == nil || (r.Status != AwaitFailed && r.Status != AwaitCancelled) {
		return nil
	}
	e := &InstanceError{ID: r.Instance.ID, Status: r.Instance.Status}
	if n := len(r.Instance.Errors); n > 0 {
		last := r.Instance.Errors[n-1]
		e.Last = &last
	}
	return e
}

// InstanceError is the error of an instance that failed or was cancelled.
type InstanceError struct {
	ID     int64
	Status Status
	// Last is the last error in the instance's history (nil if none was recorded).
	Last *ErrorEntry
}

func (e *InstanceError) Error() string {
	if e.Last == nil {
		return fmt.Sprintf("gendurable: instance %d %s", e.ID, e.Status)
	}
	return fmt.Sprintf("gendurable: instance %d %s at step %q (attempt %d): %s", e.ID, e.Status, e.Last.Step,
		e.Last.Attempt, e.Last.Error)
}

// Await holds the caller until instance id settles, or timeout passes, and answers from its row:
// done (with its result), failed, cancelled, awaiting (parked on a signal; see UntilTerminal),
// busy (the timeout passed first: the work goes on, and calling Await again with the id is the
// whole retry protocol), or not found. An error means no answer: timeout not positive, ctx
// ended, or the database could not be read. Await returns within timeout + AwaitTick, however
// slow the database: at the timeout, one last read of the row decides between busy and a
// settle that just happened; if that read cannot finish within AwaitTick, the answer is busy with
// the row as last read, or, if the row could never be read, an error (errors.Is
// context.DeadlineExceeded).
//
// On a started client an outcome this client commits is pushed to its waiters at once, and
// outcomes committed on other nodes are seen within AwaitTick: one statement per tick reads the
// settled rows of every waiter on the client, and none runs while nobody waits. On a client
// that is not started (an inserting web node that never calls Start), Await reads the row once
// per AwaitTick itself.
func (c *Client) Await(ctx context.Context, id int64, timeout time.Duration, opts *AwaitOpts) (*AwaitResult, error) {
	if timeout <= 0 {
		return nil, &InputError{Index: -1, Field: "timeout", Reason: fmt.Sprintf("%v: must be positive", timeout)}
	}
	if id <= 0 {
		return nil, &InputError{Index: -1, Field: "id", Reason: fmt.Sprintf("%d is not a valid instance id", id)}
	}
	parked := opts == nil || !opts.UntilTerminal
	p, err := c.eng.Await(ctx, c.pool, id, parked, time.Now().Add(timeout))
	if errors.Is(err, engine.ErrAwaitNoAnswer) {
		return nil, fmt.Errorf("gendurable: await %d: the timeout passed and the instance could not be read within AwaitTick (%v) after it: %w",
			id, c.eng.Config().AwaitTick, err)
	}
	if err != nil {
		return nil, fmt.Errorf("gendurable: await %d: %w", id, err)
	}
	return answer(p, parked), nil
}

// answer classifies a row.
func answer(p store.Probe, parked bool) *AwaitResult {
	if p.Missing {
		return &AwaitResult{Status: AwaitNotFound}
	}
	r := &AwaitResult{Status: AwaitBusy, Instance: p.Instance}
	switch s := p.Instance.Status; {
	case s == StatusDone:
		r.Status = AwaitDone
	case s == StatusFailed:
		r.Status = AwaitFailed
	case s == StatusCancelled:
		r.Status = AwaitCancelled
	case s == StatusAwaiting && parked:
		r.Status = AwaitAwaiting
	}
	return r
}
