package gendurable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"runtime/debug"
	"slices"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/jsonx"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Defaults for machines.
const (
	// DefaultQueue is the queue of a machine that names none.
	DefaultQueue = "default"
	// DefaultMaxAttempts is how many times a step is tried when the machine sets no MaxAttempts.
	DefaultMaxAttempts = 20
)

// Machine is a machine that can be registered in Config.Machines and inserted: an FSM[S] or a
// Job[A].
type Machine interface {
	def() (*engine.MachineDef, error)
}

// StepFunc is one step of an FSM: it gets the committed state and returns what happens next.
// Returning an error (or panicking) routes the error to the machine's Handle.
type StepFunc[S any] func(ctx *Ctx, state S) (Outcome, error)

// HandleFunc decides what happens after a step failed: it gets the state the step started from
// and the error (a returned error, a recovered panic as a *PanicError, or an outcome that could
// not be applied).
type HandleFunc[S any] func(ctx *Ctx, state S, err error) Outcome

// FSM is a durable state machine whose state is S, stored as JSON. The step graph is a value,
// known at registration: Next targets are checked against Steps.
type FSM[S any] struct {
	// Name is the durable name stored in every instance row. Renaming it orphans running
	// instances, so choose it once. 1 to 128 bytes.
	Name string
	// Start is the first step of a new instance.
	Start string
	// Steps maps step names (durable too) to their functions.
	Steps map[string]StepFunc[S]
	// Handle decides what follows a failed step. Nil means DefaultHandle: retry with
	// exponential backoff and jitter until MaxAttempts, then fail.
	Handle HandleFunc[S]
	// Queue is the queue new instances go to unless the insert names one; default "default".
	Queue string
	// MaxAttempts is how many times a step may be tried (default DefaultMaxAttempts).
	MaxAttempts int
	// Backoff is the delay before try attempt+1 after try attempt failed, for DefaultHandle.
	// Nil means DefaultBackoff.
	Backoff func(attempt int) time.Duration
	// Version is the machine's version (0 means 1). Raise it by one when a deploy changes what
	// an instance in flight depends on (a step renamed or removed, the state's shape), and say
	// in Upgrades how to bring instances of the older versions forward. New instances are
	// stored at Version; a node never claims an instance of a version newer than its own.
	Version int
	// Upgrades bring instances of older versions forward, one version each (docs/upgrading.md).
	Upgrades []Upgrade
	// Retention is how long finished instances of this machine are kept (0: the GC's
	// Retention, default 24h); at least a second. Every client that registers the machine
	// records it at Start (the last one to start decides), and GC sweeps each machine by its
	// own, at the same cost whatever the other machines keep.
	Retention time.Duration
}

// With returns an Input that starts a new instance of m with the given state.
func (m FSM[S]) With(state S) Input {
	in := Input{machine: m.Name, step: m.Start, state: state, queue: m.Queue, maxAttempts: m.MaxAttempts,
		version: m.Version}
	if m.Steps[m.Start] == nil {
		in.err = fmt.Errorf("%w: machine %q has no start step %q", ErrUnknownStep, m.Name, m.Start)
	}
	return in
}

func (m FSM[S]) def() (*engine.MachineDef, error) {
	if err := checkName("machine name", m.Name); err != nil {
		return nil, err
	}
	if len(m.Steps) == 0 {
		return nil, fmt.Errorf("machine %q has no steps", m.Name)
	}
	steps := make(map[string]bool, len(m.Steps))
	for name, fn := range m.Steps {
		if err := checkName("step name", name); err != nil {
			return nil, fmt.Errorf("machine %q: %w", m.Name, err)
		}
		if fn == nil {
			return nil, fmt.Errorf("machine %q: step %q has a nil function", m.Name, name)
		}
		steps[name] = true
	}
	if !steps[m.Start] {
		return nil, fmt.Errorf("machine %q: start step %q is not in Steps", m.Name, m.Start)
	}
	if err := checkMachineOpts("machine", m.Name, m.Queue, m.MaxAttempts); err != nil {
		return nil, err
	}
	if err := checkUpgrades(m.Name, m.Version, m.Upgrades, steps); err != nil {
		return nil, err
	}
	if err := checkRetention("machine", m.Name, m.Retention); err != nil {
		return nil, err
	}
	version := max(m.Version, 1)
	return &engine.MachineDef{
		Name: m.Name, Start: m.Start, Steps: steps,
		Queue: orDefault(m.Queue, DefaultQueue), MaxAttempts: orDefault(m.MaxAttempts, DefaultMaxAttempts),
		Version: version, Upgrade: upgradeChain(m.Name, version, m.Upgrades), Upgrades: upgradeSteps(m.Upgrades),
		Retention: m.Retention, Run: m.run, Fail: m.fail,
	}, nil
}

