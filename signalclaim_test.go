package gendurable_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/bridge"
	"github.com/stretchr/testify/require"
)

// claimedWithWake reads whether the executing row id was claimed in the transaction that woke it:
// its lease then ends exactly lease after the wake's due time (both are that transaction's now()),
// where a pick's claim, a later transaction, gives it a later end; and the row's version is that
// transaction's, the one that stored the signal.
func claimedWithWake(t *testing.T, e *env, id int64, lease time.Duration) bool {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances AS i
		WHERE i.id = $1 AND i.status = 'executing' AND i.locked_until = i.scheduled_at + $2::bigint * interval '1 millisecond'
		  AND i.xmin = (SELECT s.xmin FROM {schema}.signals AS s WHERE s.instance_id = i.id ORDER BY s.id DESC LIMIT 1)`,
		id, lease.Milliseconds()) == 1
}

// countParks is a hook that counts the steps that parked their instance (outcome await).
func countParks(n *atomic.Int64) func(gendurable.Event) {
	return func(ev gendurable.Event) {
		if ev.Name == gendurable.EventStepFinished && ev.Outcome == "await" {
			n.Add(1)
		}
	}
}

// Signal on a client that works the target's queue starts the woken step itself: the wake and
// the claim are one transaction, and the step runs with the signal among its Awaited. An
// instance the picks must admit (here, one with a concurrency key) is woken for them instead.
func TestSignalStartsTheStepItWakes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type st struct {
		Got string `json:"got"`
	}
	running := make(chan int64, 2)
	release := make(chan struct{})
	m := gendurable.FSM[st]{Name: "waker", Start: "park", Queue: "q",
		Steps: map[string]gendurable.StepFunc[st]{
			"park": func(*gendurable.Ctx, st) (gendurable.Outcome, error) {
				return gendurable.Await([]string{"go"}, "woke", st{}), nil
			},
			"woke": func(ctx *gendurable.Ctx, s st) (gendurable.Outcome, error) {
				if len(ctx.Awaited) != 1 {
					return gendurable.Outcome{}, nil
				}
				var p string
				if err := ctx.Awaited[0].Decode(&p); err != nil {
					return gendurable.Outcome{}, err
				}
				running <- ctx.ID
				<-release
				return gendurable.Done(st{Got: p}), nil
			},
		}}
	lease := 40 * time.Second
	var parked atomic.Int64
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, PollInterval: time.Hour, Lease: lease,
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 8}},
		Hooks:  []func(gendurable.Event){countParks(&parked)}})
	start(t, cl)
	ctx := context.Background()
	plain, err := cl.Insert(ctx, m.With(st{}), nil)
	require.NoError(t, err)
	keyed, err := cl.Insert(ctx, m.With(st{}), &gendurable.InsertOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	eventually(t, 30*time.Second, "both parked", func() bool { return parked.Load() == 2 })
	// An idle queue's picks hold its free slots while in flight (a signal meanwhile wakes for a
	// pick): they come 10, 20, 40, ... ms apart after a pick that found work. Each signal below
	// goes where the idle runner will not pick for half a second.
	eng, _ := bridge.Engine(cl)
	quiet := func() {
		eventually(t, 30*time.Second, "an idle gap of half a second", func() bool { return eng.QuietFor("q") >= 500*time.Millisecond })
	}
	quiet()

	res, err := cl.Signal(ctx, gendurable.ByID(plain.ID), "go", "hello")
	require.NoError(t, err)
	require.True(t, res.Woke)
	require.Equal(t, plain.ID, <-running)
	require.True(t, claimedWithWake(t, e, plain.ID, lease), "the signal's own transaction claimed the row")

	quiet()
	res, err = cl.Signal(ctx, gendurable.ByID(keyed.ID), "go", "keyed")
	require.NoError(t, err)
	require.True(t, res.Woke)
	require.Equal(t, keyed.ID, <-running)
	require.False(t, claimedWithWake(t, e, keyed.ID, lease), "a keyed row is claimed by a pick")

	close(release)
	eventually(t, 30*time.Second, "both done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 2
	})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND result->>'got' = 'hello' AND attempt = 1`, plain.ID))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.signals`))
}

// Signals that claim what they wake and the queue's picks share the queue's executor slots:
// however they race, no more steps run than Concurrency, and every instance runs its woken step
// once.
func TestSignalClaimsKeepTheQueuesConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const conc, n = 4, 120
	var now, most, woken atomic.Int64
	m := gendurable.FSM[struct{}]{Name: "crowd", Start: "park", Queue: "q",
		Steps: map[string]gendurable.StepFunc[struct{}]{
			"park": func(*gendurable.Ctx, struct{}) (gendurable.Outcome, error) {
				return gendurable.Await([]string{"go"}, "woke", struct{}{}), nil
			},
			"woke": func(*gendurable.Ctx, struct{}) (gendurable.Outcome, error) {
				c := now.Add(1)
				for {
					m := most.Load()
					if c <= m || most.CompareAndSwap(m, c) {
						break
					}
				}
				woken.Add(1)
				time.Sleep(2 * time.Millisecond) // a step that lasts: slots stay taken while signals arrive
				now.Add(-1)
				return gendurable.Done(nil), nil
			},
		}}
	var parked atomic.Int64
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}, PollInterval: time.Hour,
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: conc}},
		Hooks:  []func(gendurable.Event){countParks(&parked)}})
	start(t, cl)
	ctx := context.Background()
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: m.With(struct{}{})}
	}
	res, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 60*time.Second, "all parked", func() bool { return parked.Load() == n })

	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if _, err := cl.Signal(ctx, gendurable.ByID(res[i].ID), "go", nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, 60*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	require.LessOrEqual(t, most.Load(), int64(conc), "steps running at once")
	require.Equal(t, int64(n), woken.Load(), "each woken step ran once")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE attempt <> 1`))
}

// A pick without a backlog leaves a few free slots to signals' wakes while it is in flight; when
// it comes back full, the runner picks again at once for the slots it left, so that no due row
// waits for a poll (an hour here) while a slot is free.
func TestAPickLeavingSlotsToWakesStrandsNoRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const conc = 24
	var running atomic.Int64
	release := make(chan struct{})
	job := gendurable.Job[struct{}]{Name: "hold", Queue: "q", Perform: func(*gendurable.Ctx, struct{}) error {
		running.Add(1)
		<-release
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, PollInterval: time.Hour,
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: conc}}})
	start(t, cl)
	defer close(release)
	params := make([]gendurable.InsertManyParams, conc+5)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(struct{}{})}
	}
	_, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
	eventually(t, 30*time.Second, "every slot running a step", func() bool { return running.Load() == conc })
	require.Equal(t, conc, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`))
}
