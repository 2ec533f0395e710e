package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// A parent cancelled while it joins, its children still running: retrying it is refused (its
// join would read them unfinished, and they would settle nothing); once they have finished, the
// retry runs the join, which sees every child finished.
func TestRetryOfAParentWithLiveChildrenIsRefusedUntilTheyFinish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	release := make(chan struct{})
	kid := gendurable.Job[int]{Name: "kid", Queue: "kids", Perform: func(*gendurable.Ctx, int) error {
		<-release
		return nil
	}}
	seen := make(chan []gendurable.Status, 1)
	parent := gendurable.FSM[int]{Name: "parent", Start: "fan", Queue: "parents", Steps: map[string]gendurable.StepFunc[int]{
		"fan": func(_ *gendurable.Ctx, n int) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{{Input: kid.With(1)}, {Input: kid.With(2)}}, "join", n), nil
		},
		"join": func(ctx *gendurable.Ctx, n int) (gendurable.Outcome, error) {
			var st []gendurable.Status
			for _, c := range ctx.Children {
				st = append(st, c.Status)
			}
			seen <- st
			return gendurable.Done(n), nil
		},
	}}
	// The children run on a worker of their own; the parent's queue on another.
	kids := e.client(t, &gendurable.Config{Name: "kids", Machines: []gendurable.Machine{kid, parent},
		Queues: map[string]gendurable.QueueConfig{"kids": {PollInterval: 20 * time.Millisecond}}})
	start(t, kids)
	cl := e.client(t, &gendurable.Config{Name: "parents", Machines: []gendurable.Machine{kid, parent},
		Queues: map[string]gendurable.QueueConfig{"parents": {PollInterval: 20 * time.Millisecond}}})
	start(t, cl)
	r, err := cl.Insert(ctx, parent.With(7), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "both children run", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND status = 'executing'`, r.ID) == 2
	})
	require.NoError(t, cl.Cancel(ctx, r.ID, "operator"))
	err = cl.Retry(ctx, r.ID, nil)
	require.ErrorIs(t, err, gendurable.ErrWrongStatus)
	require.ErrorContains(t, err, "2 children still live")
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusCancelled, in.Status, "the refused retry changed nothing")

	close(release)
	eventually(t, 10*time.Second, "the children finish", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND status = 'done'`, r.ID) == 2
	})
	require.NoError(t, cl.Retry(ctx, r.ID, nil))
	select {
	case st := <-seen:
		require.Equal(t, []gendurable.Status{gendurable.StatusDone, gendurable.StatusDone}, st)
	case <-time.After(10 * time.Second):
		t.Fatal("the retried join did not run")
	}
}
