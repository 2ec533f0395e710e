package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// approval is a request/response machine: ask, await "approved" or "rejected" (or time out),
// then finish with what was seen.
type approval struct {
	Seen    []string `json:"seen,omitempty"`
	Inbox   []string `json:"inbox,omitempty"`
	Payload string   `json:"payload,omitempty"`
	Timeout bool     `json:"timeout,omitempty"`
}

func names(sigs []gendurable.Signal) []string {
	out := []string{}
	for _, s := range sigs {
		out = append(out, s.Name)
	}
	return out
}

func approvalFSM(timeout time.Duration) gendurable.FSM[approval] {
	return gendurable.FSM[approval]{
		Name: "approval", Start: "ask", Queue: "sig",
		Steps: map[string]gendurable.StepFunc[approval]{
			"ask": func(ctx *gendurable.Ctx, a approval) (gendurable.Outcome, error) {
				var opts []gendurable.OutcomeOption
				if timeout > 0 {
					opts = append(opts, gendurable.Timeout(timeout))
				}
				return gendurable.Await([]string{"approved", "rejected"}, "decide", a, opts...), nil
			},
			"decide": func(ctx *gendurable.Ctx, a approval) (gendurable.Outcome, error) {
				a.Seen, a.Inbox = names(ctx.Awaited), names(ctx.Inbox)
				a.Timeout = len(ctx.Awaited) == 0
				if len(ctx.Awaited) > 0 {
					var p struct{ By string }
					if err := ctx.Awaited[0].Decode(&p); err != nil {
						return gendurable.Outcome{}, err
					}
					a.Payload = p.By
				}
				return gendurable.Done(a), nil
			},
		},
	}
}

func TestAwaitAndSignalThroughDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := approvalFSM(0)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()

	a, err := cl.Insert(ctx, m.With(approval{}), &gendurable.InsertOpts{CorrelationKey: "req-1"})
	require.NoError(t, err)
	kit.Drain(ctx)
	in := kit.RequireAwaiting(ctx, a.ID, "approved", "rejected")
	require.Equal(t, "decide", in.Step)

	// A signal it does not await is stored but does not wake it.
	r, err := cl.Signal(ctx, gendurable.ByID(a.ID), "note", map[string]string{"text": "fyi"})
	require.NoError(t, err)
	require.False(t, r.Woke)
	require.Equal(t, a.ID, r.InstanceID)
	require.Equal(t, 0, kit.Drain(ctx).Steps)
	kit.RequireAwaiting(ctx, a.ID)

	// By key: wakes it.
	r, err = cl.Signal(ctx, gendurable.ByKey("approval", "req-1"), "approved", map[string]string{"By": "ada"})
	require.NoError(t, err)
	require.True(t, r.Woke)
	kit.Drain(ctx)
	var got approval
	kit.RequireDone(ctx, a.ID, &got)
	require.Equal(t, []string{"approved"}, got.Seen)
	require.Equal(t, []string{"note", "approved"}, got.Inbox, "the whole inbox, in arrival order")
	require.Equal(t, "ada", got.Payload)
	require.False(t, got.Timeout)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.signals`), "a terminal outcome clears the inbox")

	// A finished or missing target: ErrNoTarget, nothing stored.
	_, err = cl.Signal(ctx, gendurable.ByID(a.ID), "approved", nil)
	require.ErrorIs(t, err, gendurable.ErrNoTarget)
	_, err = cl.Signal(ctx, gendurable.ByKey("approval", "req-1"), "approved", nil)
	require.ErrorIs(t, err, gendurable.ErrNoTarget)
	_, err = cl.Signal(ctx, gendurable.ByID(1<<40), "approved", nil)
	require.ErrorIs(t, err, gendurable.ErrNoTarget)
	_, err = cl.Signal(ctx, gendurable.ByKey("other-machine", "req-1"), "approved", nil)
	require.ErrorIs(t, err, gendurable.ErrNoTarget, "keys are scoped by machine")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.signals`))

	// A signal that arrives before the instance awaits waits in the inbox and wakes it at once.
	b, err := cl.Insert(ctx, m.With(approval{}), nil)
	require.NoError(t, err)
	_, err = cl.Signal(ctx, gendurable.ByID(b.ID), "rejected", map[string]string{"By": "bob"})
	require.NoError(t, err)
	res := kit.Drain(ctx)
	require.Equal(t, 2, res.Steps)
	kit.RequireDone(ctx, b.ID, &got)
	require.Equal(t, []string{"rejected"}, got.Seen)
}

func TestSignalBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := approvalFSM(0)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, MaxPayloadBytes: 100})
	ctx := context.Background()
	a, err := cl.Insert(ctx, m.With(approval{}), nil)
	require.NoError(t, err)
	for _, c := range []struct {
		target  gendurable.Target
		name    string
		payload any
		field   string
		is      error
	}{
		{gendurable.Target{}, "x", nil, "target", nil},
		{gendurable.ByID(-1), "x", nil, "target", nil},
		{gendurable.ByKey("approval", ""), "x", nil, "target", nil},
		{gendurable.ByKey("", "k"), "x", nil, "target", nil},
		{gendurable.ByID(a.ID), "", nil, "name", nil},
		{gendurable.ByID(a.ID), strings.Repeat("n", 129), nil, "name", nil},
		{gendurable.ByID(a.ID), "tab\tname", nil, "name", nil},
		{gendurable.ByID(a.ID), "x", strings.Repeat("p", 200), "payload", gendurable.ErrPayloadTooLarge},
		{gendurable.ByID(a.ID), "x", func() {}, "payload", gendurable.ErrInvalidPayload},
		{gendurable.ByID(a.ID), "x", "nul\x00", "payload", gendurable.ErrInvalidPayload},
	} {
		_, err := cl.Signal(ctx, c.target, c.name, c.payload)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, c.field)
		var ie *gendurable.InputError
		require.True(t, errors.As(err, &ie))
		require.Equal(t, c.field, ie.Field)
		if c.is != nil {
			require.ErrorIs(t, err, c.is)
		}
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.signals`))
}

func TestBadAwaitRoutesToHandle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bad := func(names []string, next string, opts ...gendurable.OutcomeOption) gendurable.StepFunc[approval] {
		return func(*gendurable.Ctx, approval) (gendurable.Outcome, error) {
			return gendurable.Await(names, next, approval{Payload: "changed"}, opts...), nil
		}
	}
	m := gendurable.FSM[approval]{Name: "badawait", Start: "empty", MaxAttempts: 1,
		Steps: map[string]gendurable.StepFunc[approval]{
			"empty":     bad(nil, "empty"),
			"dup":       bad([]string{"a", "a"}, "empty"),
			"blank":     bad([]string{"a", ""}, "empty"),
			"long":      bad([]string{strings.Repeat("x", 200)}, "empty"),
			"nostep":    bad([]string{"a"}, "nowhere"),
			"notimeout": bad([]string{"a"}, "empty", gendurable.Timeout(0)),
			"after":     bad([]string{"a"}, "empty", gendurable.After(time.Second)),
		}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	ids := map[string]int64{}
	for s := range m.Steps {
		mm := m
		mm.Start = s
		r, err := cl.Insert(ctx, mm.With(approval{}), nil)
		require.NoError(t, err)
		ids[s] = r.ID
	}
	kit.Drain(ctx)
	for s, id := range ids {
		in := kit.RequireFailed(ctx, id)
		require.Equal(t, "outcome", in.Errors[0].Kind, s)
		require.JSONEq(t, `{}`, string(in.State), "%s: the committed state is unchanged", s)
		require.Nil(t, in.AwaitNames, s)
	}
}

// counted is the state of the race test's machine: it counts the signals it consumed.
type counted struct {
	N     int `json:"n"`
	Steps int `json:"steps"`
}

func TestNoLostWakeupsUnderRacingSignals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	instances, perInstance := oracle.Size(800, 3000), 4
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GD_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed=%d", seed)
	var executions atomic.Int64
	m := gendurable.FSM[counted]{
		Name: "counter", Start: "park", Queue: "race",
		Steps: map[string]gendurable.StepFunc[counted]{
			"park": func(ctx *gendurable.Ctx, c counted) (gendurable.Outcome, error) {
				executions.Add(1)
				c.Steps++
				return gendurable.Await([]string{"go"}, "count", c), nil
			},
			"count": func(ctx *gendurable.Ctx, c counted) (gendurable.Outcome, error) {
				executions.Add(1)
				c.Steps++
				c.N += len(ctx.Awaited)
				if c.N >= perInstance {
					return gendurable.Done(c), nil
				}
				return gendurable.Await([]string{"go"}, "count", c), nil
			},
		},
	}
	// The poll interval is an hour: only deliveries, the park's re-check and local wakes can
	// make a parked instance runnable. A lost wakeup strands it.
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, PollInterval: time.Hour,
		Queues: map[string]gendurable.QueueConfig{"race": {Concurrency: 32}}})
	start(t, cl)
	ctx := context.Background()
	params := make([]gendurable.InsertManyParams, instances)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: m.With(counted{})}
	}
	res, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)

	// Every instance gets its signals at random moments, from 8 senders at once: most land while
	// the instance is running a step or parking.
	type send struct {
		id int64
		at time.Duration
	}
	var sends []send
	rng := rand.New(rand.NewPCG(seed, 2))
	for _, r := range res {
		for range perInstance {
			sends = append(sends, send{r.ID, time.Duration(rng.IntN(1500)) * time.Millisecond})
		}
	}
	slices.SortFunc(sends, func(a, b send) int { return int(a.at - b.at) })
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(sends); i += 8 {
				if d := time.Until(t0.Add(sends[i].at)); d > 0 {
					time.Sleep(d)
				}
				if _, err := cl.Signal(ctx, gendurable.ByID(sends[i].id), "go", nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, 60*time.Second, "every instance done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == instances
	})
	// Exactly as many advances as signals, for every instance; none stranded; inboxes empty.
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE (result->>'n')::int <> $1`, perInstance))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances i WHERE status = 'awaiting'
		AND EXISTS (SELECT 1 FROM {schema}.signals s WHERE s.instance_id = i.id AND s.name = ANY(i.await_names))`))
	// A finished instance's inbox is cleared by its outcome's round trip (or, for a signal that
	// arrived while its last step ran, by the committer's follow-up statement right after).
	eventually(t, 5*time.Second, "no inbox left", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.signals`) == 0
	})
	// No step ran without consuming a signal (no spinning): at most one step per signal plus
	// the first.
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE (result->>'steps')::int > $1`, perInstance+1))
	require.LessOrEqual(t, executions.Load(), int64(instances*(perInstance+1)))
}

func TestSignalByKeyRacingTheInstancesEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := gendurable.Job[counter]{Name: "brief", Queue: "brief", Perform: func(*gendurable.Ctx, counter) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{"brief": {Concurrency: 16}}})
	start(t, cl)
	ctx := context.Background()
	n := oracle.Size(150, 300)
	var delivered, noTarget atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		key := fmt.Sprint("k", i)
		_, err := cl.Insert(ctx, job.With(counter{}), &gendurable.InsertOpts{CorrelationKey: key})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				_, err := cl.Signal(ctx, gendurable.ByKey("brief", key), "ping", nil)
				switch {
				case err == nil:
					delivered.Add(1)
				case errors.Is(err, gendurable.ErrNoTarget):
					noTarget.Add(1)
				default:
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, 30*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	t.Logf("delivered %d, ErrNoTarget %d", delivered.Load(), noTarget.Load())
	require.Equal(t, int64(5*n), delivered.Load()+noTarget.Load())
	require.Positive(t, noTarget.Load(), "some signals raced the end")
	require.Positive(t, delivered.Load())
	// Nothing orphaned: no signal row of a finished instance survives (the committer's
	// follow-up clears a signal that arrived while the last step ran, right after its outcome).
	eventually(t, 5*time.Second, "no inbox left", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.signals`) == 0
	})
}

