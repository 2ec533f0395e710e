package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// A machine's graph: its live instances by step and status, and the transitions its recorded
// paths took (a loop included), read from a run against a real Postgres.
func TestMachineGraphCountsLiveStepsAndTransitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	type st struct {
		Loops int `json:"loops"`
	}
	m := gendurable.FSM[st]{Name: "flow", Start: "a", Queue: "flows", Steps: map[string]gendurable.StepFunc[st]{
		"a": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) { return gendurable.Next("b", s), nil },
		"b": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) {
			if s.Loops > 0 {
				s.Loops--
				return gendurable.Next("b", s), nil
			}
			return gendurable.Next("wait", s), nil
		},
		"wait": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "end", s), nil
		},
		"end":    func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
		"unused": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"flows": {PollInterval: 20 * time.Millisecond}}})
	start(t, cl)
	var ids []int64
	for i := range 10 {
		r, err := cl.Insert(ctx, m.With(st{Loops: i % 3}), nil)
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	eventually(t, 10*time.Second, "all parked", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting'`) == 10
	})
	for _, id := range ids[:6] {
		_, err := cl.Signal(ctx, gendurable.ByID(id), "go", nil)
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "six done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 6
	})
	g, err := cl.MachineGraph(ctx, "flow", 0)
	require.NoError(t, err)
	require.Equal(t, int64(10), g.Paths)
	var names []string
	for _, s := range g.Steps {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"a", "b", "wait", "end", "unused"}, names, "the first step, a walk of the transitions, then the rest")
	require.Equal(t, int64(10), g.Steps[0].Starts)
	// A parked instance is at the step it waits to run: the four still parked are at end.
	require.Equal(t, map[gendurable.Status]int64{gendurable.StatusAwaiting: 4}, g.Steps[3].Live)
	require.Empty(t, g.Steps[2].Live)
	edges := map[[2]string]int64{}
	for _, ed := range g.Edges {
		edges[[2]string{ed.From, ed.To}] = ed.Count
	}
	// Loops: instances i%3 = 1 loop once, 2 twice: 3 + 3*2 = 9 b→b (i = 1,4,7 once; 2,5,8 twice).
	// wait → end: six taken and done, four parked on their way there.
	require.Equal(t, map[[2]string]int64{{"a", "b"}: 10, {"b", "b"}: 9, {"b", "wait"}: 10, {"wait", "end"}: 10}, edges)
	require.Empty(t, g.Steps[4].Live)

	_, err = cl.MachineGraph(ctx, "nosuch", 0)
	require.ErrorIs(t, err, gendurable.ErrUnknownMachine)
	_, err = cl.MachineGraph(ctx, "flow", -1)
	var in *gendurable.InputError
	require.ErrorAs(t, err, &in)

	names, err2 := cl.Machines(ctx)
	require.NoError(t, err2)
	require.Equal(t, []string{"flow"}, names)
}

// Finished instances per queue and minute, over complete minutes, by the database clock.
func TestFinishedByMinute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "j", Queue: "q", Perform: func(*gendurable.Ctx, int) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	for i := range 5 {
		r, err := cl.Insert(ctx, job.With(i), nil)
		require.NoError(t, err)
		status := "done"
		if i == 4 {
			status = "failed"
		}
		e.exec(t, `UPDATE {schema}.instances SET status = $2::text::`+`"`+e.schema+`".status, finalized_at = date_trunc('minute', now()) - interval '3 minutes' + interval '10 seconds'
			WHERE id = $1`, r.ID, status)
	}
	counts, cur, err := cl.FinishedByMinute(ctx, 10)
	require.NoError(t, err)
	require.Len(t, counts, 1)
	require.Equal(t, gendurable.MinuteCount{Queue: "q", Minute: cur.Add(-3 * time.Minute), Done: 4, Failed: 1}, counts[0])
	counts, _, err = cl.FinishedByMinute(ctx, 2)
	require.NoError(t, err)
	require.Empty(t, counts, "outside the window")
	_, _, err = cl.FinishedByMinute(ctx, 61)
	var in *gendurable.InputError
	require.ErrorAs(t, err, &in)
}
