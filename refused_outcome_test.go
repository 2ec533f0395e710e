package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// An outcome the database refuses for its content (here a CHECK the test adds to its schema
// refuses the state a step commits) is applied on its own, and, refused again, fails its instance
// with the database's error recorded and the stored state kept; the other outcomes of its batch
// commit. A child failed that way settles its parent's join like any finished child.
func TestRefusedOutcomeFailsTheInstanceAndSettlesItsParent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `ALTER TABLE {schema}.instances ADD CONSTRAINT refuse_poison CHECK (state->>'poison' IS NULL)`)
	type flags map[string]bool
	child := gendurable.FSM[flags]{Name: "child", Start: "go", Steps: map[string]gendurable.StepFunc[flags]{
		"go": func(_ *gendurable.Ctx, s flags) (gendurable.Outcome, error) {
			if s["bad"] {
				return gendurable.Next("after", flags{"poison": true}), nil
			}
			return gendurable.Next("after", s), nil
		},
		"after": func(*gendurable.Ctx, flags) (gendurable.Outcome, error) { return gendurable.Done("ok"), nil },
	}}
	parent := gendurable.FSM[int]{Name: "parent", Start: "spawn", Steps: map[string]gendurable.StepFunc[int]{
		"spawn": func(*gendurable.Ctx, int) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{
				{Input: child.With(flags{"bad": true})}, {Input: child.With(flags{})}, {Input: child.With(flags{})},
			}, "join", 0), nil
		},
		"join": func(ctx *gendurable.Ctx, _ int) (gendurable.Outcome, error) {
			failed := 0
			for _, c := range ctx.Children {
				if c.Status == gendurable.StatusFailed {
					failed++
				}
			}
			return gendurable.Done(map[string]int{"children": len(ctx.Children), "failed": failed}), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{parent, child},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}}})
	start(t, cl)
	ctx := context.Background()
	r, err := cl.Insert(ctx, parent.With(0), nil)
	require.NoError(t, err)
	res, err := cl.Await(ctx, r.ID, 30*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, res.Status, "the parent joined")
	var joined map[string]int
	require.NoError(t, res.Decode(&joined))
	require.Equal(t, map[string]int{"children": 3, "failed": 1}, joined)

	var bad *gendurable.Instance
	for _, c := range mustChildren(t, e, r.ID) {
		in, err := cl.Get(ctx, c)
		require.NoError(t, err)
		if in.Status == gendurable.StatusFailed {
			bad = in
			continue
		}
		require.Equal(t, gendurable.StatusDone, in.Status)
	}
	require.NotNil(t, bad)
	require.Equal(t, "go", bad.Step, "the refused Next moved nothing")
	require.JSONEq(t, `{"bad": true}`, string(bad.State), "the stored state is kept")
	require.NotEmpty(t, bad.Errors)
	last := bad.Errors[len(bad.Errors)-1]
	require.Equal(t, "rejected", last.Kind)
	require.Contains(t, last.Error, "refuse_poison")
}

// mustChildren returns the ids of a parent's children.
func mustChildren(t *testing.T, e *env, parent int64) []int64 {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), expand(`SELECT id FROM {schema}.instances WHERE parent_id = $1 ORDER BY id`, e.schema), parent)
	require.NoError(t, err)
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}
