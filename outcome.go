package gendurable

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/store"
)

type outcomeKind int

const (
	outcomeNone outcomeKind = iota
	outcomeNext
	outcomeRetry
	outcomeDone
	outcomeStop
	outcomeAwait
	outcomeSpawn
)

// Outcome is what a step decides: run another step (Next), try this one again (Retry), finish
// (Done) or fail (Stop). Build one with those functions; the zero Outcome is invalid and is
// routed to the machine's Handle as an error.
type Outcome struct {
	kind      outcomeKind
	step      string
	state     any
	delay     time.Duration
	result    any
	reason    error
	names     []string
	timeout   time.Duration
	children  []Child
	keyChange store.KeyChange
	key       string
	rate      string
	weight    int
	fairSet   bool
	fairKey   string
	opts      []OutcomeOption
}

// OutcomeOption adjusts an outcome (see After). Options are checked when the outcome is applied:
// one that does not fit its outcome is an error routed to Handle.
type OutcomeOption struct {
	name  string
	apply func(*Outcome) error
}

// Next commits state and makes step the next one to run. The step's attempt count starts over.
// state must be the machine's state type S (or *S).
func Next(step string, state any, opts ...OutcomeOption) Outcome {
	return Outcome{kind: outcomeNext, step: step, state: state, opts: opts}
}

// Retry runs the same step again after the delay, with the committed state unchanged and the
// attempt count one higher. Past the machine's MaxAttempts the instance fails instead.
func Retry(after time.Duration) Outcome {
	return Outcome{kind: outcomeRetry, delay: after}
}

// Done finishes the instance with a result (any JSON-encodable value, or nil).
func Done(result any) Outcome {
	return Outcome{kind: outcomeDone, result: result}
}

// Stop fails the instance for good with reason recorded in its error history.
func Stop(reason error) Outcome {
	if reason == nil {
		reason = errors.New("stopped")
	}
	return Outcome{kind: outcomeStop, reason: reason}
}

// Await commits state and parks the instance until a signal with any of the names is in its
// inbox; then step next runs, with the matching signals on Ctx.Awaited and the whole inbox on
// Ctx.Inbox. A parked instance holds no goroutine, connection or lock. Signals that arrived
// before (and that the step that awaits has not seen) count: they wake it at once. With
// Timeout(d), the instance wakes after d even without a signal (Ctx.Awaited is then empty).
func Await(names []string, next string, state any, opts ...OutcomeOption) Outcome {
	return Outcome{kind: outcomeAwait, names: names, step: next, state: state, opts: opts}
}

// ConcurrencyKey makes the next step run under key: never while another execution of the key
// runs (K = 1), or, when the part of key before its first ':' names a gate in
// Config.ConcurrencyLimits, only while that gate has a free slot. The key stays with the instance
// until a later Next switches or releases it. It applies to Next.
func ConcurrencyKey(key string) OutcomeOption {
	return OutcomeOption{name: "ConcurrencyKey", apply: func(o *Outcome) error {
		if o.kind != outcomeNext {
			return fmt.Errorf("option ConcurrencyKey applies to Next only")
		}
		if err := checkKey(key); err != nil {
			return fmt.Errorf("option ConcurrencyKey: %w", err)
		}
		o.keyChange, o.key = store.KeySet, key
		return nil
	}}
}

// RateLimit makes the next step run under a token bucket: key is a limit's name in
// Config.RateLimits ("stripe"), or that name and a partition ("stripe:acme", a bucket per
// tenant). The step runs only once its bucket has the tokens (Weight, default 1). It applies to
// Next, for the step it leads to only: the step after that runs unlimited unless its own Next
// names a limit too. A limit no node's configuration names stalls the step (rate_limit.unknown).
func RateLimit(key string) OutcomeOption {
	return OutcomeOption{name: "RateLimit", apply: func(o *Outcome) error {
		if o.kind != outcomeNext {
			return fmt.Errorf("option RateLimit applies to Next only")
		}
		if err := checkKey(key); err != nil {
			return fmt.Errorf("option RateLimit: %w", err)
		}
		o.rate = key
		return nil
	}}
}

