package gendurable_test

import (
	"context"
	"testing"

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
