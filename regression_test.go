package gendurable_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

// A string argument whose text reads as JSON (a webhook body kept verbatim) reaches the step as
// the same string, and a string result reaches the parent's join as it was. Regression: the
// legacy unwrapping turned it into an object that no longer decoded into a string, so the job
// retried until it failed.
func TestStringsThatReadAsJSONRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := `{"event":"paid","amount":[1,2]}`
	var got []string
	hook := gendurable.Job[string]{Name: "webhook", MaxAttempts: 1, Perform: func(_ *gendurable.Ctx, s string) error {
		got = append(got, s)
		return nil
	}}
	echo := gendurable.FSM[string]{Name: "echo", Start: "a", Steps: map[string]gendurable.StepFunc[string]{
		"a": func(_ *gendurable.Ctx, s string) (gendurable.Outcome, error) { return gendurable.Next("b", s), nil },
		"b": func(_ *gendurable.Ctx, s string) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
	}}
	var joined string
	parent := gendurable.FSM[string]{Name: "parent", Start: "spawn", Steps: map[string]gendurable.StepFunc[string]{
		"spawn": func(_ *gendurable.Ctx, s string) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{{Input: echo.With(s)}}, "join", s), nil
		},
		"join": func(ctx *gendurable.Ctx, s string) (gendurable.Outcome, error) {
			if err := ctx.Children[0].Decode(&joined); err != nil {
				return gendurable.Outcome{}, gendurable.Unrecoverable(err)
			}
			return gendurable.Done(nil), nil
		},
	}, MaxAttempts: 1}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{hook, echo, parent}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	j, err := cl.Insert(ctx, hook.With(body), nil)
	require.NoError(t, err)
	p, err := cl.Insert(ctx, parent.With(`[1,2,3]`), nil)
	require.NoError(t, err)
	kit.Drain(ctx)
	kit.RequireDone(ctx, j.ID, nil)
	require.Equal(t, []string{body}, got)
	kit.RequireDone(ctx, p.ID, nil)
	require.Equal(t, `[1,2,3]`, joined)
}

// Counts stored in 32-bit columns and times outside Postgres's range are refused by validation,
// with the field named, instead of reaching the database (a CHECK violation) or being wrapped
// into another value on the way (regression: found by FuzzInsertValidate).
func TestInsertBoundsOfStoredValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	ctx := context.Background()
	bad := map[string]*gendurable.InsertOpts{
		"MaxAttempts":          {MaxAttempts: math.MaxInt32 + 1},
		"MaxAttempts wrapping": {MaxAttempts: 1<<32 + 3},
		"Weight":               {RateLimit: "r", Weight: math.MaxInt32 + 1},
		"Weight wrapping":      {RateLimit: "r", Weight: 1<<32 + 1},
		"ScheduledAt early":    {ScheduledAt: time.Date(-4713, time.November, 23, 23, 59, 59, 0, time.UTC)},
		"ScheduledAt late":     {ScheduledAt: time.Date(294277, time.January, 1, 0, 0, 0, 0, time.UTC)},
		"ScheduledAt wrapping": {ScheduledAt: time.Unix(1<<62, 0)},
	}
	for name, opts := range bad {
		_, err := cl.Insert(ctx, noop.With(counter{}), opts)
		var ie *gendurable.InputError
		require.ErrorAs(t, err, &ie, name)
		require.Equal(t, strings.Fields(name)[0], ie.Field, name)
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	// The edges themselves are stored as given.
	for _, opts := range []*gendurable.InsertOpts{
		{MaxAttempts: math.MaxInt32, RateLimit: "r", Weight: math.MaxInt32},
		{ScheduledAt: time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)},
		{ScheduledAt: time.Date(294277, time.January, 1, 0, 0, 0, 0, time.UTC).Add(-time.Microsecond)},
	} {
		r, err := cl.Insert(ctx, noop.With(counter{}), opts)
		require.NoError(t, err)
		in, err := cl.Get(ctx, r.ID)
		require.NoError(t, err)
		if !opts.ScheduledAt.IsZero() {
			require.True(t, opts.ScheduledAt.Equal(in.ScheduledAt), "%v stored as %v", opts.ScheduledAt, in.ScheduledAt)
		} else {
			require.Equal(t, math.MaxInt32, in.MaxAttempts)
			require.Equal(t, math.MaxInt32, e.count(t, `SELECT weight FROM {schema}.instances WHERE id = $1`, r.ID))
		}
	}
}

