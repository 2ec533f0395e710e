package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// line is one line of an order: a child instance prices it.
type line struct {
	SKU   string `json:"sku"`
	Qty   int    `json:"qty"`
	Fails bool   `json:"fails,omitempty"`
}

// basket is the parent: it prices every line in parallel, then charges once.
type basket struct {
	Lines  []line `json:"lines"`
	Total  int    `json:"total"`
	Failed int    `json:"failed"`
	Joins  int    `json:"joins"`
	Wave   int    `json:"wave"`
	Waves  int    `json:"waves"`
}

func fanoutMachines(lineQueue string) (gendurable.FSM[basket], gendurable.Job[line]) {
	priceLine := gendurable.Job[line]{
		Name:        "price_line",
		Queue:       lineQueue,
		MaxAttempts: 1,
		Perform: func(ctx *gendurable.Ctx, l line) error {
			if l.Fails {
				return errors.New("unknown sku " + l.SKU)
			}
			return nil
		},
	}
	order := gendurable.FSM[basket]{
		Name:  "basket",
		Start: "fan_out",
		Steps: map[string]gendurable.StepFunc[basket]{
			"fan_out": func(ctx *gendurable.Ctx, b basket) (gendurable.Outcome, error) {
				children := make([]gendurable.Child, len(b.Lines))
				for i, l := range b.Lines {
					children[i] = gendurable.Child{Input: priceLine.With(l)}
				}
				return gendurable.Spawn(children, "charge", b), nil
			},
			"charge": func(ctx *gendurable.Ctx, b basket) (gendurable.Outcome, error) {
				b.Joins++
				for _, c := range ctx.Children {
					if c.Status == gendurable.StatusDone {
						b.Total++
					} else {
						b.Failed++ // a failed child does not fail the parent: this step decides
					}
				}
				b.Wave++
				if b.Wave < b.Waves {
					return gendurable.Next("fan_out", b), nil // another wave
				}
				return gendurable.Done(b), nil
			},
		},
	}
	return order, priceLine
}

func lines(n int, failEvery int) []line {
	out := make([]line, n)
	for i := range out {
		out[i] = line{SKU: fmt.Sprint("sku-", i), Qty: 1, Fails: failEvery > 0 && i%failEvery == 0}
	}
	return out
}

func TestSpawnAndJoinThroughDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	order, priceLine := fanoutMachines("lines")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{order, priceLine}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	r, err := cl.Insert(ctx, order.With(basket{Lines: lines(7, 3), Waves: 2}), nil)
	require.NoError(t, err)
	empty, err := cl.Insert(ctx, order.With(basket{Waves: 1}), nil)
	require.NoError(t, err)
	kit.Drain(ctx)
	var b basket
	kit.RequireDone(ctx, r.ID, &b)
	require.Equal(t, 2, b.Joins, "two waves, one join each")
	require.Equal(t, 2*4, b.Total)
	require.Equal(t, 2*3, b.Failed)
	require.Equal(t, 14, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1`, r.ID))
	require.Equal(t, 2, e.count(t, `SELECT count(DISTINCT parent_wave) FROM {schema}.instances WHERE parent_id = $1`, r.ID))
	require.Equal(t, 0, e.count(t, `SELECT pending_children FROM {schema}.instances WHERE id = $1`, r.ID))
	// A Spawn of no children joins at once, with no children.
	kit.RequireDone(ctx, empty.ID, &b)
	require.Equal(t, 1, b.Joins)
	require.Equal(t, 0, b.Total+b.Failed)
}

func TestJoinStepSeesChildResultsAndErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type res struct {
		IDs     []int64  `json:"ids"`
		Results []int    `json:"results"`
		Errors  []string `json:"errors"`
		Status  []string `json:"status"`
	}
	double := gendurable.Job[int]{Name: "double", MaxAttempts: 1, Perform: func(ctx *gendurable.Ctx, n int) error {
		if n < 0 {
			return errors.New("negative")
		}
		return nil
	}}
	square := gendurable.FSM[int]{Name: "square", Start: "go", Steps: map[string]gendurable.StepFunc[int]{
		"go": func(_ *gendurable.Ctx, n int) (gendurable.Outcome, error) { return gendurable.Done(n * n), nil },
	}}
	parent := gendurable.FSM[res]{Name: "collector", Start: "spawn", Steps: map[string]gendurable.StepFunc[res]{
		"spawn": func(*gendurable.Ctx, res) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{
				{Input: square.With(3), Opts: &gendurable.InsertOpts{Queue: "q2", Priority: 1}},
				{Input: double.With(-1)},
				{Input: square.With(4), Opts: &gendurable.InsertOpts{In: time.Hour}},
			}, "join", res{}), nil
		},
		"join": func(ctx *gendurable.Ctx, r res) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				r.IDs = append(r.IDs, c.ID)
				r.Status = append(r.Status, string(c.Status))
				r.Errors = append(r.Errors, c.Error)
				var v int
				if c.Result != nil {
					if err := c.Decode(&v); err != nil {
						return gendurable.Outcome{}, err
					}
				}
				r.Results = append(r.Results, v)
			}
			return gendurable.Done(r), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{parent, square, double}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	p, err := cl.Insert(ctx, parent.With(res{}), nil)
	require.NoError(t, err)
	kit.Drain(ctx)
	var got res
	kit.RequireDone(ctx, p.ID, &got)
	require.Len(t, got.IDs, 3)
	require.True(t, sort.SliceIsSorted(got.IDs, func(i, j int) bool { return got.IDs[i] < got.IDs[j] }))
	byID := map[int64]int{}
	for i, id := range got.IDs {
		byID[id] = i
	}
	// Children keep their own options.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND queue = 'q2' AND priority = 1`, p.ID))
	require.ElementsMatch(t, []string{"done", "done", "failed"}, got.Status)
	require.ElementsMatch(t, []int{9, 16, 0}, got.Results)
	require.Contains(t, got.Errors, "negative")
}

