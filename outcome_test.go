package gendurable_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

type counter struct {
	N int `json:"n"`
}

type other struct {
	X string `json:"x"`
}

// outcomes is a machine whose start step does whatever its name says, to test each outcome.
func outcomes(handle gendurable.HandleFunc[counter]) gendurable.FSM[counter] {
	step := func(f func(ctx *gendurable.Ctx, c counter) (gendurable.Outcome, error)) gendurable.StepFunc[counter] {
		return f
	}
	return gendurable.FSM[counter]{
		Name:        "outcomes",
		Start:       "next",
		MaxAttempts: 3,
		Backoff:     func(int) time.Duration { return time.Hour },
		Handle:      handle,
		Steps: map[string]gendurable.StepFunc[counter]{
			"next": step(func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				return gendurable.Next("done", counter{N: c.N + 1}), nil
			}),
			"nextptr": step(func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				return gendurable.Next("done", &counter{N: c.N + 10}), nil
			}),
			"done": step(func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				return gendurable.Done(c), nil
			}),
			"donenil": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			}),
			"stop": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Stop(errors.New("out of stock")), nil
			}),
			"retry": step(func(ctx *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				if ctx.Attempt < 2 {
					return gendurable.Retry(time.Hour), nil
				}
				return gendurable.Done(ctx.Attempt), nil
			}),
			"retryforever": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Retry(0), nil
			}),
			"error": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, errors.New("boom")
			}),
			"panic": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				panic("kaboom")
			}),
			"zero": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Outcome{}, nil
			}),
			"unknownnext": step(func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				return gendurable.Next("nowhere", c), nil
			}),
			"wrongtype": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Next("done", other{X: "y"}), nil
			}),
			"unencodable": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Done(math.NaN()), nil
			}),
			"toolarge": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Done(strings.Repeat("x", 2048)), nil
			}),
			"nul": step(func(*gendurable.Ctx, counter) (gendurable.Outcome, error) {
				return gendurable.Done("a\x00b"), nil
			}),
			"badoption": step(func(c *gendurable.Ctx, s counter) (gendurable.Outcome, error) {
				return gendurable.Next("done", s, gendurable.After(-time.Second)), nil
			}),
			"loop": step(func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				return gendurable.Next("loop", counter{N: c.N + 1}), nil
			}),
		},
	}
}

// startAt inserts an instance of m that starts at the given step (by renaming the start step).
func startAt(t *testing.T, cl *gendurable.Client, m gendurable.FSM[counter], step string) int64 {
	t.Helper()
	m.Start = step
	res, err := cl.Insert(context.Background(), m.With(counter{N: 1}), nil)
	require.NoError(t, err)
	return res.ID
}

func TestOutcomesThroughDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := outcomes(nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, MaxPayloadBytes: 1024})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()

	ids := map[string]int64{}
	for _, s := range []string{"next", "nextptr", "donenil", "stop", "retry", "retryforever", "error", "panic",
		"zero", "unknownnext", "wrongtype", "unencodable", "toolarge", "nul", "badoption"} {
		ids[s] = startAt(t, cl, m, s)
	}
	kit.Drain(ctx)

	var c counter
	kit.RequireDone(ctx, ids["next"], &c)
	require.Equal(t, 2, c.N, "Next committed the new state before Done returned it")
	kit.RequireDone(ctx, ids["nextptr"], &c)
	require.Equal(t, 11, c.N, "Next accepts a *S")
	in := kit.RequireDone(ctx, ids["donenil"], nil)
	require.Nil(t, in.Result)

	in = kit.RequireFailed(ctx, ids["stop"])
	require.Len(t, in.Errors, 1)
	require.Equal(t, "stop", in.Errors[0].Kind)
	require.Equal(t, "out of stock", in.Errors[0].Error)

	var attempt int
	kit.RequireDone(ctx, ids["retry"], &attempt)
	require.Equal(t, 2, attempt, "Retry runs the same step again with attempt+1")

	in = kit.RequireFailed(ctx, ids["retryforever"])
	require.Equal(t, 3, in.Attempt)
	require.Contains(t, in.Errors[len(in.Errors)-1].Error, "no attempts left")

	// A returned error and a panic go to the default handler: retried with backoff until
	// MaxAttempts, then failed, every error kept.
	in = kit.RequireFailed(ctx, ids["error"])
	require.Len(t, in.Errors, 3)
	for i, e := range in.Errors {
		require.Equal(t, "error", e.Kind)
		require.Equal(t, "boom", e.Error)
		require.Equal(t, i+1, e.Attempt)
	}
	in = kit.RequireFailed(ctx, ids["panic"])
	require.Len(t, in.Errors, 3)
	require.Equal(t, "panic", in.Errors[0].Kind)
	require.Contains(t, in.Errors[0].Error, "kaboom")

	// Outcomes that cannot be applied route to the handler as errors of kind "outcome", and the
	// committed state is untouched.
	for _, s := range []string{"zero", "unknownnext", "wrongtype", "unencodable", "toolarge", "nul", "badoption"} {
		in := kit.RequireFailed(ctx, ids[s])
		require.Len(t, in.Errors, 3, s)
		require.Equal(t, "outcome", in.Errors[0].Kind, s)
		require.Equal(t, s, in.Step, s)
		require.JSONEq(t, `{"n":1}`, string(in.State), s)
	}
	require.Contains(t, kit.Get(ctx, ids["unknownnext"]).Errors[0].Error, `"nowhere"`)
	require.Contains(t, kit.Get(ctx, ids["wrongtype"]).Errors[0].Error, "gendurable_test.other")
	require.Contains(t, kit.Get(ctx, ids["toolarge"]).Errors[0].Error, "payload too large")
	require.Contains(t, kit.Get(ctx, ids["nul"]).Errors[0].Error, "NUL")
}

func TestHandleDecides(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var seen []error
	m := outcomes(func(ctx *gendurable.Ctx, c counter, err error) gendurable.Outcome {
		seen = append(seen, err)
		if ctx.Step == "panic" {
			panic("the handler panicked too")
		}
		if ctx.Step == "unknownnext" {
			return gendurable.Next("nowhere-either", c)
		}
		// Recover by moving on with a marked state.
		return gendurable.Next("done", counter{N: -1})
	})
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	errID := startAt(t, cl, m, "error")
	panicID := startAt(t, cl, m, "panic")
	badID := startAt(t, cl, m, "unknownnext")
	kit.Drain(ctx)

	var c counter
	in := kit.RequireDone(ctx, errID, &c)
	require.Equal(t, -1, c.N)
	require.Len(t, in.Errors, 1, "the routed error is recorded even when the handler recovers")

	// A handler that panics, or decides something that cannot be applied, fails the instance
	// at once: the handler is the last word.
	in = kit.RequireFailed(ctx, panicID)
	require.Len(t, in.Errors, 1)
	require.Contains(t, in.Errors[0].Error, "kaboom")
	require.Contains(t, in.Errors[0].Error, "the handler panicked too")
	in = kit.RequireFailed(ctx, badID)
	require.Len(t, in.Errors, 1)
	require.Contains(t, in.Errors[0].Error, "nowhere-either")

	require.Len(t, seen, 3)
	var pe *gendurable.PanicError
	require.True(t, errors.As(seen[1], &pe) || errors.As(seen[0], &pe) || errors.As(seen[2], &pe))
}

