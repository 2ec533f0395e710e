//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/stretchr/testify/require"
)

// staleCounter counts outcome.stale events by client.
type staleCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *staleCounter) hook(name string) func(gendurable.Event) {
	return func(ev gendurable.Event) {
		if ev.Name == gendurable.EventOutcomeStale {
			s.mu.Lock()
			if s.n == nil {
				s.n = map[string]int{}
			}
			s.n[name]++
			s.mu.Unlock()
		}
	}
}

func (s *staleCounter) get(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[name]
}

func (s *staleCounter) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.n {
		n += v
	}
	return n
}

// kid is the T2 variants' machine: "wait" parks on "ping", "work" finishes, naming its runner.
type kidState struct {
	By string `json:"by,omitempty"`
}

func kidFSM(by string) gendurable.FSM[kidState] {
	return gendurable.FSM[kidState]{Name: "kid", Start: "wait", Queue: "q", Steps: map[string]gendurable.StepFunc[kidState]{
		"wait": func(ctx *gendurable.Ctx, k kidState) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"ping"}, "work", kidState{By: by}), nil
		},
		"work": func(ctx *gendurable.Ctx, k kidState) (gendurable.Outcome, error) {
			return gendurable.Done(kidState{By: by}), nil
		},
	}}
}

// t2 is the set-up every T2 variant shares: worker A (one slot, no reaper), whose outcomes the
// test holds at before_outcome (and await_between_stmts) and whose heartbeat it can fail, and a
// fresh worker B per iteration, whose reaper takes A's expired claim over.
type t2 struct {
	t             *testing.T
	e             *env
	a             *gendurable.Client
	stale         staleCounter
	beforeOutcome holds
	between       holds
	hbFail        atomic.Bool
	bMachines     func(by string, release <-chan struct{}) []gendurable.Machine
}

func newT2(t *testing.T, e *env, aMachines []gendurable.Machine, bMachines func(by string, release <-chan struct{}) []gendurable.Machine) *t2 {
	x := &t2{t: t, e: e, bMachines: bMachines}
	x.a = e.client(t, &gendurable.Config{Name: "a", Machines: aMachines, PollInterval: time.Hour,
		Lease: 5 * time.Second, Heartbeat: 500 * time.Millisecond, Poke: gendurable.PokePostgres(),
		Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1}}, Hooks: []func(gendurable.Event){x.stale.hook("a")}})
	t.Cleanup(fault.Set(fault.BeforeOutcome, x.beforeOutcome.hook("a:")))
	t.Cleanup(fault.Set(fault.AwaitBetweenStmts, x.between.hook("a:")))
	t.Cleanup(fault.Set(fault.Heartbeat, func(subject string) error {
		if subject == "a" && x.hbFail.Load() {
			return errors.New("test: A's heartbeat is held")
		}
		return nil
	}))
	start(t, x.a)
	return x
}

// startB starts worker B of iteration i; release unblocks whatever its machines wait for.
func (x *t2) startB(i int, release <-chan struct{}) (name string, stop func()) {
	name = fmt.Sprint("b", i)
	// B's lease outlasts a loaded machine's stalls: with 1s, beats held up that long let B's own
	// reaper release B's claim, and the test waited in vain for B's lease to be extended.
	b := x.e.client(x.t, &gendurable.Config{Name: name, Machines: x.bMachines(name, release), PollInterval: time.Hour,
		Lease: 10 * time.Second, Heartbeat: 50 * time.Millisecond, Poke: gendurable.PokePostgres(),
		Reaper: &gendurable.ReaperConfig{Interval: 10 * time.Millisecond}, GC: &gendurable.GCConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 4}}, Hooks: []func(gendurable.Event){x.stale.hook(name)}})
	return name, start(x.t, b)
}

func (x *t2) reach(g *gate, what string) {
	x.t.Helper()
	select {
	case <-g.reached:
	case <-time.After(15 * time.Second):
		x.t.Fatalf("A never reached %s", what)
	}
}