func TestBadSpawnRoutesToHandleWithTheStateUnchanged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, priceLine := fanoutMachines("lines")
	noStart := gendurable.FSM[int]{Name: "broken", Start: "missing", Steps: map[string]gendurable.StepFunc[int]{
		"s": func(*gendurable.Ctx, int) (gendurable.Outcome, error) { return gendurable.Done(nil), nil }}}
	nan := gendurable.Job[float64]{Name: "nan", Perform: func(*gendurable.Ctx, float64) error { return nil }}
	spawns := map[string]func() gendurable.Outcome{
		"unknownjoin": func() gendurable.Outcome {
			return gendurable.Spawn([]gendurable.Child{{Input: priceLine.With(line{})}}, "nowhere", basket{Total: 99})
		},
		"badchildstep": func() gendurable.Outcome {
			return gendurable.Spawn([]gendurable.Child{{Input: noStart.With(1)}}, "join", basket{Total: 99})
		},
		"unencodable": func() gendurable.Outcome {
			return gendurable.Spawn([]gendurable.Child{{Input: nan.With(math.NaN())}}, "join", basket{Total: 99})
		},
		"toomany": func() gendurable.Outcome {
			kids := make([]gendurable.Child, 6)
			for i := range kids {
				kids[i] = gendurable.Child{Input: priceLine.With(line{})}
			}
			return gendurable.Spawn(kids, "join", basket{Total: 99})
		},
		"badopts": func() gendurable.Outcome {
			return gendurable.Spawn([]gendurable.Child{{Input: priceLine.With(line{}), Opts: &gendurable.InsertOpts{Priority: 77}}}, "join", basket{Total: 99})
		},
		"scope": func() gendurable.Outcome {
			return gendurable.Spawn([]gendurable.Child{{Input: priceLine.With(line{}), Opts: &gendurable.InsertOpts{CorrelationKey: "k",
				CorrelationScope: []gendurable.Status{gendurable.StatusDone}}}}, "join", basket{Total: 99})
		},
	}
	steps := map[string]gendurable.StepFunc[basket]{
		"join": func(*gendurable.Ctx, basket) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}
	for name, f := range spawns {
		steps[name] = func(*gendurable.Ctx, basket) (gendurable.Outcome, error) { return f(), nil }
	}
	var handled atomic.Int64
	m := gendurable.FSM[basket]{Name: "badspawn", Start: "join", Steps: steps,
		Handle: func(ctx *gendurable.Ctx, b basket, err error) gendurable.Outcome {
			handled.Add(1)
			return gendurable.Stop(err)
		}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m, priceLine, nan}, MaxChildren: 5})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	ids := map[string]int64{}
	for name := range spawns {
		mm := m
		mm.Start = name
		r, err := cl.Insert(ctx, mm.With(basket{Total: 1}), nil)
		require.NoError(t, err)
		ids[name] = r.ID
	}
	kit.Drain(ctx)
	require.Equal(t, int64(len(spawns)), handled.Load())
	for name, id := range ids {
		in := kit.RequireFailed(ctx, id)
		require.Equal(t, "outcome", in.Errors[0].Kind, name)
		require.JSONEq(t, `{"lines": null, "total": 1, "failed": 0, "joins": 0, "wave": 0, "waves": 0}`, string(in.State), name)
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id IS NOT NULL`), "no child was started")
	require.Contains(t, kit.Get(ctx, ids["toomany"]).Errors[0].Error, "MaxChildren")
}

func TestChildWithATakenKeyIsNotCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	order, priceLine := fanoutMachines("lines")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{order, priceLine}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	_, err := cl.Insert(ctx, priceLine.With(line{SKU: "taken"}), &gendurable.InsertOpts{CorrelationKey: "taken", In: time.Hour})
	require.NoError(t, err)
	keyed := gendurable.FSM[basket]{Name: "keyed", Start: "fan_out", Steps: map[string]gendurable.StepFunc[basket]{
		"fan_out": func(*gendurable.Ctx, basket) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{
				{Input: priceLine.With(line{}), Opts: &gendurable.InsertOpts{CorrelationKey: "taken"}},
				{Input: priceLine.With(line{}), Opts: &gendurable.InsertOpts{CorrelationKey: "free"}},
			}, "join", basket{}), nil
		},
		"join": func(ctx *gendurable.Ctx, b basket) (gendurable.Outcome, error) {
			b.Total = len(ctx.Children)
			return gendurable.Done(b), nil
		},
	}}
	cl2 := e.client(t, &gendurable.Config{Name: "k", Machines: []gendurable.Machine{keyed, priceLine}})
	r, err := cl2.Insert(ctx, keyed.With(basket{}), nil)
	require.NoError(t, err)
	_ = cl
	kit2 := durabletest.New(t, cl2, nil)
	_, err = kit2.TryDrain(ctx, &durabletest.DrainOpts{KeepDelays: true})
	require.NoError(t, err)
	var b basket
	kit.RequireDone(ctx, r.ID, &b)
	require.Equal(t, 1, b.Total, "the child whose key was taken was not started, and the parent joined on the other")
}

func TestTenThousandChildrenAcrossTwoQueuesAndTwoClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var joins atomic.Int64
	type big struct {
		N       int `json:"n"`
		Results int `json:"results"`
		Sum     int `json:"sum"`
	}
	child := gendurable.FSM[int]{Name: "kid", Start: "go", Steps: map[string]gendurable.StepFunc[int]{
		"go": func(_ *gendurable.Ctx, n int) (gendurable.Outcome, error) { return gendurable.Done(n), nil },
	}}
	parent := gendurable.FSM[big]{Name: "big", Start: "spawn", Queue: "parents", Steps: map[string]gendurable.StepFunc[big]{
		"spawn": func(_ *gendurable.Ctx, b big) (gendurable.Outcome, error) {
			kids := make([]gendurable.Child, b.N)
			for i := range kids {
				kids[i] = gendurable.Child{Input: child.With(i), Opts: &gendurable.InsertOpts{Queue: fmt.Sprint("kids", i%2)}}
			}
			return gendurable.Spawn(kids, "join", b), nil
		},
		"join": func(ctx *gendurable.Ctx, b big) (gendurable.Outcome, error) {
			joins.Add(1)
			for _, c := range ctx.Children {
				var v int
				if err := c.Decode(&v); err != nil {
					return gendurable.Outcome{}, err
				}
				if c.Status == gendurable.StatusDone {
					b.Results++
					b.Sum += v
				}
			}
			return gendurable.Done(b), nil
		},
	}}
	machines := []gendurable.Machine{parent, child}
	a := e.client(t, &gendurable.Config{Name: "a", Machines: machines,
		Queues: map[string]gendurable.QueueConfig{"parents": {}, "kids0": {Concurrency: 50}}})
	b := e.client(t, &gendurable.Config{Name: "b", Machines: machines,
		Queues: map[string]gendurable.QueueConfig{"kids1": {Concurrency: 50}}})
	start(t, a)
	start(t, b)
	ctx := context.Background()
	const n = 10_000
	r, err := a.Insert(ctx, parent.With(big{N: n}), nil)
	require.NoError(t, err)
	eventually(t, 2*time.Minute, "the parent done", func() bool {
		in, err := a.Get(ctx, r.ID)
		require.NoError(t, err)
		return in.Status == gendurable.StatusDone
	})
	in, err := a.Get(ctx, r.ID)
	require.NoError(t, err)
	var got big
	require.NoError(t, jsonUnmarshal(in.Result, &got))
	require.Equal(t, n, got.Results)
	require.Equal(t, n*(n-1)/2, got.Sum)
	require.Equal(t, int64(1), joins.Load(), "joined exactly once")
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND status = 'done'`, r.ID))
	require.Equal(t, 2, e.count(t, `SELECT count(DISTINCT queue) FROM {schema}.instances WHERE parent_id = $1`, r.ID))
}

func TestConcurrentChildrenSettleEachParentExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	order, priceLine := fanoutMachines("lines")
	var joins atomic.Int64
	charge := order.Steps["charge"]
	order.Steps["charge"] = func(ctx *gendurable.Ctx, b basket) (gendurable.Outcome, error) {
		joins.Add(1)
		return charge(ctx, b)
	}
	machines := []gendurable.Machine{order, priceLine}
	// Eight workers settle the children of the same parents at the same time.
	for i := range 8 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprint("w", i), Machines: machines,
			Queues: map[string]gendurable.QueueConfig{"lines": {Concurrency: 8}, gendurable.DefaultQueue: {Concurrency: 2}}})
		start(t, cl)
	}
	ins := e.client(t, &gendurable.Config{Name: "inserter", Machines: machines})
	ctx := context.Background()
	parents, kids := oracle.Size(20, 40), 60
	params := make([]gendurable.InsertManyParams, parents)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: order.With(basket{Lines: lines(kids, 7), Waves: 1})}
	}
	_, err := ins.InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 2*time.Minute, "all parents done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'basket' AND status = 'done'`) == parents
	})
	require.Equal(t, int64(parents), joins.Load(), "every parent's join step ran exactly once")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'basket'
		AND (pending_children <> 0 OR (result->>'joins')::int <> 1 OR (result->>'total')::int + (result->>'failed')::int <> $1)`, kids))
	require.Equal(t, parents*kids, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id IS NOT NULL AND status IN ('done', 'failed')`))
}