func TestDrainFailsFastOnARunawayMachine(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := outcomes(nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	kit := durabletest.New(t, cl, &durabletest.Opts{MaxSteps: 50})
	id := startAt(t, cl, m, "loop")
	res, err := kit.TryDrain(context.Background(), nil)
	require.ErrorIs(t, err, durabletest.ErrMaxSteps)
	require.Equal(t, 50, res.Steps)
	// The runaway row is left runnable, not lost.
	var c counter
	in := kit.RequireState(context.Background(), id, &c)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
	require.Equal(t, 51, c.N)
}

type mailArgs struct {
	To string `json:"to"`
}

func TestJobRetriesAndFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	calls := map[string]int{}
	job := gendurable.Job[mailArgs]{
		Name:        "mail",
		MaxAttempts: 4,
		Backoff:     func(int) time.Duration { return time.Minute },
		Perform: func(ctx *gendurable.Ctx, a mailArgs) error {
			calls[a.To]++
			switch a.To {
			case "flaky":
				if ctx.Attempt < 3 {
					return errors.New("smtp timeout")
				}
				return nil
			case "bounce":
				return gendurable.Unrecoverable(errors.New("no such mailbox"))
			case "down":
				return errors.New("smtp down")
			}
			return nil
		},
	}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	ids := map[string]int64{}
	for _, to := range []string{"ok", "flaky", "bounce", "down"} {
		r, err := cl.Insert(ctx, job.With(mailArgs{To: to}), nil)
		require.NoError(t, err)
		ids[to] = r.ID
	}
	kit.Drain(ctx)
	kit.RequireDone(ctx, ids["ok"], nil)
	in := kit.RequireDone(ctx, ids["flaky"], nil)
	require.Len(t, in.Errors, 2)
	in = kit.RequireFailed(ctx, ids["bounce"])
	require.Len(t, in.Errors, 1)
	require.Equal(t, map[string]int{"ok": 1, "flaky": 3, "bounce": 1, "down": 4}, calls)
	in = kit.RequireFailed(ctx, ids["down"])
	require.Len(t, in.Errors, 4)
	require.Equal(t, 4, in.Attempt)
}

func TestStateDecodeFailureRetriesThenFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := outcomes(func(*gendurable.Ctx, counter, error) gendurable.Outcome {
		t.Error("Handle must not be called with a state that did not decode")
		return gendurable.Stop(nil)
	})
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	id := startAt(t, cl, m, "done")
	legacy := startAt(t, cl, m, "done")
	// Schema drift: the stored state no longer fits the type.
	e.exec(t, `UPDATE {schema}.instances SET state = '{"n": "not a number"}' WHERE id = $1`, id)
	// The double encoding of early versions: a jsonb string holding the JSON text.
	e.exec(t, `UPDATE {schema}.instances SET state = to_jsonb('{"n": 42}'::text) WHERE id = $1`, legacy)
	kit.Drain(ctx)
	in := kit.RequireFailed(ctx, id)
	require.Len(t, in.Errors, 3)
	require.Equal(t, "decode", in.Errors[0].Kind)
	require.JSONEq(t, `{"n": "not a number"}`, string(in.State), "the undecodable state is kept for an operator")
	var c counter
	kit.RequireDone(ctx, legacy, &c)
	require.Equal(t, 42, c.N)
}

// Whatever text an error carries, the instance records it: Postgres refuses NUL and invalid UTF-8
// in text, so the store makes it storable (and caps its length) rather than fail the outcome.
func TestAnyErrorTextIsRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := gendurable.Job[string]{Name: "texty", MaxAttempts: 1, Perform: func(_ *gendurable.Ctx, s string) error {
		if s == "nul" {
			return errors.New("a\x00b\xffc")
		}
		return errors.New(strings.Repeat("é", 10000))
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	nul, err := cl.Insert(ctx, job.With("nul"), nil)
	require.NoError(t, err)
	long, err := cl.Insert(ctx, job.With("long"), nil)
	require.NoError(t, err)
	kit.Drain(ctx)
	in := kit.RequireFailed(ctx, nul.ID)
	require.Equal(t, "a\\0b\uFFFDc", in.Errors[0].Error)
	in = kit.RequireFailed(ctx, long.ID)
	require.LessOrEqual(t, len(in.Errors[0].Error), 8000+len("…"))
	require.True(t, strings.HasSuffix(in.Errors[0].Error, "é…"))
}
