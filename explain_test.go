package gendurable_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// Every reason Explain gives, each set up by running the engine against a real Postgres: a
// worker client whose blocking steps hold slots, keys and claims while the test asks.
func TestExplainSaysWhyAnInstanceIsNotRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release) // before the worker's Stop (a cleanup), which waits for running steps
	type st struct {
		N int `json:"n"`
	}
	block := func(*gendurable.Ctx, st) error {
		<-release
		return nil
	}
	holder := gendurable.Job[st]{Name: "holder", Queue: "work", Perform: block}
	single := gendurable.Job[st]{Name: "single", Queue: "one", Perform: block}
	fails := gendurable.FSM[st]{Name: "fails", Start: "charge", Queue: "work",
		Backoff: func(int) time.Duration { return time.Hour },
		Steps: map[string]gendurable.StepFunc[st]{"charge": func(*gendurable.Ctx, st) (gendurable.Outcome, error) {
			return gendurable.Outcome{}, errors.New("card declined")
		}}}
	parked := gendurable.FSM[st]{Name: "parked", Start: "wait", Queue: "work", Steps: map[string]gendurable.StepFunc[st]{
		"wait": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"approve", "reject"}, "end", s, gendurable.Timeout(time.Hour)), nil
		},
		"end": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
	}}
	kid := gendurable.Job[st]{Name: "kid", Queue: "kids", Perform: func(*gendurable.Ctx, st) error { return nil }}
	parent := gendurable.FSM[st]{Name: "parent", Start: "fan", Queue: "work", Steps: map[string]gendurable.StepFunc[st]{
		"fan": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) {
			kids := make([]gendurable.Child, 7)
			for i := range kids {
				kids[i] = gendurable.Child{Input: kid.With(st{N: i})}
			}
			return gendurable.Spawn(kids, "join", s), nil
		},
		"join": func(_ *gendurable.Ctx, s st) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
	}}
	machines := []gendurable.Machine{holder, single, fails, parked, kid, parent}
	w := e.client(t, &gendurable.Config{Name: "worker-1", Machines: machines,
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"acct": {Limit: 2}},
		RateLimits:        map[string]gendurable.Rate{"api": {Allowed: 1, Period: time.Hour}},
		Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 8, PollInterval: 20 * time.Millisecond},
			"one": {Concurrency: 1, PollInterval: 20 * time.Millisecond}}})
	start(t, w)
	insert := func(in gendurable.Input, opts *gendurable.InsertOpts) int64 {
		t.Helper()
		r, err := w.Insert(ctx, in, opts)
		require.NoError(t, err)
		return r.ID
	}
	explain := func(id int64) *gendurable.Explanation {
		t.Helper()
		x, err := w.Explain(ctx, id)
		require.NoError(t, err)
		require.Equal(t, id, x.ID)
		require.NotEmpty(t, x.Text)
		t.Logf("%d %s: %s", id, x.Reason, x.Text)
		return x
	}
	status := func(id int64, want gendurable.Status) func() bool {
		return func() bool {
			in, err := w.Get(ctx, id)
			require.NoError(t, err)
			return in.Status == want
		}
	}

	// Executing: a step that blocks, on this worker, which the registry shows running.
	running := insert(holder.With(st{}), nil)
	eventually(t, 10*time.Second, "the holder runs", status(running, gendurable.StatusExecuting))
	x := explain(running)
	require.Equal(t, gendurable.ExplainExecuting, x.Reason)
	require.NotNil(t, x.Claim)
	require.True(t, x.Claim.ClientLive)
	require.True(t, strings.HasPrefix(x.Claim.Client, "worker-1@"), x.Claim.Client)
	require.True(t, x.Claim.LeaseUntil.After(x.At))
	require.Contains(t, x.Text, "worker-1@")

	// Gate full: the key's two slots held by two blocking steps; a K = 1 key busy.
	var gated []int64
	for i := range 3 {
		gated = append(gated, insert(holder.With(st{N: i}), &gendurable.InsertOpts{ConcurrencyKey: "acct:7"}))
	}
	eventually(t, 10*time.Second, "two of the key's instances run", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE concurrency_key = 'acct:7' AND status = 'executing'`) == 2
	})
	var waitingOnGate int64
	for _, id := range gated {
		if in, err := w.Get(ctx, id); err == nil && in.Status == gendurable.StatusAvailable {
			waitingOnGate = id
		}
	}
	x = explain(waitingOnGate)
	require.Equal(t, gendurable.ExplainGateFull, x.Reason)
	require.Equal(t, 2, x.Gate.Limit)
	require.Equal(t, 2, x.Gate.Held)
	require.Len(t, x.Gate.Holders, 2)
	require.NotContains(t, x.Gate.Holders, waitingOnGate)
	k1a := insert(holder.With(st{}), &gendurable.InsertOpts{ConcurrencyKey: "user:1"})
	eventually(t, 10*time.Second, "the key's first instance runs", status(k1a, gendurable.StatusExecuting))
	k1b := insert(holder.With(st{}), &gendurable.InsertOpts{ConcurrencyKey: "user:1"})
	x = explain(k1b)
	require.Equal(t, gendurable.ExplainGateFull, x.Reason)
	require.Equal(t, 0, x.Gate.Limit)
	require.Equal(t, []int64{k1a}, x.Gate.Holders)
	require.Contains(t, x.Text, "one instance at a time")

	// Rate-limited: one token an hour, taken by the first instance.
	r1 := insert(holder.With(st{}), &gendurable.InsertOpts{RateLimit: "api:x"})
	eventually(t, 10*time.Second, "the first rate-limited instance runs", status(r1, gendurable.StatusExecuting))
	r2 := insert(holder.With(st{}), &gendurable.InsertOpts{RateLimit: "api:x"})
	x = explain(r2)
	require.Equal(t, gendurable.ExplainRateLimited, x.Reason)
	require.Equal(t, "api:x", x.Rate.Key)
	require.Less(t, x.Rate.Tokens, 1.0)
	require.NotNil(t, x.Until)
	require.WithinDuration(t, x.At.Add(time.Hour), *x.Until, 2*time.Minute)

	// Backing off after an error, until an hour from now.
	failing := insert(fails.With(st{}), nil)
	eventually(t, 10*time.Second, "the failing step failed once", func() bool {
		in, err := w.Get(ctx, failing)
		require.NoError(t, err)
		return in.Status == gendurable.StatusAvailable && len(in.Errors) == 1
	})
	x = explain(failing)
	require.Equal(t, gendurable.ExplainBackoff, x.Reason)
	require.Equal(t, 1, x.Attempt)
	require.Contains(t, x.Error, "card declined")
	require.WithinDuration(t, x.At.Add(time.Hour), *x.Until, 2*time.Minute)

	// Scheduled for later.
	later := insert(holder.With(st{}), &gendurable.InsertOpts{In: 2 * time.Hour})
	x = explain(later)
	require.Equal(t, gendurable.ExplainScheduled, x.Reason)
	require.WithinDuration(t, x.At.Add(2*time.Hour), *x.Until, time.Minute)

	// Awaiting signals, with a timeout.
	wait := insert(parked.With(st{}), nil)
	eventually(t, 10*time.Second, "it parks", status(wait, gendurable.StatusAwaiting))
	x = explain(wait)
	require.Equal(t, gendurable.ExplainAwaiting, x.Reason)
	require.Equal(t, []string{"approve", "reject"}, x.Signals)
	require.NotNil(t, x.Until)
	require.Contains(t, x.Text, `"approve" or "reject"`)

	// Joining: seven children in a queue no node works; five named.
	par := insert(parent.With(st{}), nil)
	eventually(t, 10*time.Second, "the parent joins", status(par, gendurable.StatusJoining))
	x = explain(par)
	require.Equal(t, gendurable.ExplainJoining, x.Reason)
	require.Equal(t, 7, x.ChildrenLeft)
	require.Len(t, x.Children, 5)
	require.Contains(t, x.Text, "and 2 more")

	// Blocked: a child sits in a queue no running node works.
	x = explain(x.Children[0])
	require.Equal(t, gendurable.ExplainBlocked, x.Reason)
	require.Contains(t, x.Blocked, `no running node works queue "kids"`)

	// Blocked: a row at a version newer than any running node's (no node claims it).
	newer := insert(holder.With(st{}), &gendurable.InsertOpts{In: time.Hour})
	e.exec(t, `UPDATE {schema}.instances SET machine_version = 7, scheduled_at = now() WHERE id = $1`, newer)
	x = explain(newer)
	require.Equal(t, gendurable.ExplainBlocked, x.Reason)
	require.Contains(t, x.Blocked, "version 7")

	// Waiting for a free slot: queue "one" has one slot, held; two due instances ahead.
	busy := insert(single.With(st{}), nil)
	eventually(t, 10*time.Second, "the single slot is taken", status(busy, gendurable.StatusExecuting))
	var queued []int64
	for i := range 3 {
		queued = append(queued, insert(single.With(st{N: i}), nil))
	}
	x = explain(queued[2])
	require.Equal(t, gendurable.ExplainWaiting, x.Reason)
	require.Equal(t, int64(2), x.Ahead)
	x = explain(queued[0])
	require.Equal(t, int64(0), x.Ahead)
	// Blocked: a row at a step no running node's machine has, in the queue whose one slot is
	// held (so that no pick hands it back meanwhile), behind the others (priority 9).
	ghost := insert(single.With(st{}), &gendurable.InsertOpts{In: time.Hour, Priority: 9})
	e.exec(t, `UPDATE {schema}.instances SET step = 'ghost', scheduled_at = now() WHERE id = $1`, ghost)
	x = explain(ghost)
	require.Equal(t, gendurable.ExplainBlocked, x.Reason)
	require.Contains(t, x.Blocked, `no step "ghost"`)

	// Paused: the instance; then its queue (the instance's own pause is said first).
	require.NoError(t, w.Pause(ctx, gendurable.PauseTarget{Instance: queued[1]}, ""))
	x = explain(queued[1])
	require.Equal(t, gendurable.ExplainPaused, x.Reason)
	require.Equal(t, "instance", x.Paused.Kind)
	x = explain(queued[2])
	require.Equal(t, int64(1), x.Ahead, "a paused instance is not ahead of anyone")
	require.NoError(t, w.Pause(ctx, gendurable.PauseTarget{Queue: "one"}, "maintenance"))
	x = explain(queued[2])
	require.Equal(t, gendurable.ExplainPaused, x.Reason)
	require.Equal(t, gendurable.ExplainPause{Kind: "queue", Name: "one", Reason: "maintenance", At: x.Paused.At}, *x.Paused)
	require.Contains(t, x.Text, "maintenance")
	// A parked instance of a paused machine awaits first, and says it is paused too.
	require.NoError(t, w.Pause(ctx, gendurable.PauseTarget{Machine: "parked"}, ""))
	x = explain(wait)
	require.Equal(t, gendurable.ExplainAwaiting, x.Reason)
	require.Equal(t, "machine", x.Paused.Kind)
	require.Contains(t, x.Text, "paused too")

	// Finished, and no such instance.
	require.NoError(t, w.Cancel(ctx, later, "not needed"))
	x = explain(later)
	require.Equal(t, gendurable.ExplainFinished, x.Reason)
	_, err := w.Explain(ctx, 1<<40)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

// An instance claimed by a client that is gone (its registry row deleted, its lease run out)
// says so: the reaper will release it.
func TestExplainAClaimWhoseClientIsGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "j", Queue: "q", Perform: func(*gendurable.Ctx, int) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	r, err := cl.Insert(ctx, job.With(1), nil)
	require.NoError(t, err)
	e.exec(t, `UPDATE {schema}.instances SET status = 'executing', attempt = 1, locked_by = 'old-worker:q@host-1-abcd#3',
	             locked_until = now() - interval '5 seconds', updated_at = now() - interval '40 seconds' WHERE id = $1`, r.ID)
	x, err := cl.Explain(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.ExplainExecuting, x.Reason)
	require.Equal(t, "old-worker@host-1", x.Claim.Client)
	require.False(t, x.Claim.ClientLive)
	require.Contains(t, x.Text, "the reaper will release it")
}
