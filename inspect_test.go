package gendurable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

type chore struct {
	N     int  `json:"n"`
	Fails bool `json:"fails,omitempty"`
}

func choreJob(name, queue string) gendurable.Job[chore] {
	return gendurable.Job[chore]{
		Name: name, Queue: queue, MaxAttempts: 1,
		Perform: func(ctx *gendurable.Ctx, c chore) error {
			if c.Fails {
				return errors.New("chore failed")
			}
			return nil
		},
	}
}

// insertN inserts n chores and returns their ids, in order.
func insertN(t *testing.T, cl *gendurable.Client, job gendurable.Job[chore], n int, opts *gendurable.InsertOpts) []int64 {
	t.Helper()
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(chore{N: i}), Opts: opts}
	}
	res, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
	ids := make([]int64, n)
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

func TestQueueStatsCountsByQueueAndStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := choreJob("chore", "a")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	ctx := context.Background()

	// Queue a: 3 due (2h, 1h and 30min late), 2 scheduled for later, 1 executing, 2 awaiting,
	// 1 joining, 4 done, 1 failed. Queue b: 1 done.
	due := insertN(t, cl, job, 3, nil)
	insertN(t, cl, job, 2, &gendurable.InsertOpts{In: time.Hour})
	moved := insertN(t, cl, job, 9, nil)
	b := insertN(t, cl, job, 1, &gendurable.InsertOpts{Queue: "b"})
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() - ($2 * interval '1 minute') WHERE id = $1`, due[0], 120)
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() - ($2 * interval '1 minute') WHERE id = $1`, due[1], 60)
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() - ($2 * interval '1 minute') WHERE id = $1`, due[2], 30)
	e.exec(t, `UPDATE {schema}.instances SET status = 'executing', locked_by = 'w#1', locked_until = now() + interval '1 minute' WHERE id = $1`, moved[0])
	e.exec(t, `UPDATE {schema}.instances SET status = 'awaiting', await_names = '{go}' WHERE id = ANY($1)`, moved[1:3])
	e.exec(t, `UPDATE {schema}.instances SET status = 'joining' WHERE id = $1`, moved[3])
	e.exec(t, `UPDATE {schema}.instances SET status = 'done', finalized_at = now() WHERE id = ANY($1)`, []int64{moved[4], moved[5], moved[6], moved[7], b[0]})
	e.exec(t, `UPDATE {schema}.instances SET status = 'failed', finalized_at = now() WHERE id = $1`, moved[8])

	stats, err := cl.QueueStats(ctx, nil)
	require.NoError(t, err)
	require.Len(t, stats, 2)
	a := stats[0]
	require.Equal(t, "a", a.Queue)
	require.Equal(t, map[gendurable.Status]int64{
		gendurable.StatusAvailable: 5, gendurable.StatusExecuting: 1, gendurable.StatusAwaiting: 2,
		gendurable.StatusJoining: 1, gendurable.StatusDone: 4, gendurable.StatusFailed: 1, gendurable.StatusCancelled: 0,
	}, a.Counts)
	require.Equal(t, int64(3), a.Runnable)
	require.GreaterOrEqual(t, a.OldestRunnable, 2*time.Hour)
	require.Less(t, a.OldestRunnable, 2*time.Hour+time.Minute)
	require.Equal(t, gendurable.QueueStats{Queue: "b", Counts: map[gendurable.Status]int64{
		gendurable.StatusAvailable: 0, gendurable.StatusExecuting: 0, gendurable.StatusAwaiting: 0,
		gendurable.StatusJoining: 0, gendurable.StatusDone: 1, gendurable.StatusFailed: 0, gendurable.StatusCancelled: 0,
	}}, stats[1])

	// The index-backed statuses only: queue b has none of them.
	stats, err = cl.QueueStats(ctx, &gendurable.QueueStatsOpts{
		Statuses: []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting, gendurable.StatusAvailable}})
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.Equal(t, map[gendurable.Status]int64{gendurable.StatusAvailable: 5, gendurable.StatusExecuting: 1}, stats[0].Counts)
	require.Equal(t, int64(3), stats[0].Runnable)

	// One of the others: no lag is measured without StatusAvailable.
	stats, err = cl.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: []gendurable.Status{gendurable.StatusDone}})
	require.NoError(t, err)
	require.Equal(t, []gendurable.QueueStats{
		{Queue: "a", Counts: map[gendurable.Status]int64{gendurable.StatusDone: 4}},
		{Queue: "b", Counts: map[gendurable.Status]int64{gendurable.StatusDone: 1}},
	}, stats)

	// Nothing due: no lag.
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() + interval '1 hour' WHERE id = ANY($1)`, due)
	stats, err = cl.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: []gendurable.Status{gendurable.StatusAvailable}})
	require.NoError(t, err)
	require.Equal(t, []gendurable.QueueStats{{Queue: "a", Counts: map[gendurable.Status]int64{gendurable.StatusAvailable: 5}}}, stats)

	_, err = cl.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: []gendurable.Status{"sleeping"}})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
}