// Weight makes the next step take n tokens of its rate limit instead of one. A weight above the
// limit's Burst never fits: the step, and every step behind it in that bucket, waits forever.
// Keep weights at or below Burst (split a heavier step). It applies to Next with RateLimit.
func Weight(n int) OutcomeOption {
	return OutcomeOption{name: "Weight", apply: func(o *Outcome) error {
		if o.kind != outcomeNext {
			return fmt.Errorf("option Weight applies to Next only")
		}
		if n < 1 || n > maxCount {
			return fmt.Errorf("option Weight: %d is not a weight of 1 to %d", n, maxCount)
		}
		o.weight = n
		return nil
	}}
}

// ReleaseConcurrencyKey runs the next step, and those after it, without a concurrency key. It
// applies to Next.
func ReleaseConcurrencyKey() OutcomeOption {
	return OutcomeOption{name: "ReleaseConcurrencyKey", apply: func(o *Outcome) error {
		if o.kind != outcomeNext {
			return fmt.Errorf("option ReleaseConcurrencyKey applies to Next only")
		}
		o.keyChange, o.key = store.KeyRelease, ""
		return nil
	}}
}

// FairnessKey runs the next step, and those after it, under fairness key key (see
// InsertOpts.FairnessKey): the step takes its place in its queue's fair order as that key's. It
// applies to Next.
func FairnessKey(key string) OutcomeOption {
	return OutcomeOption{name: "FairnessKey", apply: func(o *Outcome) error {
		if o.kind != outcomeNext {
			return fmt.Errorf("option FairnessKey applies to Next only")
		}
		if err := checkKey(key); err != nil {
			return fmt.Errorf("option FairnessKey: %w", err)
		}
		o.fairSet, o.fairKey = true, key
		return nil
	}}
}

func checkKey(key string) error {
	if key == "" || len(key) > 512 || !utf8.ValidString(key) || strings.ContainsRune(key, 0) {
		return fmt.Errorf("key %.40q: must be 1 to 512 bytes of valid UTF-8 without NUL", key)
	}
	return nil
}

// Child is a new instance a Spawn starts: any machine, any queue, with its own insert options.
// A child whose correlation key is taken by a live instance of its machine is not started (and
// not counted: the parent joins on the others).
type Child struct {
	Input Input
	Opts  *InsertOpts
}

// Spawn commits state, starts the children, and parks the instance until every one of them has
// finished (done or failed); then step join runs, with the children's ids, machines, statuses,
// results and errors on Ctx.Children. All of it commits in the statement that applies the
// outcome. The parent holds nothing while it waits; a failed child does not fail the parent (the
// join step decides). A Spawn of no children runs join at once, with no children. At most
// Config.MaxChildren children per Spawn: more is an outcome error matching ErrInvalidInput,
// routed to Handle, and nothing is started.
func Spawn(children []Child, join string, state any) Outcome {
	return Outcome{kind: outcomeSpawn, children: children, step: join, state: state}
}

// Timeout wakes an awaiting instance after d (measured by the database clock, fired by the
// reaper: resolution is the reaper's interval) even if no awaited signal arrived. A wake, not a
// failure: the attempt count is untouched. It applies to Await.
func Timeout(d time.Duration) OutcomeOption {
	return OutcomeOption{name: "Timeout", apply: func(o *Outcome) error {
		if o.kind != outcomeAwait {
			return fmt.Errorf("option Timeout applies to Await only")
		}
		if d <= 0 {
			return fmt.Errorf("option Timeout: %v is not a positive duration", d)
		}
		o.timeout = d
		return nil
	}}
}

// After delays the next step: the instance is runnable again only once d has passed (measured
// by the database clock). It applies to Next.
func After(d time.Duration) OutcomeOption {
	return OutcomeOption{name: "After", apply: func(o *Outcome) error {
		if o.kind != outcomeNext {
			return fmt.Errorf("option After applies to Next only")
		}
		if d < 0 {
			return fmt.Errorf("option After: negative delay %v", d)
		}
		o.delay = d
		return nil
	}}
}

func (k outcomeKind) String() string {
	switch k {
	case outcomeNext:
		return "Next"
	case outcomeRetry:
		return "Retry"
	case outcomeDone:
		return "Done"
	case outcomeStop:
		return "Stop"
	case outcomeAwait:
		return "Await"
	case outcomeSpawn:
		return "Spawn"
	}
	return "no outcome"
}