// pack accumulates five signals that arrive one at a time, in any order.
type pack struct {
	Got   []string `json:"got"`
	Steps int      `json:"steps"`
}

var packNames = []string{"a", "b", "c", "d", "e"}

func TestAccumulatePatternNeverSpins(t *testing.T) {
	t.Parallel()
	runAccumulate(t, newEnv(t))
}

func runAccumulate(t *testing.T, e *env) {
	m := gendurable.FSM[pack]{
		Name: "pack", Start: "collect", Queue: "pack",
		Steps: map[string]gendurable.StepFunc[pack]{
			"collect": func(ctx *gendurable.Ctx, p pack) (gendurable.Outcome, error) {
				p.Steps++
				for _, s := range ctx.Awaited {
					if !slices.Contains(p.Got, s.Name) {
						p.Got = append(p.Got, s.Name)
					}
				}
				var missing []string
				for _, n := range packNames {
					if !slices.Contains(p.Got, n) {
						missing = append(missing, n)
					}
				}
				if len(missing) == 0 {
					return gendurable.Done(p), nil
				}
				return gendurable.Await(missing, "collect", p), nil
			},
		},
	}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, PollInterval: time.Hour,
		Queues: map[string]gendurable.QueueConfig{"pack": {Concurrency: 8}}})
	start(t, cl)
	ctx := context.Background()
	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		r, err := cl.Insert(ctx, m.With(pack{}), nil)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := slices.Clone(packNames)
			rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
			for _, name := range order {
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				if _, err := cl.Signal(ctx, gendurable.ByID(r.ID), name, nil); err != nil {
					t.Error(err)
				}
			}
			_ = i
		}()
	}
	wg.Wait()
	eventually(t, 30*time.Second, "all packs complete", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	// Each pack proceeded once with all five, and ran at most one step per signal plus the first.
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE jsonb_array_length(result->'got') <> 5`))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE (result->>'steps')::int > 6`))
}

