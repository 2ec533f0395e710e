// Package durabletest runs gendurable machines inline in tests: Drain runs everything runnable in
// the test's goroutine through the production pick, executor and outcome statements (inside the
// test's own transaction when given one), collapses scheduled and backoff delays, and fails fast
// on a machine that never settles. The Require helpers assert on the rows.
//
//	kit := durabletest.New(t, client, nil)
//	res, _ := client.Insert(ctx, checkout.With(Order{ID: 7}), nil)
//	kit.Drain(ctx)
//	kit.RequireDone(ctx, res.ID, &receipt)
package durabletest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/bridge"
	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Opts configures a Kit.
type Opts struct {
	// Tx makes the kit drain and read inside this transaction (insert with the client's
	// InsertTx on the same transaction). Steps that call Ctx.Tx get a savepoint of it.
	Tx pgx.Tx
	// MaxSteps fails a drain past this many steps. Default 10,000.
	MaxSteps int
}

// Kit drains and inspects one client's instances in a test.
type Kit struct {
	t        testing.TB
	eng      *engine.Engine
	db       store.DB
	maxSteps int
}

// New returns a kit for client. The client need not be started (and usually is not).
func New(t testing.TB, client *gendurable.Client, opts *Opts) *Kit {
	t.Helper()
	if opts == nil {
		opts = &Opts{}
	}
	eng, pool := bridge.Engine(client)
	k := &Kit{t: t, eng: eng, db: pool, maxSteps: opts.MaxSteps}
	if opts.Tx != nil {
		k.db = opts.Tx
	}
	if k.maxSteps == 0 {
		k.maxSteps = 10000
	}
	return k
}

// DrainOpts narrows a drain.
type DrainOpts struct {
	// Queues limits the drain to these queues; empty means all.
	Queues []string
	// KeepDelays runs only rows already due instead of collapsing delays.
	KeepDelays bool
	// MaxSteps overrides the kit's MaxSteps for this drain.
	MaxSteps int
}

// DrainResult says what a drain did.
type DrainResult struct {
	// Steps is how many steps ran.
	Steps int
	// Outcomes counts committed outcomes by kind: "next", "retry", "done", "failed", "await",
	// "spawn", and "upgrade" (an instance of an older machine version brought forward; not a
	// step).
	Outcomes map[string]int
}

// ErrMaxSteps is what a drain past MaxSteps fails with.
var ErrMaxSteps = engine.ErrMaxSteps

// Drain runs everything runnable until nothing is, and fails the test on an error (a runaway
// machine, a row of an unregistered machine, a database error).
func (k *Kit) Drain(ctx context.Context) DrainResult {
	k.t.Helper()
	res, err := k.TryDrain(ctx, nil)
	if err != nil {
		k.t.Fatalf("durabletest: drain: %v", err)
	}
	return res
}

// TryDrain is Drain returning its error instead of failing the test.
func (k *Kit) TryDrain(ctx context.Context, opts *DrainOpts) (DrainResult, error) {
	if opts == nil {
		opts = &DrainOpts{}
	}
	max := opts.MaxSteps
	if max == 0 {
		max = k.maxSteps
	}
	r, err := k.eng.Drain(ctx, k.db, engine.DrainOpts{Queues: opts.Queues, MaxSteps: max, KeepDelays: opts.KeepDelays})
	return DrainResult{Steps: r.Steps, Outcomes: r.Outcomes}, err
}

// Get reads an instance (nil if there is none).
func (k *Kit) Get(ctx context.Context, id int64) *gendurable.Instance {
	k.t.Helper()
	in, err := k.eng.Store().GetInstance(ctx, k.db, id)
	if errors.Is(err, gendurable.ErrNotFound) {
		return nil
	}
	if err != nil {
		k.t.Fatalf("durabletest: get %d: %v", id, err)
	}
	return in
}

// RequireStatus fails the test unless instance id has the status; it returns the instance.
func (k *Kit) RequireStatus(ctx context.Context, id int64, status gendurable.Status) *gendurable.Instance {
	k.t.Helper()
	in := k.Get(ctx, id)
	if in == nil {
		k.t.Fatalf("durabletest: instance %d does not exist (want %s)", id, status)
		return nil
	}
	if in.Status != status {
		k.t.Fatalf("durabletest: instance %d (%s) is %s at step %q, want %s; errors: %s",
			id, in.Machine, in.Status, in.Step, status, errorsText(in))
	}
	return in
}

// RequireDone fails the test unless instance id is done; if result is not nil, the instance's
// result is decoded into it.
func (k *Kit) RequireDone(ctx context.Context, id int64, result any) *gendurable.Instance {
	k.t.Helper()
	in := k.RequireStatus(ctx, id, gendurable.StatusDone)
	if result != nil {
		if in.Result == nil {
			k.t.Fatalf("durabletest: instance %d is done without a result", id)
		}
		if err := json.Unmarshal(in.Result, result); err != nil {
			k.t.Fatalf("durabletest: decode result of %d: %v", id, err)
		}
	}
	return in
}

// RequireFailed fails the test unless instance id failed; it returns the instance, whose Errors
// hold the history.
func (k *Kit) RequireFailed(ctx context.Context, id int64) *gendurable.Instance {
	k.t.Helper()
	return k.RequireStatus(ctx, id, gendurable.StatusFailed)
}

// RequireAwaiting fails the test unless instance id is parked awaiting signals, on exactly the
// given names when any are given.
func (k *Kit) RequireAwaiting(ctx context.Context, id int64, names ...string) *gendurable.Instance {
	k.t.Helper()
	in := k.RequireStatus(ctx, id, gendurable.StatusAwaiting)
	if len(names) > 0 && !sameSet(in.AwaitNames, names) {
		k.t.Fatalf("durabletest: instance %d awaits %q, want %q", id, in.AwaitNames, names)
	}
	return in
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, s := range a {
		m[s] = true
	}
	for _, s := range b {
		if !m[s] {
			return false
		}
	}
	return true
}

// RequireState decodes instance id's committed state into state.
func (k *Kit) RequireState(ctx context.Context, id int64, state any) *gendurable.Instance {
	k.t.Helper()
	in := k.Get(ctx, id)
	if in == nil {
		k.t.Fatalf("durabletest: instance %d does not exist", id)
		return nil
	}
	if err := json.Unmarshal(in.State, state); err != nil {
		k.t.Fatalf("durabletest: decode state of %d: %v", id, err)
	}
	return in
}

func errorsText(in *gendurable.Instance) string {
	if len(in.Errors) == 0 {
		return "none"
	}
	b, _ := json.Marshal(in.Errors)
	return string(b)
}

// FireTimeouts wakes every awaiting instance that has an await deadline, however far off, as
// the reaper would once it passed; it returns how many it woke. Drain them afterwards.
func (k *Kit) FireTimeouts(ctx context.Context) int {
	k.t.Helper()
	n, err := k.eng.FireAwaitDeadlines(ctx, k.db, 100*365*24*time.Hour)
	if err != nil {
		k.t.Fatalf("durabletest: fire timeouts: %v", err)
	}
	return n
}