// expire makes A's claim of id look abandoned: its lease is over, and A's heartbeat, held
// failing, cannot extend it again.
func (x *t2) expire(id int64) {
	x.hbFail.Store(true)
	x.e.exec(x.t, `UPDATE {schema}.instances SET locked_until = now() - interval '1 second' WHERE id = $1 AND locked_by LIKE 'a:%'`, id)
}

type rowView struct {
	Status, Step, LockedBy, By string
	I                          int
	LockedUntil                time.Time
}

func (x *t2) row(id int64) rowView {
	x.t.Helper()
	var v rowView
	require.NoError(x.t, x.e.side.QueryRow(context.Background(), x.e.q(`SELECT status::text, step, coalesce(locked_by, ''),
		coalesce(coalesce(result, state)->>'by', ''), coalesce((state->>'i')::int, 0), coalesce(locked_until, 'epoch')
		FROM {schema}.instances WHERE id = $1`), id).Scan(&v.Status, &v.Step, &v.LockedBy, &v.By, &v.I, &v.LockedUntil))
	return v
}

// waitStale waits until the stale count of client reaches n.
func (x *t2) waitStale(client string, n int) {
	x.t.Helper()
	eventually(x.t, 15*time.Second, "A's outcome dropped as stale", func() bool { return x.stale.get(client) >= n })
}

// T2: a worker that lost its claim (its lease ran out; another worker took the row over and moved
// it on) commits its late outcome. The commit must be dropped: the row keeps the new owner's
// state, outcome.stale fires exactly once, and the new owner's heartbeat still extends its lease.
func TestChaosStaleWorkerCannotOverwrite(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 24)
	ctx := context.Background()
	bHolds := sync.Map{} // instance id -> release channel for B's step s1
	holdB := func(ctx *gendurable.Ctx) error {
		if ch, ok := bHolds.Load(ctx.ID); ok && ctx.Step == "s1" {
			<-ch.(chan struct{})
		}
		return nil
	}
	x := newT2(t, e, []gendurable.Machine{linear5(e, "q", "a", nil)}, func(by string, _ <-chan struct{}) []gendurable.Machine {
		return []gendurable.Machine{linear5(e, "q", by, holdB)}
	})
	n := oracle.Size(40, 100)
	for i := range n {
		h := x.beforeOutcome.arm()
		res, err := x.a.Insert(ctx, linear5(e, "q", "a", nil).With(path{}), nil)
		require.NoError(t, err)
		id := res.ID
		x.reach(h, "before_outcome") // A ran s0; its outcome (s0 -> s1) waits
		x.expire(id)
		release := make(chan struct{})
		bHolds.Store(id, release)
		name, stopB := x.startB(i, nil)
		// B's reaper released the row, B ran s0 and committed s0 -> s1, and now runs s1 (held).
		eventually(t, 15*time.Second, "B running s1", func() bool {
			v := x.row(id)
			return v.Status == "executing" && v.Step == "s1" && strings.HasPrefix(v.LockedBy, name+":")
		})
		held := x.row(id)
		close(h.release)
		x.waitStale("a", i+1)
		v := x.row(id)
		require.Equal(t, name, v.By, "the row keeps B's state")
		require.Equal(t, 1, v.I)
		require.Equal(t, "s1", v.Step)
		require.Equal(t, held.LockedBy, v.LockedBy, "B still owns the claim")
		// B's heartbeat (every 50ms) still extends B's lease.
		eventually(t, 5*time.Second, "B's lease extended", func() bool {
			w := x.row(id)
			return w.LockedBy == held.LockedBy && w.LockedUntil.After(v.LockedUntil)
		})
		close(release)
		eventually(t, 15*time.Second, "the instance done", func() bool { return x.row(id).Status == "done" })
		stopB()
		x.hbFail.Store(false)
		require.Equal(t, i+1, x.stale.total(), "outcome.stale fired exactly once per iteration")
	}
	e.check(t, oracle.Opts{N: n, Effects: true, Counter: true, Path: linearPath}, oracle.Summary{Instances: n, Faults: n})
}