func TestStuckFindsUnknownLimitsMachinesStepsAndOverdueAwaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	known := choreJob("known", "q")
	missing := choreJob("missing", "q") // never registered
	cl := e.client(t, &gendurable.Config{
		Machines:   []gendurable.Machine{known},
		Queues:     map[string]gendurable.QueueConfig{"q": {}},
		RateLimits: map[string]gendurable.Rate{"api": {Allowed: 10, Period: time.Second}},
	})
	ctx := context.Background()

	ghost := insertN(t, cl, known, 1, &gendurable.InsertOpts{RateLimit: "ghost:t1"})
	ghost = append(ghost, insertN(t, cl, known, 1, &gendurable.InsertOpts{RateLimit: "ghost:t2"})...)
	insertN(t, cl, known, 1, &gendurable.InsertOpts{RateLimit: "api:t1"}) // configured
	ghostElsewhere := insertN(t, cl, known, 1, &gendurable.InsertOpts{RateLimit: "ghost", Queue: "other"})
	unknown := insertN(t, cl, missing, 3, nil)
	insertN(t, cl, missing, 1, &gendurable.InsertOpts{Queue: "elsewhere"}) // a queue this client does not work
	doneUnknown := insertN(t, cl, missing, 1, nil)
	gone := insertN(t, cl, known, 1, nil)
	parked := insertN(t, cl, known, 3, nil)
	e.exec(t, `UPDATE {schema}.instances SET step = 'gone' WHERE id = $1`, gone[0])
	e.exec(t, `UPDATE {schema}.instances SET status = 'done', finalized_at = now() WHERE id = $1`, doneUnknown[0])
	e.exec(t, `UPDATE {schema}.instances SET status = 'awaiting', await_names = '{go}',
	             await_deadline = now() - ($2 * interval '1 minute') WHERE id = $1`, parked[0], 10)
	e.exec(t, `UPDATE {schema}.instances SET status = 'awaiting', await_names = '{go}',
	             await_deadline = now() - ($2 * interval '1 minute') WHERE id = $1`, parked[1], 5)
	e.exec(t, `UPDATE {schema}.instances SET status = 'awaiting', await_names = '{go}',
	             await_deadline = now() + interval '1 hour' WHERE id = $1`, parked[2])
	var deadline time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT await_deadline FROM {schema}.instances WHERE id = $1`, e.schema),
		parked[0]).Scan(&deadline))
	scheduled := func(id int64) time.Time {
		in, err := cl.Get(ctx, id)
		require.NoError(t, err)
		return in.ScheduledAt
	}

	got, err := cl.Stuck(ctx)
	require.NoError(t, err)
	// Times are compared as instants (Equal), not as values.
	require.Len(t, got, 5, "%+v", got)
	require.Equal(t, gendurable.StuckGroup{Kind: gendurable.StuckAwaitOverdue, Queue: "q", Machine: "known",
		Count: 2, Oldest: got[0].Oldest, FirstID: parked[0]}, got[0])
	require.True(t, deadline.Equal(got[0].Oldest))
	require.Equal(t, gendurable.StuckGroup{Kind: gendurable.StuckUnknownMachine, Queue: "q", Machine: "missing",
		Count: 3, Oldest: got[1].Oldest, FirstID: unknown[0]}, got[1])
	require.True(t, scheduled(unknown[0]).Equal(got[1].Oldest))
	require.Equal(t, gendurable.StuckGroup{Kind: gendurable.StuckUnknownRateLimit, Queue: "other", RateLimit: "ghost",
		Count: 1, Oldest: got[2].Oldest, FirstID: ghostElsewhere[0]}, got[2])
	require.Equal(t, gendurable.StuckGroup{Kind: gendurable.StuckUnknownRateLimit, Queue: "q", RateLimit: "ghost",
		Count: 2, Oldest: got[3].Oldest, FirstID: ghost[0]}, got[3])
	require.True(t, scheduled(ghost[0]).Equal(got[3].Oldest))
	require.Equal(t, gendurable.StuckGroup{Kind: gendurable.StuckUnknownStep, Queue: "q", Machine: "known", Step: "gone",
		Count: 1, Oldest: got[4].Oldest, FirstID: gone[0]}, got[4])

	// A client that registers no machine and works no queue, with no limits: every rate-limited
	// row stalls there; machines are not checked.
	web := e.client(t, &gendurable.Config{Name: "web"})
	got, err = web.Stuck(ctx)
	require.NoError(t, err)
	var kinds []gendurable.StuckKind
	var rated int64
	for _, g := range got {
		kinds = append(kinds, g.Kind)
		if g.Kind == gendurable.StuckUnknownRateLimit {
			rated += g.Count
		}
	}
	require.Equal(t, []gendurable.StuckKind{gendurable.StuckAwaitOverdue, gendurable.StuckUnknownRateLimit,
		gendurable.StuckUnknownRateLimit, gendurable.StuckUnknownRateLimit}, kinds)
	require.Equal(t, int64(4), rated, "ghost in q and other, and api in q")
}

func TestInspectPagesInboxAndChildren(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	child := choreJob("child", "kids")
	parent := gendurable.FSM[chore]{
		Name: "parent", Start: "spawn", Queue: "parents",
		Steps: map[string]gendurable.StepFunc[chore]{
			"spawn": func(ctx *gendurable.Ctx, c chore) (gendurable.Outcome, error) {
				kids := make([]gendurable.Child, 5)
				for i := range kids {
					kids[i] = gendurable.Child{Input: child.With(chore{N: i, Fails: i == 1})}
				}
				return gendurable.Spawn(kids, "join", c), nil
			},
			"join": func(ctx *gendurable.Ctx, c chore) (gendurable.Outcome, error) { return gendurable.Done(c), nil },
		},
	}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{parent, child}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()

	p, err := cl.Insert(ctx, parent.With(chore{}), nil)
	require.NoError(t, err)
	_, err = kit.TryDrain(ctx, &durabletest.DrainOpts{Queues: []string{"parents"}})
	require.NoError(t, err)
	// Two of the five children run (the second fails); three stay available.
	_, err = kit.TryDrain(ctx, &durabletest.DrainOpts{Queues: []string{"kids"}, MaxSteps: 2})
	require.ErrorIs(t, err, durabletest.ErrMaxSteps)
	for i := range 5 {
		var payload any
		if i == 2 {
			payload = map[string]int{"i": i}
		}
		_, err := cl.Signal(ctx, gendurable.ByID(p.ID), "s"+string(rune('1'+i)), payload)
		require.NoError(t, err)
	}

	d, err := cl.Inspect(ctx, p.ID, nil)
	require.NoError(t, err)
	require.Equal(t, p.ID, d.Instance.ID)
	require.Equal(t, gendurable.StatusJoining, d.Instance.Status)
	require.Equal(t, "join", d.Instance.Step)
	require.Equal(t, int64(5), d.InboxSize)
	require.Equal(t, []string{"s1", "s2", "s3", "s4", "s5"}, names(d.Inbox))
	require.Nil(t, d.Inbox[0].Payload)
	require.JSONEq(t, `{"i": 2}`, string(d.Inbox[2].Payload))
	require.False(t, d.Inbox[0].At.IsZero())
	require.Equal(t, map[gendurable.Status]int64{gendurable.StatusDone: 1, gendurable.StatusFailed: 1,
		gendurable.StatusAvailable: 3}, d.ChildCounts)
	require.Len(t, d.Children, 5)
	kids := d.Children
	for i, k := range kids {
		require.Equal(t, "child", k.Machine)
		require.Equal(t, gendurable.JobStep, k.Step)
		require.Equal(t, "kids", k.Queue)
		require.Equal(t, 1, k.Wave)
		if i > 0 {
			require.Greater(t, k.ID, kids[i-1].ID)
		}
	}
	require.Equal(t, gendurable.StatusDone, kids[0].Status)
	require.Equal(t, 1, kids[0].Attempt)
	require.Equal(t, "", kids[0].Error)
	require.Equal(t, gendurable.StatusFailed, kids[1].Status)
	require.Equal(t, "chore failed", kids[1].Error)
	require.Equal(t, gendurable.StatusAvailable, kids[2].Status)
	require.Equal(t, 0, kids[2].Attempt)

	// Pages: by id, after the last one seen.
	d, err = cl.Inspect(ctx, p.ID, &gendurable.InspectOpts{InboxLimit: 2, ChildrenLimit: 3})
	require.NoError(t, err)
	require.Equal(t, []string{"s1", "s2"}, names(d.Inbox))
	require.Equal(t, int64(5), d.InboxSize)
	require.Equal(t, []int64{kids[0].ID, kids[1].ID, kids[2].ID}, childIDs(d.Children))
	d, err = cl.Inspect(ctx, p.ID, &gendurable.InspectOpts{InboxAfter: d.Inbox[1].ID, InboxLimit: 2,
		ChildrenAfter: d.Children[2].ID, ChildrenLimit: 3})
	require.NoError(t, err)
	require.Equal(t, []string{"s3", "s4"}, names(d.Inbox))
	require.Equal(t, []int64{kids[3].ID, kids[4].ID}, childIDs(d.Children))
	require.Equal(t, int64(3), d.ChildCounts[gendurable.StatusAvailable], "counts cover every child, not the page")

	// A child: no inbox, no children.
	d, err = cl.Inspect(ctx, kids[0].ID, nil)
	require.NoError(t, err)
	require.Equal(t, &p.ID, d.Instance.ParentID)
	require.Empty(t, d.Inbox)
	require.Empty(t, d.Children)
	require.Empty(t, d.ChildCounts)
	require.Zero(t, d.InboxSize)

	_, err = cl.Inspect(ctx, 1<<40, nil)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
	_, err = cl.Inspect(ctx, p.ID, &gendurable.InspectOpts{InboxLimit: gendurable.MaxInspectLimit + 1})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	_, err = cl.Inspect(ctx, p.ID, &gendurable.InspectOpts{ChildrenLimit: -1})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
}

func childIDs(cs []gendurable.ChildSummary) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func TestThroughputCountsRecentlyFinishedByQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := choreJob("chore", "a")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	ctx := context.Background()

	a := insertN(t, cl, job, 7, nil)
	b := insertN(t, cl, job, 2, &gendurable.InsertOpts{Queue: "b"})
	finish := func(status string, ago time.Duration, ids ...int64) {
		e.exec(t, `UPDATE {schema}.instances SET status = $2::text::{schema}.status,
		             finalized_at = now() - ($3::bigint * interval '1 millisecond') WHERE id = ANY($1)`,
			ids, status, ago.Milliseconds())
	}
	finish("done", 10*time.Second, a[0], a[1], a[2])
	finish("failed", 20*time.Second, a[3])
	finish("cancelled", 30*time.Second, a[4])
	finish("done", 5*time.Minute, a[5]) // before the window
	finish("failed", time.Second, b[0]) // a[6] and b[1] are still available

	got, err := cl.Throughput(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, []gendurable.QueueThroughput{
		{Queue: "a", Done: 3, Failed: 1, Cancelled: 1},
		{Queue: "b", Failed: 1},
	}, got)

	got, err = cl.Throughput(ctx, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(4), got[0].Done)

	got, err = cl.Throughput(ctx, 15*time.Second)
	require.NoError(t, err)
	require.Equal(t, []gendurable.QueueThroughput{{Queue: "a", Done: 3}, {Queue: "b", Failed: 1}}, got)

	for _, w := range []time.Duration{-time.Second, 2 * time.Hour} {
		_, err = cl.Throughput(ctx, w)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%v", w)
	}
}