// checkRetention validates a machine's Retention: 0 (the GC's) or at least a second.
func checkRetention(what, name string, r time.Duration) error {
	if r < 0 || (r > 0 && r < time.Second) {
		return fmt.Errorf("%s %q: Retention %v: at least 1s, or 0 for the GC's", what, name, r)
	}
	return nil
}

// checkMachineOpts validates the options an FSM and a Job share: the queue their instances go to
// (empty: DefaultQueue) and MaxAttempts (0: DefaultMaxAttempts).
func checkMachineOpts(what, name, queue string, maxAttempts int) error {
	if queue != "" {
		if err := checkName("queue name", queue); err != nil {
			return fmt.Errorf("%s %q: %w", what, name, err)
		}
	}
	if maxAttempts < 0 || maxAttempts > maxCount {
		return fmt.Errorf("%s %q: MaxAttempts %d must be between 1 and %d (0 means %d)", what, name, maxAttempts, maxCount, DefaultMaxAttempts)
	}
	return nil
}

func (m FSM[S]) run(call *engine.Call) store.Outcome {
	ctx := newCtx(call)
	var state S
	if err := jsonx.Decode(call.Row.State, &state); err != nil {
		// The state cannot become an S (it was written by another version of the type): neither
		// the step nor Handle can run on it. Retry on the machine's schedule, then fail; the
		// stored state is kept for an operator.
		return m.policy(ctx, fmt.Errorf("decode state as %T: %w", state, err), "decode")
	}
	out, err, panicked := callStep(m.Steps[call.Row.Step], ctx, state)
	if err == nil {
		var enc store.Outcome
		if enc, err = m.encode(ctx, out); err == nil {
			return enc
		}
		panicked = false
	}
	call.RollbackTx()
	kind := "error"
	if panicked {
		kind = "panic"
	} else if isOutcomeError(err) {
		kind = "outcome"
	}
	return m.route(ctx, state, err, kind)
}

// fail routes err, found after the step returned (its transaction could not commit), to Handle as
// the step's error; writes Handle makes through Ctx.Tx for it are rolled back.
func (m FSM[S]) fail(call *engine.Call, err error) store.Outcome {
	ctx := newCtx(call)
	var state S
	if derr := jsonx.Decode(call.Row.State, &state); derr != nil {
		return m.policy(ctx, err, kindTx)
	}
	out := m.route(ctx, state, err, kindTx)
	call.RollbackTx()
	return out
}

// kindTx is the error kind of a step whose transaction could not commit for a reason of the
// step's making, found after it returned.
const kindTx = "tx"

// route hands a failed step's error to Handle and applies its decision. If Handle itself fails
// (an error, a panic, an outcome that cannot be applied), the instance fails: the handler is the
// last word and must not loop.
func (m FSM[S]) route(ctx *Ctx, state S, err error, kind string) store.Outcome {
	h := m.Handle
	if h == nil {
		h = func(ctx *Ctx, _ S, err error) Outcome { return m.defaultHandle(ctx, err) }
	}
	out, herr := callHandle(h, ctx, state, err)
	var enc store.Outcome
	if herr == nil {
		enc, herr = m.encode(ctx, out)
	}
	if herr != nil {
		enc = store.Outcome{Kind: store.KindFailed}
		enc.ErrMsg = fmt.Sprintf("%v; then the handler failed: %v", err, herr)
	} else {
		msg := err.Error()
		if out.kind == outcomeStop && out.reason != nil && out.reason.Error() != msg {
			msg += " (stopped: " + out.reason.Error() + ")"
		}
		enc.ErrMsg = msg
	}
	enc.ErrKind = kind
	enc.Cause, enc.Panic = err, kind == "panic"
	return enc
}