// T2, terminal variant: the late outcome finishes the instance (Done), which has an inbox and a
// parent waiting on it. The new owner's Done purges the inbox and settles the parent's join;
// the late one must do neither again: the join counter drops once per child.
func TestChaosStaleTerminalOutcomeSettlesTheParentOnce(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 24)
	ctx := context.Background()
	type famState struct {
		Done int `json:"done"`
	}
	fam := gendurable.FSM[famState]{Name: "fam", Start: "spawn", Queue: "p", Steps: map[string]gendurable.StepFunc[famState]{
		"spawn": func(*gendurable.Ctx, famState) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{
				{Input: kidFSM("c").With(kidState{}), Opts: &gendurable.InsertOpts{Queue: "q"}},
				{Input: kidFSM("c").With(kidState{}), Opts: &gendurable.InsertOpts{Queue: "z"}},
			}, "join", famState{}), nil
		},
		"join": func(ctx *gendurable.Ctx, f famState) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				if c.Status == gendurable.StatusDone {
					f.Done++
				}
			}
			return gendurable.Done(f), nil
		},
	}}
	c := e.client(t, &gendurable.Config{Name: "c", Machines: []gendurable.Machine{fam, kidFSM("c")}, PollInterval: time.Hour,
		Poke: gendurable.PokePostgres(), Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"p": {Concurrency: 2}, "z": {Concurrency: 2}}})
	start(t, c)
	x := newT2(t, e, []gendurable.Machine{kidFSM("a")}, func(by string, _ <-chan struct{}) []gendurable.Machine {
		return []gendurable.Machine{kidFSM(by)}
	})
	n := oracle.Size(30, 100)
	for i := range n {
		res, err := c.Insert(ctx, fam.With(famState{}), nil)
		require.NoError(t, err)
		parent := res.ID
		var kidX, kidZ int64
		eventually(t, 15*time.Second, "both children parked", func() bool {
			return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND status = 'awaiting'`, parent) == 2
		})
		require.NoError(t, e.side.QueryRow(ctx, e.q(`SELECT max(id) FILTER (WHERE queue = 'q'), max(id) FILTER (WHERE queue = 'z')
			FROM {schema}.instances WHERE parent_id = $1`), parent).Scan(&kidX, &kidZ))
		h := x.beforeOutcome.arm()
		// X gets a signal it does not await (it stays in the inbox: the terminal outcome purges
		// it) and the one that wakes it; A runs "work" and its Done waits.
		_, err = c.Signal(ctx, gendurable.ByID(kidX), "extra", nil)
		require.NoError(t, err)
		_, err = c.Signal(ctx, gendurable.ByID(kidX), "ping", nil)
		require.NoError(t, err)
		x.reach(h, "before_outcome")
		x.expire(kidX)
		name, stopB := x.startB(i, nil)
		eventually(t, 15*time.Second, "B finished X", func() bool { return x.row(kidX).Status == "done" })
		require.Equal(t, name, x.row(kidX).By)
		require.Equal(t, 1, e.count(t, `SELECT pending_children FROM {schema}.instances WHERE id = $1`, parent))
		require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, kidX), "B's Done purged the inbox")
		logged := e.count(t, `SELECT count(*) FROM {schema}.t_outcome_log WHERE id IN ($1, $2)`, kidX, parent)
		close(h.release)
		x.waitStale("a", i+1)
		require.Equal(t, name, x.row(kidX).By, "X keeps B's result")
		require.Equal(t, 1, e.count(t, `SELECT pending_children FROM {schema}.instances WHERE id = $1`, parent),
			"the late Done did not settle the parent's join again")
		require.Equal(t, "joining", x.row(parent).Status)
		require.Equal(t, logged, e.count(t, `SELECT count(*) FROM {schema}.t_outcome_log WHERE id IN ($1, $2)`, kidX, parent),
			"the late Done changed neither X nor its parent")
		// Z finishes: the parent joins, once.
		_, err = c.Signal(ctx, gendurable.ByID(kidZ), "ping", nil)
		require.NoError(t, err)
		eventually(t, 15*time.Second, "the parent done", func() bool { return x.row(parent).Status == "done" })
		require.JSONEq(t, `{"done": 2}`, string(must(x.a.Get(ctx, parent)).Result))
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.t_outcome_log WHERE id = $1 AND old_status = 'joining'
			AND new_status = 'available'`, parent), "the parent woke exactly once")
		stopB()
		x.hbFail.Store(false)
		require.Equal(t, i+1, x.stale.total())
	}
	e.check(t, oracle.Opts{N: 3 * n}, oracle.Summary{Instances: 3 * n, Faults: n})
}