func TestNestedFanOutThreeLevelsDeep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	type node struct {
		Depth int `json:"depth"`
		Leafs int `json:"leafs"`
	}
	var tree gendurable.FSM[node]
	tree = gendurable.FSM[node]{Name: "tree", Start: "grow", Steps: map[string]gendurable.StepFunc[node]{
		"grow": func(_ *gendurable.Ctx, n node) (gendurable.Outcome, error) {
			if n.Depth == 3 {
				return gendurable.Done(node{Depth: 3, Leafs: 1}), nil
			}
			kids := make([]gendurable.Child, 3)
			for i := range kids {
				kids[i] = gendurable.Child{Input: tree.With(node{Depth: n.Depth + 1})}
			}
			return gendurable.Spawn(kids, "sum", n), nil
		},
		"sum": func(ctx *gendurable.Ctx, n node) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				var k node
				if err := c.Decode(&k); err != nil {
					return gendurable.Outcome{}, err
				}
				n.Leafs += k.Leafs
			}
			return gendurable.Done(n), nil
		},
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{tree},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 8}}})
	start(t, cl)
	ctx := context.Background()
	r, err := cl.Insert(ctx, tree.With(node{}), nil)
	require.NoError(t, err)
	eventually(t, 30*time.Second, "the root done", func() bool {
		in, _ := cl.Get(ctx, r.ID)
		return in.Status == gendurable.StatusDone
	})
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"depth": 0, "leafs": 27}`, string(in.Result))
	require.Equal(t, 1+3+9+27, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`))
}

func TestChildrenOfAFinishedParentRunOnAndWakeNobody(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	order, priceLine := fanoutMachines("lines")
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{order, priceLine}})
	kit := durabletest.New(t, cl, nil)
	ctx := context.Background()
	r, err := cl.Insert(ctx, order.With(basket{Lines: lines(5, 0), Waves: 1}), nil)
	require.NoError(t, err)
	_, err = kit.TryDrain(ctx, &durabletest.DrainOpts{Queues: []string{gendurable.DefaultQueue}})
	require.NoError(t, err)
	kit.RequireStatus(ctx, r.ID, gendurable.StatusJoining)
	// An operator ends the parent while its children are still live.
	e.exec(t, `UPDATE {schema}.instances SET status = 'cancelled', finalized_at = now() WHERE id = $1`, r.ID)
	kit.Drain(ctx)
	require.Equal(t, 5, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND status = 'done'`, r.ID),
		"the children finish")
	in := kit.RequireStatus(ctx, r.ID, gendurable.StatusCancelled)
	require.Equal(t, "charge", in.Step, "and their completion wakes nobody")
	require.Equal(t, 5, e.count(t, `SELECT pending_children FROM {schema}.instances WHERE id = $1`, r.ID))
}