// policy applies the default retry policy without calling Handle (for a state that cannot be
// decoded, where Handle could not be given a state).
func (m FSM[S]) policy(ctx *Ctx, err error, kind string) store.Outcome {
	enc, _ := m.encode(ctx, m.defaultHandle(ctx, err))
	enc.ErrKind, enc.ErrMsg, enc.Cause = kind, err.Error(), err
	return enc
}

func (m FSM[S]) defaultHandle(ctx *Ctx, err error) Outcome {
	if errors.Is(err, errUnrecoverable) || ctx.Attempt >= ctx.MaxAttempts {
		return Stop(err)
	}
	b := m.Backoff
	if b == nil {
		b = DefaultBackoff
	}
	return Retry(b(ctx.Attempt))
}

// encode checks an outcome against the machine and encodes it for the engine.
func (m FSM[S]) encode(ctx *Ctx, o Outcome) (store.Outcome, error) {
	for _, opt := range o.opts {
		if opt.apply == nil {
			return store.Outcome{}, outcomeErrorf("the zero OutcomeOption is not an option")
		}
		if err := opt.apply(&o); err != nil {
			return store.Outcome{}, outcomeErrorf("%s: %v", o.kind, err)
		}
	}
	switch o.kind {
	case outcomeNext:
		if m.Steps[o.step] == nil {
			return store.Outcome{}, outcomeError{fmt.Errorf("%w: Next(%q): machine %q has no such step", ErrUnknownStep, o.step, m.Name)}
		}
		st, err := stateOf[S](o.state)
		if err != nil {
			return store.Outcome{}, outcomeErrorf("Next(%q): %v", o.step, err)
		}
		b, err := jsonx.Encode(st, ctx.call.MaxPayload)
		if err != nil {
			return store.Outcome{}, outcomeError{fmt.Errorf("Next(%q) state: %w", o.step, err)}
		}
		if o.weight > 0 && o.rate == "" {
			return store.Outcome{}, outcomeErrorf("Next(%q): option Weight without RateLimit", o.step)
		}
		return store.Outcome{Kind: store.KindNext, Step: o.step, State: b, Delay: o.delay, Key: o.keyChange, NewKey: o.key,
			RateLimit: o.rate, Weight: max(o.weight, 1), FairSet: o.fairSet, FairKey: o.fairKey}, nil
	case outcomeAwait:
		if m.Steps[o.step] == nil {
			return store.Outcome{}, outcomeError{fmt.Errorf("%w: Await(…, %q): machine %q has no such step", ErrUnknownStep, o.step, m.Name)}
		}
		if err := checkAwaitNames(o.names); err != nil {
			return store.Outcome{}, outcomeErrorf("Await: %v", err)
		}
		st, err := stateOf[S](o.state)
		if err != nil {
			return store.Outcome{}, outcomeErrorf("Await(…, %q): %v", o.step, err)
		}
		b, err := jsonx.Encode(st, ctx.call.MaxPayload)
		if err != nil {
			return store.Outcome{}, outcomeError{fmt.Errorf("Await(…, %q) state: %w", o.step, err)}
		}
		return store.Outcome{Kind: store.KindAwait, Step: o.step, State: b, AwaitNames: o.names, AwaitTimeout: o.timeout}, nil
	case outcomeSpawn:
		if m.Steps[o.step] == nil {
			return store.Outcome{}, outcomeError{fmt.Errorf("%w: Spawn(…, %q): machine %q has no such step", ErrUnknownStep, o.step, m.Name)}
		}
		if limit := ctx.call.MaxChildren; len(o.children) > limit {
			return store.Outcome{}, outcomeError{fmt.Errorf("%w: Spawn: %d children, more than Config.MaxChildren (%d)",
				ErrInvalidInput, len(o.children), limit)}
		}
		st, err := stateOf[S](o.state)
		if err != nil {
			return store.Outcome{}, outcomeErrorf("Spawn(…, %q): %v", o.step, err)
		}
		b, err := jsonx.Encode(st, ctx.call.MaxPayload)
		if err != nil {
			return store.Outcome{}, outcomeError{fmt.Errorf("Spawn(…, %q) state: %w", o.step, err)}
		}
		rows := make([]store.InsertRow, len(o.children))
		for i, ch := range o.children {
			if ch.Opts != nil && len(ch.Opts.CorrelationScope) > 0 {
				return store.Outcome{}, outcomeErrorf("Spawn: child %d: CorrelationScope does not apply to children (they deduplicate against live instances only)", i)
			}
			if err := buildRow(ch.Input, ch.Opts, i, ctx.call.MaxPayload, ctx.call.Machine, &rows[i]); err != nil {
				return store.Outcome{}, outcomeError{fmt.Errorf("Spawn: %w", err)}
			}
		}
		return store.Outcome{Kind: store.KindSpawn, Step: o.step, State: b, Children: rows}, nil
	case outcomeRetry:
		return retryOutcome(ctx, o.delay), nil
	case outcomeDone:
		return doneOutcome(ctx, o.result)
	case outcomeStop:
		return store.Outcome{Kind: store.KindFailed, ErrKind: "stop", ErrMsg: o.reason.Error()}, nil
	}
	return store.Outcome{}, outcomeErrorf("the step returned no outcome (the zero Outcome)")
}

