package gendurable_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// A queue paused on one client is obeyed by every node within a second of the call returning,
// while inserts go on; resumed, it runs again, and nothing inserted meanwhile is lost. Three
// worker clients poll every 20ms (so a node that ignored the pause would pick within that), an
// operator client with no queues pauses and resumes, and an inserter adds a job every 5ms
// throughout. Checked from the workers' own pick events: no pick of the queue began more than a
// second after Pause returned, until Resume.
func TestPauseQueueIsObeyedByEveryNodeWithinASecond(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "pj", Queue: "pq", Perform: func(*gendurable.Ctx, int) error { return nil }}
	var mu sync.Mutex
	var picks []time.Time // when each pick of pq that claimed rows began
	hook := func(ev gendurable.Event) {
		if ev.Name == gendurable.EventSchedulerPicked && ev.Queue == "pq" {
			mu.Lock()
			picks = append(picks, ev.At.Add(-ev.Duration))
			mu.Unlock()
		}
	}
	for range 3 {
		start(t, e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, Hooks: []func(gendurable.Event){hook},
			Queues: map[string]gendurable.QueueConfig{"pq": {Concurrency: 4, PollInterval: 20 * time.Millisecond}}}))
	}
	op := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	start(t, op)

	var inserted atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := op.Insert(ctx, job.With(i), nil); err != nil {
				done <- err
				return
			}
			inserted.Add(1)
		}
	}()
	picksAfter := func(from, to time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, p := range picks {
			if p.After(from) && p.Before(to) {
				n++
			}
		}
		return n
	}
	for cycle := range 3 {
		require.NoError(t, op.Pause(ctx, gendurable.PauseTarget{Queue: "pq"}, "cycle"))
		paused := time.Now()
		// The pause is stored: every client reads it back.
		ps, err := op.Pauses(ctx)
		require.NoError(t, err)
		require.Len(t, ps, 1)
		require.Equal(t, gendurable.PauseInfo{Kind: "queue", Name: "pq", Reason: "cycle", By: ps[0].By, At: ps[0].At}, ps[0])
		// Rows keep coming in while nothing picks them.
		backlog := e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available'`)
		eventually(t, 10*time.Second, "inserts go on while paused", func() bool {
			return time.Since(paused) > 1500*time.Millisecond &&
				e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available'`) > backlog+50
		})
		resuming := time.Now()
		require.Zero(t, picksAfter(paused.Add(time.Second), resuming), "cycle %d: a node picked the paused queue more than 1s after Pause returned", cycle)
		require.NoError(t, op.Resume(ctx, gendurable.PauseTarget{Queue: "pq"}))
		eventually(t, 10*time.Second, "picks again after Resume", func() bool { return picksAfter(resuming, time.Now()) > 0 })
		ps, err = op.Pauses(ctx)
		require.NoError(t, err)
		require.Empty(t, ps)
	}
	close(stop)
	require.NoError(t, <-done)
	eventually(t, 30*time.Second, "every inserted job done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == int(inserted.Load())
	})
	require.Equal(t, int(inserted.Load()), e.count(t, `SELECT count(*) FROM {schema}.instances`))
}

