package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// T5b: park versus signal under load. Every round inserts M parkers and sends each its "go"
// 0-20 ms after the insert, from a goroutine of its own, so that signals land before, during
// and after the park. The poll is an hour and no reaper runs: only the protocol (and the local
// poke) can wake a parked instance, and a lost wakeup strands it. After each round: every
// instance done within 30 s, and no parked instance with an awaited signal in its inbox.
func TestNoLostWakeupsUnderLoad(t *testing.T) {
	t.Parallel()
	seed, _ := oracle.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	e := newEnv(t, 24)
	ctx := context.Background()
	m := parkerFSM()
	cl := e.client(t, &gendurable.Config{Name: "t5b", Machines: []gendurable.Machine{m}, PollInterval: time.Hour,
		Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"park": {Concurrency: 32}}})
	start(t, cl)
	per, rounds := 2000, oracle.Size(2, 20)
	total := 0
	for round := range rounds {
		began := time.Now()
		params := make([]gendurable.InsertManyParams, per)
		for i := range params {
			params[i] = gendurable.InsertManyParams{Input: m.With(parked{})}
		}
		res, err := cl.InsertMany(ctx, params)
		require.NoError(t, err)
		inserted := time.Now()
		var wg sync.WaitGroup
		var failed atomic.Int64
		for _, r := range res {
			at := inserted.Add(time.Duration(rng.IntN(20_000)) * time.Microsecond)
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(at))
				if _, err := cl.Signal(ctx, gendurable.ByID(r.ID), "go", nil); err != nil {
					failed.Add(1)
					t.Errorf("signal %d: %v", r.ID, err)
				}
			}()
		}
		wg.Wait()
		require.Zero(t, failed.Load())
		total += per
		eventually(t, 30*time.Second, fmt.Sprintf("round %d done", round), func() bool {
			return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == total
		})
		require.Equal(t, 0, e.stranded(t), "round %d stranded an instance", round)
		t.Logf("round %d: %d/%d done in %v", round, per, per, time.Since(began).Round(time.Millisecond))
	}
	require.Equal(t, total, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE (result->>'woke')::bool`))
	e.check(t, oracle.Opts{N: total}, oracle.Summary{Seed: seed, Instances: total})
}

// pack3 accumulates the set {a, b, c}.
type pack3 struct {
	// Short is set on the instances that will miss a signal: their await times out soon; the
	// others' timeout (a minute) never fires in a healthy run.
	Short   bool     `json:"short,omitempty"`
	Got     []string `json:"got"`
	Steps   int      `json:"steps"`
	Timeout bool     `json:"timeout,omitempty"`
}

var packSet = []string{"a", "b", "c"}

// T5c: the accumulate pattern. Each instance awaits what it still lacks of {a, b, c}; the
// signals arrive in random order, 20 % of them twice; a tenth of the instances never get their
// last signal and finish on their await's timeout (3 s) with a partial pack. Pass: every instance
// finishes with the full set, or with a partial pack on timeout; no instance runs more steps than
// distinct signals + 2 (no busy loop: the 0.2.0 finding).
func TestAccumulatePatternUnderRacingSignals(t *testing.T) {
	t.Parallel()
	seed, _ := oracle.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	e := newEnv(t, 16)
	ctx := context.Background()
	m := gendurable.FSM[pack3]{Name: "pack3", Start: "collect", Queue: "pack", Steps: map[string]gendurable.StepFunc[pack3]{
		"collect": func(ctx *gendurable.Ctx, p pack3) (gendurable.Outcome, error) {
			if p.Steps > 0 && len(ctx.Awaited) == 0 {
				p.Timeout = true
			}
			p.Steps++
			for _, s := range ctx.Awaited {
				if !slices.Contains(p.Got, s.Name) {
					p.Got = append(p.Got, s.Name)
				}
			}
			var missing []string
			for _, n := range packSet {
				if !slices.Contains(p.Got, n) {
					missing = append(missing, n)
				}
			}
			if len(missing) == 0 || p.Timeout {
				return gendurable.Done(p), nil
			}
			timeout := time.Minute
			if p.Short {
				timeout = 3 * time.Second
			}
			return gendurable.Await(missing, "collect", p, gendurable.Timeout(timeout)), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Name: "t5c", Machines: []gendurable.Machine{m}, PollInterval: time.Hour,
		Reaper: &gendurable.ReaperConfig{Interval: 100 * time.Millisecond}, GC: &gendurable.GCConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"pack": {Concurrency: 16}}})
	start(t, cl)
	n := oracle.Size(300, 2000)
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: m.With(pack3{Short: i%10 == 0})}
	}
	res, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	partial := map[int64]bool{}
	distinct := map[int64]int{}
	type send struct {
		id   int64
		name string
		at   time.Duration
	}
	var sends []send
	for i, r := range res {
		names := slices.Clone(packSet)
		rng.Shuffle(len(names), func(a, b int) { names[a], names[b] = names[b], names[a] })
		if i%10 == 0 {
			names = names[:2] // never completes: the timeout ends it
			partial[r.ID] = true
		}
		distinct[r.ID] = len(names)
		for _, name := range names {
			sends = append(sends, send{r.ID, name, time.Duration(rng.IntN(400)) * time.Millisecond})
			if rng.IntN(5) == 0 {
				sends = append(sends, send{r.ID, name, time.Duration(rng.IntN(400)) * time.Millisecond})
			}
		}
	}
	slices.SortFunc(sends, func(a, b send) int { return int(a.at - b.at) })
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(sends); i += 8 {
				time.Sleep(time.Until(t0.Add(sends[i].at)))
				// A duplicate may find the instance finished: ErrNoTarget is fine then.
				if _, err := cl.Signal(ctx, gendurable.ByID(sends[i].id), sends[i].name, nil); err != nil &&
					!errors.Is(err, gendurable.ErrNoTarget) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, 60*time.Second, "every pack finished", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	rows, err := e.side.Query(ctx, e.q(`SELECT id, result FROM {schema}.instances`))
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		var p pack3
		require.NoError(t, rows.Scan(&id, &p))
		if partial[id] {
			// It finished on its timeout with what had come by then: on a loaded machine, a
			// signal may land after the timeout (then it finds the instance done: ErrNoTarget).
			require.True(t, p.Timeout, "instance %d without its last signal finished on its timeout", id)
			require.Less(t, len(p.Got), 3, "instance %d: a partial pack", id)
		} else {
			require.ElementsMatch(t, packSet, p.Got, "instance %d: the whole set: %+v", id, p)
		}
		require.LessOrEqual(t, p.Steps, distinct[id]+2, "instance %d ran %d steps for %d distinct signals", id, p.Steps, distinct[id])
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 0, e.stranded(t))
	e.check(t, oracle.Opts{N: n}, oracle.Summary{Seed: seed, Instances: n})
}