func retryOutcome(ctx *Ctx, delay time.Duration) store.Outcome {
	if ctx.Attempt >= ctx.MaxAttempts {
		return store.Outcome{Kind: store.KindFailed, ErrKind: "retry",
			ErrMsg: fmt.Sprintf("Retry after attempt %d of %d: no attempts left", ctx.Attempt, ctx.MaxAttempts)}
	}
	return store.Outcome{Kind: store.KindRetry, Delay: max(delay, 0)}
}

func doneOutcome(ctx *Ctx, result any) (store.Outcome, error) {
	if result == nil {
		return store.Outcome{Kind: store.KindDone}, nil
	}
	b, err := jsonx.Encode(result, ctx.call.MaxPayload)
	if err != nil {
		return store.Outcome{}, outcomeError{fmt.Errorf("Done result: %w", err)}
	}
	return store.Outcome{Kind: store.KindDone, Result: b}, nil
}

// checkAwaitNames validates an await set: at least one name, each a valid signal name, no
// duplicates.
func checkAwaitNames(names []string) error {
	if len(names) == 0 {
		return errors.New("the set of signal names is empty")
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if err := checkName("signal name", n); err != nil {
			return err
		}
		if seen[n] {
			return fmt.Errorf("signal name %q is in the set twice", n)
		}
		seen[n] = true
	}
	return nil
}

// stateOf accepts an S or a non-nil *S.
func stateOf[S any](v any) (S, error) {
	var zero S
	switch s := v.(type) {
	case S:
		return s, nil
	case *S:
		if s != nil {
			return *s, nil
		}
		return zero, fmt.Errorf("state is a nil %T", v)
	}
	return zero, fmt.Errorf("state has type %s, the machine's state type is %s",
		typeName(v), reflect.TypeFor[S]())
}

func typeName(v any) string {
	if v == nil {
		return "nil"
	}
	return reflect.TypeOf(v).String()
}

// Job is a one-step machine: Perform runs with the job's arguments A (stored as JSON); a nil
// error finishes it, an error retries it with backoff until MaxAttempts, then fails it. Wrap an
// error with Unrecoverable to fail at once.
type Job[A any] struct {
	// Name is the durable name stored in every row (1 to 128 bytes).
	Name string
	// Perform does the work.
	Perform func(ctx *Ctx, args A) error
	// Queue is the queue new jobs go to unless the insert names one; default "default".
	Queue string
	// MaxAttempts is how many times Perform may be tried (default DefaultMaxAttempts).
	MaxAttempts int
	// Backoff is the delay after failed try attempt; nil means DefaultBackoff.
	Backoff func(attempt int) time.Duration
	// Retention is how long finished jobs of this kind are kept (0: the GC's Retention); see
	// FSM.Retention.
	Retention time.Duration
}

// JobStep is the name of a Job's only step.
const JobStep = "perform"

// With returns an Input that inserts a job with these arguments.
func (j Job[A]) With(args A) Input {
	return Input{machine: j.Name, step: JobStep, state: args, queue: j.Queue, maxAttempts: j.MaxAttempts}
}

func (j Job[A]) def() (*engine.MachineDef, error) {
	if err := checkName("job name", j.Name); err != nil {
		return nil, err
	}
	if j.Perform == nil {
		return nil, fmt.Errorf("job %q has no Perform function", j.Name)
	}
	if err := checkMachineOpts("job", j.Name, j.Queue, j.MaxAttempts); err != nil {
		return nil, err
	}
	if err := checkRetention("job", j.Name, j.Retention); err != nil {
		return nil, err
	}
	return &engine.MachineDef{
		Name: j.Name, Start: JobStep, Steps: map[string]bool{JobStep: true},
		Queue: orDefault(j.Queue, DefaultQueue), MaxAttempts: orDefault(j.MaxAttempts, DefaultMaxAttempts),
		Retention: j.Retention, Run: j.run, Fail: j.fail,
	}, nil
}