// A paused machine's rows are left alone in a queue it shares with another machine, also by a
// client started after the pause (the pause is stored); inserts and signals to its instances are
// accepted meanwhile, and once resumed they run with every signal.
func TestPauseMachineSurvivesRestartsAndKeepsSignals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var ranA, ranB atomic.Int64
	a := gendurable.FSM[[]string]{Name: "a", Start: "wait", Queue: "shared", Steps: map[string]gendurable.StepFunc[[]string]{
		"wait": func(ctx *gendurable.Ctx, s []string) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "end", s), nil
		},
		"end": func(ctx *gendurable.Ctx, s []string) (gendurable.Outcome, error) {
			ranA.Add(1)
			for _, sg := range ctx.Inbox {
				s = append(s, sg.Name)
			}
			return gendurable.Done(s), nil
		},
	}}
	b := gendurable.Job[int]{Name: "b", Queue: "shared", Perform: func(*gendurable.Ctx, int) error { ranB.Add(1); return nil }}
	cfg := &gendurable.Config{Machines: []gendurable.Machine{a, b}, Queues: map[string]gendurable.QueueConfig{"shared": {PollInterval: 20 * time.Millisecond}}}
	w1 := e.client(t, cfg)
	require.NoError(t, w1.Start(ctx))

	// a's instances park on their signal first; then a is paused.
	ids := make([]int64, 5)
	for i := range ids {
		r, err := w1.Insert(ctx, a.With(nil), nil)
		require.NoError(t, err)
		ids[i] = r.ID
	}
	eventually(t, 10*time.Second, "a's instances parked", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'a' AND status = 'awaiting'`) == len(ids)
	})
	require.NoError(t, w1.Pause(ctx, gendurable.PauseTarget{Machine: "a"}, ""))
	// A worker started after the pause obeys it from its first pick.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, w1.Stop(stopCtx))
	cancel()
	w2 := e.client(t, cfg)
	start(t, w2)
	for _, id := range ids {
		_, err := w2.Signal(ctx, gendurable.ByID(id), "go", nil)
		require.NoError(t, err, "a signal to an instance of a paused machine is accepted")
	}
	more, err := w2.Insert(ctx, a.With(nil), nil)
	require.NoError(t, err, "an insert of a paused machine is accepted")
	for i := range 20 {
		_, err := w2.Insert(ctx, b.With(i), nil)
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "b runs beside the paused machine", func() bool { return ranB.Load() == 20 })
	// b's twenty jobs were picked after a's signalled rows became available (they were signalled
	// first), by picks that passed over them: a stayed paused.
	require.Zero(t, ranA.Load())
	require.Equal(t, len(ids)+1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'a' AND status = 'available'`))

	require.NoError(t, w2.Resume(ctx, gendurable.PauseTarget{Machine: "a"}))
	eventually(t, 10*time.Second, "a runs once resumed", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'a' AND status = 'done'`) == len(ids)
	})
	for _, id := range ids {
		inst, err := w2.Get(ctx, id)
		require.NoError(t, err)
		var path []string
		require.NoError(t, jsonUnmarshal(inst.Result, &path))
		require.Equal(t, []string{"go"}, path, "instance %d kept its signal across the pause", id)
	}
	require.NotZero(t, more.ID)
}

// Pausing and resuming name what they act on, and refuse what does not exist.
func TestPauseRefusesWhatItDoesNotKnow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "known", Queue: "kq", Perform: func(*gendurable.Ctx, int) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	start(t, cl)

	err := cl.Pause(ctx, gendurable.PauseTarget{Queue: "nosuch"}, "")
	require.ErrorIs(t, err, gendurable.ErrUnknownQueue)
	require.ErrorContains(t, err, `"nosuch"`)
	err = cl.Pause(ctx, gendurable.PauseTarget{Machine: "ghost"}, "")
	require.ErrorIs(t, err, gendurable.ErrUnknownMachine)
	require.ErrorContains(t, err, `"ghost"`)
	err = cl.Resume(ctx, gendurable.PauseTarget{Queue: "nosuch"})
	require.ErrorIs(t, err, gendurable.ErrUnknownQueue)
	var in *gendurable.InputError
	require.ErrorAs(t, cl.Pause(ctx, gendurable.PauseTarget{}, ""), &in)
	require.ErrorAs(t, cl.Pause(ctx, gendurable.PauseTarget{Queue: "kq", Machine: "known"}, ""), &in)
	require.ErrorIs(t, cl.Pause(ctx, gendurable.PauseTarget{Instance: 1 << 40}, ""), gendurable.ErrNotFound)

	// The machine's default queue and the machine are known; pausing twice is no error, and a
	// second reason replaces the first.
	require.NoError(t, cl.Pause(ctx, gendurable.PauseTarget{Queue: "kq"}, "first"))
	require.NoError(t, cl.Pause(ctx, gendurable.PauseTarget{Queue: "kq"}, "second"))
	require.NoError(t, cl.Pause(ctx, gendurable.PauseTarget{Machine: "known"}, ""))
	ps, err := cl.Pauses(ctx)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	require.Equal(t, "known", ps[0].Name)
	require.Equal(t, "machine", ps[0].Kind)
	require.Equal(t, "second", ps[1].Reason)
	require.NoError(t, cl.Resume(ctx, gendurable.PauseTarget{Queue: "kq"}))
	require.NoError(t, cl.Resume(ctx, gendurable.PauseTarget{Queue: "kq"}), "resuming what is not paused")

	// A finished instance cannot be paused.
	r, err := cl.Insert(ctx, job.With(1), nil)
	require.NoError(t, err)
	require.NoError(t, cl.Cancel(ctx, r.ID, ""))
	err = cl.Pause(ctx, gendurable.PauseTarget{Instance: r.ID}, "")
	require.ErrorIs(t, err, gendurable.ErrWrongStatus)
	require.True(t, errors.Is(err, gendurable.ErrWrongStatus))
}

// A paused instance is never claimed and holds no gate slot: the key's next instance runs in its
// place; once resumed, it runs.
func TestPausedInstanceHoldsNoGateSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var ran sync.Map
	job := gendurable.Job[string]{Name: "g", Queue: "gq", Perform: func(_ *gendurable.Ctx, name string) error {
		ran.Store(name, true)
		return nil
	}}
	limits := map[string]gendurable.ConcurrencyLimit{"acct": {Limit: 1}}
	ins := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, ConcurrencyLimits: limits})
	first, err := ins.Insert(ctx, job.With("first"), &gendurable.InsertOpts{ConcurrencyKey: "acct:1"})
	require.NoError(t, err)
	require.NoError(t, ins.Pause(ctx, gendurable.PauseTarget{Instance: first.ID}, ""))
	require.NoError(t, ins.Pause(ctx, gendurable.PauseTarget{Instance: first.ID}, ""), "pausing twice")
	_, err = ins.Insert(ctx, job.With("second"), &gendurable.InsertOpts{ConcurrencyKey: "acct:1", Priority: 9})
	require.NoError(t, err)

	w := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, ConcurrencyLimits: limits,
		Queues: map[string]gendurable.QueueConfig{"gq": {PollInterval: 20 * time.Millisecond}}})
	start(t, w)
	eventually(t, 10*time.Second, "the key's second instance runs", func() bool { _, ok := ran.Load("second"); return ok })
	eventually(t, 10*time.Second, "its slot given back", func() bool {
		return e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`) == 0
	})
	_, ok := ran.Load("first")
	require.False(t, ok, "the paused instance ran")
	d, err := w.Inspect(ctx, first.ID, nil)
	require.NoError(t, err)
	require.NotNil(t, d.PausedAt)
	require.Equal(t, gendurable.StatusAvailable, d.Instance.Status)

	require.NoError(t, w.Resume(ctx, gendurable.PauseTarget{Instance: first.ID}))
	eventually(t, 10*time.Second, "the resumed instance runs", func() bool { _, ok := ran.Load("first"); return ok })
	d, err = w.Inspect(ctx, first.ID, nil)
	require.NoError(t, err)
	require.Nil(t, d.PausedAt)
}
