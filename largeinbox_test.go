package gendurable_test

import (
	"context"
	"crypto/sha256"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An inbox larger than one jsonb value can hold (270 unawaited signals of a megabyte each, as an
// entity instance that lives for months can gather) failed every pick that claimed its row: the
// pick aggregated the whole inbox, the statement failed for its whole batch, and the row stayed
// at the head of its queue, so nothing behind it ran again. The pick now loads the first part of
// an inbox and the executor reads the rest: the queue moves, and the woken step sees every
// signal. Signals larger than the worker's MaxPayloadBytes (90 of 3 MB, sent by another client)
// overflow even the first part: the pick is made again loading one signal per row.
func TestInboxPastJsonbsLimitStallsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		n, payload int
	}{
		{"many signals", 270, 1_000_000},
		{"large signals", 90, 3_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			var mu sync.Mutex
			var inbox, awaited int
			m := gendurable.FSM[int]{Name: "hoarder", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
				"a": func(_ *gendurable.Ctx, s int) (gendurable.Outcome, error) {
					return gendurable.Await([]string{"go"}, "b", s), nil
				},
				"b": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
					mu.Lock()
					inbox, awaited = len(ctx.Inbox), len(ctx.Awaited)
					mu.Unlock()
					return gendurable.Done(s), nil
				},
			}}
			job := gendurable.Job[int]{Name: "behind", Perform: func(*gendurable.Ctx, int) error { return nil }}
			cl, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{m, job},
				Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}}})
			require.NoError(t, err)
			start(t, cl)
			r, err := cl.Insert(ctx, m.With(0), nil)
			require.NoError(t, err)
			res, err := cl.Await(ctx, r.ID, 30*time.Second, nil)
			require.NoError(t, err)
			require.Equal(t, gendurable.AwaitAwaiting, res.Status)

			// The unawaited signals, written by the server (a string of repeated characters
			// compresses to almost nothing on disk): 270 MB once aggregated, past jsonb's 256 MB.
			_, err = e.pool.Exec(ctx, expand(`INSERT INTO {schema}.signals (instance_id, name, payload)
				SELECT $1, 'note', to_jsonb(repeat('x', $3)) FROM generate_series(1, $2)`, e.schema), r.ID, tc.n, tc.payload)
			require.NoError(t, err)
			_, err = cl.Signal(ctx, gendurable.ByID(r.ID), "go", 1)
			require.NoError(t, err)
			b, err := cl.Insert(ctx, job.With(1), nil)
			require.NoError(t, err)

			res, err = cl.Await(ctx, b.ID, time.Minute, nil)
			require.NoError(t, err)
			require.Equal(t, gendurable.AwaitDone, res.Status, "the job behind the large inbox ran")
			res, err = cl.Await(ctx, r.ID, time.Minute, nil)
			require.NoError(t, err)
			require.Equal(t, gendurable.AwaitDone, res.Status)
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, tc.n+1, inbox, "the woken step saw the whole inbox")
			require.Equal(t, 1, awaited)
		})
	}
}

// With payloads allowed up to 64 MiB a pick loads two signals of an inbox and two children of a
// join with their row; the rest are read before the step runs, in order, opened by the codec
// like the first ones, and the awaited signal among them is consumed by the step's progress.
func TestClaimedRowGetsItsWholeInboxAndJoin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	key := sha256.Sum256([]byte("large inbox test"))
	codec, err := gendurable.NewAESGCM("k1", map[string][]byte{"k1": key[:]})
	require.NoError(t, err)

	var mu sync.Mutex
	seen := map[string][]string{} // step → the inbox's names and payloads, or the children's results
	note := func(step string, v string) {
		mu.Lock()
		defer mu.Unlock()
		seen[step] = append(seen[step], v)
	}
	collector := gendurable.FSM[int]{Name: "collector", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
		"a": func(_ *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "b", s), nil
		},
		"b": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			for _, sg := range ctx.Inbox {
				var p string
				if err := sg.Decode(&p); err != nil {
					return gendurable.Outcome{}, err
				}
				note("b", sg.Name+":"+p)
			}
			for _, sg := range ctx.Awaited {
				note("b.awaited", sg.Name)
			}
			return gendurable.Await([]string{"again"}, "c", s), nil
		},
		"c": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			for _, sg := range ctx.Inbox {
				note("c", sg.Name)
			}
			return gendurable.Done(s), nil
		},
	}}
	kidFSM := gendurable.FSM[int]{Name: "kidfsm", Start: "x", Steps: map[string]gendurable.StepFunc[int]{
		"x": func(_ *gendurable.Ctx, n int) (gendurable.Outcome, error) { return gendurable.Done(n * 10), nil },
	}}
	fan := gendurable.FSM[int]{Name: "fan", Start: "spawn", Steps: map[string]gendurable.StepFunc[int]{
		"spawn": func(_ *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			children := make([]gendurable.Child, 5)
			for i := range children {
				children[i] = gendurable.Child{Input: kidFSM.With(i + 1)}
			}
			return gendurable.Spawn(children, "join", s), nil
		},
		"join": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				var n int
				if err := c.Decode(&n); err != nil {
					return gendurable.Outcome{}, err
				}
				note("join", string(rune('0'+n/10)))
			}
			return gendurable.Done(s), nil
		},
	}}
	cl, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Codec: codec, MaxPayloadBytes: 64 << 20,
		Machines: []gendurable.Machine{collector, fan, kidFSM},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}}})
	require.NoError(t, err)
	start(t, cl)

	r, err := cl.Insert(ctx, collector.With(0), nil)
	require.NoError(t, err)
	res, err := cl.Await(ctx, r.ID, 30*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitAwaiting, res.Status)
	for _, p := range []string{"1", "2", "3", "4", "5"} {
		_, err := cl.Signal(ctx, gendurable.ByID(r.ID), "note", p)
		require.NoError(t, err)
	}
	_, err = cl.Signal(ctx, gendurable.ByID(r.ID), "go", "g")
	require.NoError(t, err)
	res, err = cl.Await(ctx, r.ID, 30*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitAwaiting, res.Status, "parked again, on again")
	_, err = cl.Signal(ctx, gendurable.ByID(r.ID), "again", "a")
	require.NoError(t, err)
	res, err = cl.Await(ctx, r.ID, 30*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, res.Status)

	f, err := cl.Insert(ctx, fan.With(0), nil)
	require.NoError(t, err)
	res, err = cl.Await(ctx, f.ID, 30*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, res.Status)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"note:1", "note:2", "note:3", "note:4", "note:5", "go:g"}, seen["b"],
		"the whole inbox, oldest first, opened")
	require.Equal(t, []string{"go"}, seen["b.awaited"])
	require.Equal(t, []string{"note", "note", "note", "note", "note", "again"}, seen["c"],
		"the awaited signal read past the first page was consumed")
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, seen["join"], "every child, in spawn order")
}