func (j Job[A]) run(call *engine.Call) store.Outcome {
	ctx := newCtx(call)
	var args A
	kind := "decode"
	err := jsonx.Decode(call.Row.State, &args)
	if err != nil {
		err = fmt.Errorf("decode arguments as %T: %w", args, err)
	} else {
		var panicked bool
		err, panicked = callPerform(j.Perform, ctx, args)
		if err == nil {
			return store.Outcome{Kind: store.KindDone}
		}
		call.RollbackTx()
		kind = "error"
		if panicked {
			kind = "panic"
		}
	}
	return j.failed(ctx, err, kind)
}

// fail applies the job's retry policy to err, found after Perform returned (its transaction could
// not commit).
func (j Job[A]) fail(call *engine.Call, err error) store.Outcome {
	return j.failed(newCtx(call), err, kindTx)
}

// failed is the outcome of a try that failed with err: a retry after the job's backoff, or a
// failure once the attempts are spent or err is unrecoverable.
func (j Job[A]) failed(ctx *Ctx, err error, kind string) store.Outcome {
	var out store.Outcome
	if errors.Is(err, errUnrecoverable) || ctx.Attempt >= ctx.MaxAttempts {
		out = store.Outcome{Kind: store.KindFailed}
	} else {
		b := j.Backoff
		if b == nil {
			b = DefaultBackoff
		}
		out = store.Outcome{Kind: store.KindRetry, Delay: max(b(ctx.Attempt), 0)}
	}
	out.ErrKind, out.ErrMsg, out.Cause, out.Panic = kind, err.Error(), err, kind == "panic"
	return out
}

// Input is a new instance to insert: a machine, its start step and its initial state. Build it
// with FSM.With or Job.With.
type Input struct {
	machine     string
	step        string
	state       any
	queue       string
	maxAttempts int
	// version is the machine version the instance starts at (0 is 1).
	version int
	err     error
}

// Ctx is what a step gets: a context.Context (cancelled when the client stops past its drain
// deadline, or when the worker loses its claim, with ErrLeaseLost as the cause) and facts about
// the instance and the try.
type Ctx struct {
	context.Context
	// ID is the instance's id.
	ID int64
	// Machine, Step and Queue name what is running.
	Machine, Step, Queue string
	// Attempt is the try of this step, from 1; MaxAttempts is the limit. A try lost to a crashed
	// or stalled worker is not counted: the step runs again under the same Attempt.
	Attempt, MaxAttempts int
	// Priority is the instance's priority (1 most urgent … 9).
	Priority int
	// CorrelationKey is the instance's key, or "".
	CorrelationKey string
	// InsertedAt is when the instance was inserted.
	InsertedAt time.Time
	// Awaited are the signals in the inbox whose names the instance awaited, when this step
	// runs after an Await: empty after a timeout.
	Awaited []Signal
	// Children are the instances the last Spawn started, with how they finished, when this
	// step is that Spawn's join step (and on its retries); nil otherwise.
	Children []ChildResult
	// Inbox is the whole inbox as of the claim, oldest first (one of 100 signals or more: the
	// first 100 as of the claim, the later ones as of just before the step ran; see
	// docs/signals.md). The step's progress (Next, Await)
	// consumes exactly the signals on Awaited; the others, and later arrivals, stay in the inbox
	// until an Await of theirs consumes them; a terminal outcome clears the inbox.
	Inbox []Signal

	call *engine.Call
}