func TestAwaitTimeouts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := approvalFSM(600 * time.Millisecond)
	var timeouts atomic.Int64
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"sig": {}},
		Reaper: &gendurable.ReaperConfig{Interval: 100 * time.Millisecond},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventAwaitTimeout {
				timeouts.Add(int64(ev.Count))
			}
		}}})
	start(t, cl)
	ctx := context.Background()
	timed, err := cl.Insert(ctx, m.With(approval{}), nil)
	require.NoError(t, err)
	answered, err := cl.Insert(ctx, m.With(approval{}), nil)
	require.NoError(t, err)
	var parkedAt time.Time
	eventually(t, 10*time.Second, "both parked", func() bool {
		a, _ := cl.Get(ctx, timed.ID)
		b, _ := cl.Get(ctx, answered.ID)
		parkedAt = time.Now()
		return a.Status == gendurable.StatusAwaiting && b.Status == gendurable.StatusAwaiting
	})
	in, err := cl.Get(ctx, timed.ID)
	require.NoError(t, err)
	require.NotNil(t, in.AwaitDeadline)
	_, err = cl.Signal(ctx, gendurable.ByID(answered.ID), "approved", map[string]string{"By": "eve"})
	require.NoError(t, err)

	eventually(t, 10*time.Second, "the timed-out instance done", func() bool {
		in, _ := cl.Get(ctx, timed.ID)
		return in.Status == gendurable.StatusDone
	})
	woke := time.Since(parkedAt)
	in, err = cl.Get(ctx, timed.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"timeout": true}`, string(in.Result), "a timeout is a wake with nothing awaited")
	require.Equal(t, 1, in.Attempt, "the woken step ran once; the timeout itself spent no attempt")
	require.Empty(t, in.Errors, "a timeout is not a failure")
	require.Less(t, woke, 600*time.Millisecond+time.Second, "fired within a reaper interval (plus scheduling) of the deadline")

	in, err = cl.Get(ctx, answered.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, in.Status)
	require.JSONEq(t, `{"seen": ["approved"], "inbox": ["approved"], "payload": "eve"}`, string(in.Result))
	time.Sleep(800 * time.Millisecond) // past the answered instance's deadline: it must not fire
	require.Equal(t, int64(1), timeouts.Load(), "only the unanswered await timed out")
}

func TestFireTimeoutsInTheKit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := approvalFSM(24 * time.Hour)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	r, err := cl.Insert(ctx, m.With(approval{}), nil)
	require.NoError(t, err)
	kit.Drain(ctx)
	kit.RequireAwaiting(ctx, r.ID)
	require.Equal(t, 1, kit.FireTimeouts(ctx))
	kit.Drain(ctx)
	var got approval
	kit.RequireDone(ctx, r.ID, &got)
	require.True(t, got.Timeout)
}

func TestReaperFailingAnInstanceClearsItsInbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := approvalFSM(0)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m},
		Reaper: &gendurable.ReaperConfig{Interval: 50 * time.Millisecond, MaxRecoveries: 1}})
	ctx := context.Background()
	r, err := cl.Insert(ctx, m.With(approval{}), nil)
	require.NoError(t, err)
	// A worker claimed it, got a signal while running, and died; the step had been recovered
	// once already, as many times as MaxRecoveries allows.
	e.exec(t, `UPDATE {schema}.instances SET status = 'executing', locked_by = 'ghost#1', locked_until = now() + interval '1 hour',
		attempt = 1, recoveries = 1 WHERE id = $1`, r.ID)
	_, err = cl.Signal(ctx, gendurable.ByID(r.ID), "approved", nil)
	require.NoError(t, err)
	e.exec(t, `UPDATE {schema}.instances SET locked_until = now() - interval '1 second' WHERE id = $1`, r.ID)
	start(t, cl)
	eventually(t, 10*time.Second, "the reaper fails it", func() bool {
		in, err := cl.Get(ctx, r.ID)
		require.NoError(t, err)
		return in.Status == gendurable.StatusFailed
	})
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.signals`), "a terminal instance keeps no inbox")
}