// Senders racing the steps of instances whose every claim reads its inbox in two parts (two
// signals with the row, the rest after: payloads of up to 64 MiB allowed, eight unawaited
// signals waiting in each inbox first): each awaited signal is counted exactly once, by the
// rows. A signal the second read misses stays and wakes the instance again; one it reads is
// consumed by id with the step's progress.
func TestPagedInboxesCountEverySignalOnceUnderRacingSenders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const instances, ticks, noise, senders = 40, 8, 8, 8
	tally := gendurable.FSM[int]{Name: "tally", Start: "wait", Steps: map[string]gendurable.StepFunc[int]{
		"wait": func(_ *gendurable.Ctx, n int) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"tick"}, "count", n), nil
		},
		"count": func(ctx *gendurable.Ctx, n int) (gendurable.Outcome, error) {
			n += len(ctx.Awaited)
			if n >= ticks {
				return gendurable.Done(n), nil
			}
			return gendurable.Await([]string{"tick"}, "count", n), nil
		},
	}}
	cl, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, MaxPayloadBytes: 64 << 20,
		Machines: []gendurable.Machine{tally},
		Queues:   map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 8}}})
	require.NoError(t, err)
	start(t, cl)
	ids := make([]int64, instances)
	for i := range ids {
		r, err := cl.Insert(ctx, tally.With(0), nil)
		require.NoError(t, err)
		ids[i] = r.ID
		for k := range noise {
			_, err := cl.Signal(ctx, gendurable.ByID(r.ID), "noise", k)
			require.NoError(t, err)
		}
	}
	// Every tick, in a random order, from senders at once.
	var sends []int64
	for _, id := range ids {
		for range ticks {
			sends = append(sends, id)
		}
	}
	rand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
	var wg sync.WaitGroup
	for w := range senders {
		wg.Go(func() {
			for i := w; i < len(sends); i += senders {
				_, err := cl.Signal(ctx, gendurable.ByID(sends[i]), "tick", i)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		res, err := cl.Await(ctx, id, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, res.Status, "instance %d", id)
	}
	var exact, left int
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.instances
		WHERE machine = 'tally' AND status = 'done' AND result = to_jsonb($1::int)`, e.schema), ticks).Scan(&exact))
	require.Equal(t, instances, exact, "every instance counted each of its ticks exactly once")
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.signals`, e.schema)).Scan(&left))
	require.Zero(t, left, "the finished instances' inboxes are cleared")
}

// A signal's At is the same instant in the same zone (the process's local one) whether it came
// with the claimed row (as JSON, carrying the session's TimeZone offset) or was read after it (by
// the driver), here with sessions in a zone that is not the process's and an inbox read in two
// parts.
func TestInboxTimesComeInOneZone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	zone := "Asia/Kathmandu" // +05:45: no process's local zone here shares it
	if time.Now().Format("-07:00") == "+05:45" {
		zone = "America/St_Johns"
	}
	pool := durabledbtest.Pool(t, 8, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["timezone"] = zone })
	schema := durabledbtest.Schema(t, pool)
	var mu sync.Mutex
	var got []gendurable.Signal
	m := gendurable.FSM[int]{Name: "zoned", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
		"a": func(_ *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "b", s), nil
		},
		"b": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			mu.Lock()
			got = append(got, ctx.Inbox...)
			mu.Unlock()
			return gendurable.Done(s), nil
		},
	}}
	// Payloads of up to 64 MiB: two signals come with the row, the rest is read after.
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, MaxPayloadBytes: 64 << 20,
		Machines: []gendurable.Machine{m}, Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 2}}})
	require.NoError(t, err)
	start(t, cl)
	r, err := cl.Insert(ctx, m.With(0), nil)
	require.NoError(t, err)
	res, err := cl.Await(ctx, r.ID, 30*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitAwaiting, res.Status)
	for _, name := range []string{"x", "x", "x", "go"} {
		_, err := cl.Signal(ctx, gendurable.ByID(r.ID), name, nil)
		require.NoError(t, err)
	}
	res, err = cl.Await(ctx, r.ID, 30*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, res.Status)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 4)
	for i, sg := range got {
		require.Equal(t, time.Local, sg.At.Location(), "signal %d (%s)", i+1, sg.At)
		require.WithinDuration(t, time.Now(), sg.At, time.Minute)
		if i > 0 {
			require.False(t, sg.At.Before(got[i-1].At), "oldest first")
		}
	}
}