func newCtx(call *engine.Call) *Ctx {
	r := call.Row
	c := &Ctx{
		Context: call.Ctx, ID: r.ID, Machine: r.Machine, Step: r.Step, Queue: call.Queue,
		Attempt: r.Attempt, MaxAttempts: r.MaxAttempts, Priority: r.Priority, CorrelationKey: r.CorrelationKey,
		InsertedAt: r.InsertedAt, call: call,
	}
	if r.Children != nil {
		c.Children = make([]ChildResult, len(r.Children))
		for i, ch := range r.Children {
			c.Children[i] = ChildResult{ID: ch.ID, Machine: ch.Machine, Status: Status(ch.Status), Error: ch.Error}
			if len(ch.Result) > 0 && string(ch.Result) != "null" {
				c.Children[i].Result = ch.Result
			}
		}
	}
	if len(r.Inbox) > 0 {
		c.Inbox = make([]Signal, len(r.Inbox))
		for i, s := range r.Inbox {
			sig := Signal{ID: s.ID, Name: s.Name, At: s.At}
			if len(s.Payload) > 0 && string(s.Payload) != "null" {
				sig.Payload = s.Payload
			}
			c.Inbox[i] = sig
			if slices.Contains(r.AwaitNames, s.Name) {
				c.Awaited = append(c.Awaited, sig)
			}
		}
	}
	return c
}

// Logger returns the client's logger with the client, queue, machine, step and instance id
// attached.
func (c *Ctx) Logger() *slog.Logger {
	return c.call.Logger()
}

// Tx returns a transaction on the engine's database that commits together with this step's
// outcome: write through it, and the writes and the step's progress commit exactly once, or not
// at all (if the step fails, or its claim was lost). It begins on first use; steps that never
// call it pay nothing. Do not commit or roll it back yourself.
func (c *Ctx) Tx() (pgx.Tx, error) {
	return c.call.Tx()
}

// ChildResult is how a spawned child finished, as its parent's join step sees it.
type ChildResult struct {
	ID      int64
	Machine string
	// Status is StatusDone or StatusFailed (StatusCancelled if an operator cancelled it).
	Status Status
	// Result is the child's Done result (JSON), or nil.
	Result []byte
	// Error is the child's last recorded error, or "".
	Error string
}

// Decode unmarshals the child's result into v.
func (c ChildResult) Decode(v any) error {
	return jsonx.Decode(c.Result, v)
}

// PanicError is how a recovered panic reaches Handle.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("panic: %v\n%s", e.Value, e.Stack)
}

func callStep[S any](fn StepFunc[S], ctx *Ctx, state S) (out Outcome, err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			out, err, panicked = Outcome{}, &PanicError{Value: r, Stack: string(debug.Stack())}, true
		}
	}()
	out, err = fn(ctx, state)
	return out, err, false
}

func callHandle[S any](fn HandleFunc[S], ctx *Ctx, state S, cause error) (out Outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = Outcome{}, &PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return fn(ctx, state, cause), nil
}

func callPerform[A any](fn func(*Ctx, A) error, ctx *Ctx, args A) (err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			err, panicked = &PanicError{Value: r, Stack: string(debug.Stack())}, true
		}
	}()
	return fn(ctx, args), false
}

// outcomeError marks an error in the outcome itself (unknown step, bad state, too large).
type outcomeError struct{ err error }

func (e outcomeError) Error() string { return "outcome: " + e.err.Error() }
func (e outcomeError) Unwrap() error { return e.err }

func outcomeErrorf(format string, args ...any) error {
	return outcomeError{fmt.Errorf(format, args...)}
}

func isOutcomeError(err error) bool {
	var oe outcomeError
	return errors.As(err, &oe)
}

var errUnrecoverable = errors.New("unrecoverable")

type unrecoverable struct{ err error }

func (u unrecoverable) Error() string        { return u.err.Error() }
func (u unrecoverable) Unwrap() []error      { return []error{u.err, errUnrecoverable} }
func (u unrecoverable) Is(target error) bool { return target == errUnrecoverable }

// Unrecoverable wraps err so that the default handler (and a Job) fails the instance at once
// instead of retrying.
func Unrecoverable(err error) error {
	if err == nil {
		return nil
	}
	return unrecoverable{err}
}

// DefaultBackoff is the delay before the try after failed try attempt: one second doubled per
// attempt, capped at one hour, with ±25% jitter so that failures do not retry in lockstep.
func DefaultBackoff(attempt int) time.Duration {
	d := time.Hour
	if attempt < 13 {
		d = min(time.Second<<max(attempt-1, 0), time.Hour)
	}
	jitter := 0.75 + rand.Float64()/2
	return time.Duration(float64(d) * jitter)
}

// orDefault returns v, or def when v is its type's zero value.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// orPositive returns v, or def when v is not positive.
func orPositive[T ~int64 | ~float64](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