// T2, mid-Await variant: the late outcome parks the instance (Await). It is dropped at its
// first statement, and the park's second one (the inbox re-check), which the test holds at
// await_between_stmts while the new owner parks the row and a signal arrives or not, must
// neither strand nor double-wake it.
func TestChaosStaleParkMidAwait(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 24)
	ctx := context.Background()
	x := newT2(t, e, []gendurable.Machine{kidFSM("a")}, func(by string, _ <-chan struct{}) []gendurable.Machine {
		return []gendurable.Machine{kidFSM(by)}
	})
	n := oracle.Size(30, 100)
	for i := range n {
		h0, h1 := x.beforeOutcome.arm(), x.between.arm()
		res, err := x.a.Insert(ctx, kidFSM("a").With(kidState{}), nil)
		require.NoError(t, err)
		id := res.ID
		x.reach(h0, "before_outcome") // A ran "wait"; its park waits
		x.expire(id)
		name, stopB := x.startB(i, nil)
		eventually(t, 15*time.Second, "B parked X", func() bool {
			v := x.row(id)
			return v.Status == "awaiting" && v.By == name
		})
		close(h0.release)
		x.reach(h1, "await_between_stmts") // A's park statement matched nothing (stale)
		require.Equal(t, name, x.row(id).By, "A's stale park left B's")
		if i%2 == 0 {
			// The signal lands while A's stale transaction sits between its statements.
			_, err = x.a.Signal(ctx, gendurable.ByID(id), "ping", nil)
			require.NoError(t, err)
			eventually(t, 15*time.Second, "X done", func() bool { return x.row(id).Status == "done" })
			close(h1.release)
		} else {
			close(h1.release)
			x.waitStale("a", i+1)
			require.Equal(t, "awaiting", x.row(id).Status, "A's re-check woke nothing")
			_, err = x.a.Signal(ctx, gendurable.ByID(id), "ping", nil)
			require.NoError(t, err)
			eventually(t, 15*time.Second, "X done", func() bool { return x.row(id).Status == "done" })
		}
		x.waitStale("a", i+1)
		stopB()
		x.hbFail.Store(false)
		require.Equal(t, i+1, x.stale.total())
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.t_outcome_log WHERE id = $1 AND old_status = 'awaiting'
			AND new_status = 'available'`, id), "woken exactly once")
	}
	require.Equal(t, 0, e.stranded(t))
	e.check(t, oracle.Opts{N: n}, oracle.Summary{Instances: n, Faults: 2 * n})
}

// A worker's heartbeat reports a claim lost by the row's id. If the same worker has claimed that
// row again meanwhile (its late outcome of the old claim still on its way, the reaper released
// the row, its scheduler picked it again), the report is about the old claim only: the new
// step, whose claim is valid, must not be cancelled.
//
// The interleaving: the beat collects the old claim, then waits at the heartbeat point; the old
// outcome is held at await_between_stmts (a committer, not the executor slot); the row is
// released and picked again, and its new step runs; then the beat goes on and finds the old
// claim gone.
func TestChaosHeartbeatLostForAnOldClaimSparesTheNewOne(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 16)
	ctx := context.Background()
	var runs atomic.Int64
	cancelled := make(chan error, 1)
	releaseNew := make(chan struct{})
	m := gendurable.FSM[kidState]{Name: "kid", Start: "wait", Queue: "q", Steps: map[string]gendurable.StepFunc[kidState]{
		"wait": func(ctx *gendurable.Ctx, k kidState) (gendurable.Outcome, error) {
			if runs.Add(1) == 2 { // the second claim: hold the step, watching its context
				select {
				case <-ctx.Done():
					cancelled <- context.Cause(ctx)
				case <-releaseNew:
				}
			}
			return gendurable.Await([]string{"ping"}, "work", k), nil
		},
		"work": func(ctx *gendurable.Ctx, k kidState) (gendurable.Outcome, error) { return gendurable.Done(k), nil },
	}}
	var before, between holds
	defer fault.Set(fault.BeforeOutcome, before.hook("a:"))()
	defer fault.Set(fault.AwaitBetweenStmts, between.hook("a:"))()
	var beat atomic.Pointer[gate]
	defer fault.Set(fault.Heartbeat, func(subject string) error {
		if g := beat.Swap(nil); g != nil && subject == "a" {
			close(g.reached)
			<-g.release
		}
		return nil
	})()
	// A long lease: the new claim must outlive a loaded machine's slow beats while the test
	// holds one (the first claim's lease is ended by hand below).
	a := e.client(t, &gendurable.Config{Name: "a", Machines: []gendurable.Machine{m}, PollInterval: 20 * time.Millisecond,
		Lease: 30 * time.Second, Heartbeat: 100 * time.Millisecond, Reaper: &gendurable.ReaperConfig{Disabled: true},
		GC: &gendurable.GCConfig{Disabled: true}, Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 2}}})
	start(t, a)
	// A maintenance-only node: its reaper releases expired claims.
	maint := e.client(t, &gendurable.Config{Name: "m", Reaper: &gendurable.ReaperConfig{Interval: 10 * time.Millisecond},
		GC: &gendurable.GCConfig{Disabled: true}})

	h0, h1 := before.arm(), between.arm()
	var once0, once1, onceNew sync.Once
	release0 := func() { once0.Do(func() { close(h0.release) }) }
	release1 := func() { once1.Do(func() { close(h1.release) }) }
	releaseNewStep := func() { onceNew.Do(func() { close(releaseNew) }) }
	defer release0()
	defer release1()
	defer releaseNewStep()
	res, err := a.Insert(ctx, m.With(kidState{}), nil)
	require.NoError(t, err)
	id := res.ID
	select {
	case <-h0.reached: // the first claim's step ran; its park waits
	case <-time.After(10 * time.Second):
		t.Fatal("no first claim")
	}
	g := newGate()
	var onceBeat sync.Once
	defer onceBeat.Do(func() { close(g.release) })
	beat.Store(g)
	select {
	case <-g.reached: // a beat has collected the first claim and waits
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat")
	}
	e.exec(t, `UPDATE {schema}.instances SET locked_until = now() - interval '1 second' WHERE id = $1`, id)
	start(t, maint)
	// The release counts a recovery; the row is available only until A's free slot claims it
	// again (one poll), so the count is the lasting sign, not the status.
	eventually(t, 10*time.Second, "the reaper released the first claim", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND recoveries = 1`, id) == 1
	})
	release0() // the late park goes to a committer and waits between its statements
	select {
	case <-h1.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the late park never reached await_between_stmts")
	}
	eventually(t, 10*time.Second, "A claimed the row again", func() bool { return runs.Load() == 2 })
	onceBeat.Do(func() { close(g.release) }) // the beat finds the first claim gone
	select {
	case cause := <-cancelled:
		t.Fatalf("the new claim's step was cancelled (%v) by the heartbeat's report on the old claim", cause)
	case <-time.After(800 * time.Millisecond): // several beats
	}
	releaseNewStep()
	release1()
	eventually(t, 10*time.Second, "parked by the new claim", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'awaiting' AND attempt = 0`, id) == 1
	})
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND errors IS NOT NULL
		AND jsonb_array_length(errors) > 1`, id), "no step error besides the lease")
}