// A Next's Weight beyond a 32-bit count is an outcome error routed to Handle, not a weight
// wrapped into another (regression: Weight(2^32+1) ran as weight 1).
func TestOutcomeWeightBeyondThirtyTwoBits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var routed error
	m := gendurable.FSM[counter]{Name: "heavy", Start: "a", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[counter]{
			"a": func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) {
				return gendurable.Next("b", c, gendurable.RateLimit("r"), gendurable.Weight(1<<32+1)), nil
			},
			"b": func(_ *gendurable.Ctx, c counter) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
		},
		Handle: func(_ *gendurable.Ctx, _ counter, err error) gendurable.Outcome {
			routed = err
			return gendurable.Stop(err)
		},
	}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m},
		RateLimits: map[string]gendurable.Rate{"r": {Allowed: 10, Period: time.Second}}})
	ctx := context.Background()
	r, err := cl.Insert(ctx, m.With(counter{}), nil)
	require.NoError(t, err)
	durabletest.New(t, cl, nil).Drain(ctx)
	require.ErrorContains(t, routed, "option Weight")
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusFailed, in.Status)
}

// A signal by key validates the key as inserts do (regression: a key with a NUL or invalid
// UTF-8 reached Postgres and came back as a raw 22021; found by FuzzSignal).
func TestSignalByKeyValidatesTheKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, nil)
	for _, key := range []string{"k\x00", "k\xff", strings.Repeat("k", 513)} {
		_, err := cl.Signal(context.Background(), gendurable.ByKey("m", key), "go", nil)
		var ie *gendurable.InputError
		require.ErrorAs(t, err, &ie, "%q", key)
		require.Equal(t, "target", ie.Field)
	}
}

// List's Since is validated like ScheduledAt (regression: a time before 4714 BC came back as a
// raw 22008, and one far enough away was wrapped into another date and silently filtered by it).
func TestListSinceOutsideTimestamptz(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, nil)
	for _, since := range []time.Time{time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(1<<62, 0),
		time.Date(294277, time.January, 1, 0, 0, 0, 0, time.UTC)} {
		_, err := cl.List(context.Background(), &gendurable.ListOpts{Since: since})
		var ie *gendurable.InputError
		require.ErrorAs(t, err, &ie, "%v", since)
		require.Equal(t, "Since", ie.Field)
	}
	_, err := cl.List(context.Background(), &gendurable.ListOpts{Since: time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
}

// Retrying a finished instance whose correlation key a newer live instance holds is
// ErrWrongStatus naming the holder, and changes nothing (regression: a raw 23505 from the unique
// index).
func TestRetryWhenTheKeyIsTaken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	ctx := context.Background()
	old, err := cl.Insert(ctx, noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: "k"})
	require.NoError(t, err)
	require.NoError(t, cl.Cancel(ctx, old.ID, "replaced"))
	live, err := cl.Insert(ctx, noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: "k"})
	require.NoError(t, err)
	require.False(t, live.Duplicate)
	err = cl.Retry(ctx, old.ID, nil)
	require.ErrorIs(t, err, gendurable.ErrWrongStatus)
	require.ErrorContains(t, err, fmt.Sprint(live.ID))
	in, err := cl.Get(ctx, old.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusCancelled, in.Status)
	// Once the holder is finished, the retry goes through.
	require.NoError(t, cl.Cancel(ctx, live.ID, "done with it"))
	require.NoError(t, cl.Retry(ctx, old.ID, nil))
}
