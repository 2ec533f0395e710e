package gendurable_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/gendurable/gendurable/internal/bridge"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The model machine of T18: s0 parks on "go" (with a deadline); s1, woken by "go", moves on to s2,
// and woken by its deadline parks again; s2 fails on a "stop" in the inbox, retries its first
// attempt, and finishes with its counter. Every step moves the counter I on.
const modelMaxAttempts = 3

// modelMaxRecoveries is the model's reaper's MaxRecoveries: small, so that checks reach it.
const modelMaxRecoveries = 2

type modelState struct {
	I int `json:"i"`
}

func modelFSM() gendurable.FSM[modelState] {
	park := func(s modelState) gendurable.Outcome {
		return gendurable.Await([]string{"go"}, "s1", s, gendurable.Timeout(time.Hour))
	}
	return gendurable.FSM[modelState]{Name: "model", Start: "s0", MaxAttempts: modelMaxAttempts,
		Steps: map[string]gendurable.StepFunc[modelState]{
			"s0": func(_ *gendurable.Ctx, s modelState) (gendurable.Outcome, error) {
				s.I++
				return park(s), nil
			},
			"s1": func(ctx *gendurable.Ctx, s modelState) (gendurable.Outcome, error) {
				s.I++
				if len(ctx.Awaited) > 0 {
					return gendurable.Next("s2", s), nil
				}
				return park(s), nil
			},
			"s2": func(ctx *gendurable.Ctx, s modelState) (gendurable.Outcome, error) {
				s.I++
				for _, sig := range ctx.Inbox {
					if sig.Name == "stop" {
						return gendurable.Stop(errors.New("stopped by signal")), nil
					}
				}
				if ctx.Attempt == 1 {
					return gendurable.Retry(time.Hour), nil
				}
				return gendurable.Done(s), nil
			},
		}}
}

// inst is the pure Go model of one instance: what the engine must show after every action.
type inst struct {
	id          int64
	status      gendurable.Status
	step        string
	attempt     int
	recoveries  int
	i           int
	result      int
	inbox       []string
	awaitNames  []string
	hasDeadline bool
}

func (m *inst) live() bool {
	switch m.status {
	case gendurable.StatusAvailable, gendurable.StatusExecuting, gendurable.StatusAwaiting, gendurable.StatusJoining:
		return true
	}
	return false
}

func (m *inst) finish(status gendurable.Status) {
	m.status, m.inbox = status, nil
}

// park applies Await({"go"}, "s1", Timeout): commit the counter, park with a deadline, and wake
// at once if a "go" is already in the inbox (the park's re-check).
func (m *inst) park(i int) {
	m.i, m.step, m.attempt, m.recoveries, m.status = i, "s1", 0, 0, gendurable.StatusAwaiting
	m.awaitNames, m.hasDeadline = []string{"go"}, true
	if slices.Contains(m.inbox, "go") {
		m.status = gendurable.StatusAvailable
	}
}

// consume removes the signals the step saw on Ctx.Awaited: those of the inbox whose names the
// claimed row awaited.
func (m *inst) consume(awaited []string) {
	m.inbox = slices.DeleteFunc(m.inbox, func(n string) bool { return slices.Contains(awaited, n) })
}

// drainOne runs the one runnable step, as the engine must.
func (m *inst) drainOne() {
	m.attempt++
	var awaited []string
	for _, n := range m.inbox {
		if slices.Contains(m.awaitNames, n) {
			awaited = append(awaited, n)
		}
	}
	switch m.step {
	case "s0":
		m.consume(awaited)
		m.park(m.i + 1)
	case "s1":
		m.consume(awaited)
		if len(awaited) > 0 {
			m.i, m.step, m.attempt, m.recoveries, m.status, m.awaitNames, m.hasDeadline = m.i+1, "s2", 0, 0, gendurable.StatusAvailable, nil, false
		} else {
			m.park(m.i + 1)
		}
	case "s2":
		switch {
		case slices.Contains(m.inbox, "stop"):
			m.finish(gendurable.StatusFailed)
		case m.attempt == 1 && m.attempt >= modelMaxAttempts:
			m.finish(gendurable.StatusFailed)
		case m.attempt == 1:
			m.status, m.hasDeadline = gendurable.StatusAvailable, false
		default:
			m.result = m.i + 1
			m.finish(gendurable.StatusDone)
		}
	}
}

// model is every instance of one check, all of one machine and one correlation key, so at most
// one of them is live at a time (the key's unique index).
type model struct {
	all  map[int64]*inst
	gone []int64 // deleted by GC
}

// live returns the live instance, or nil.
func (m *model) live() *inst {
	for _, in := range m.all {
		if in.live() {
			return in
		}
	}
	return nil
}

// target draws the id an action addresses: one of the check's instances, or one that does not
// exist.
func (m *model) target(rt *rapid.T) int64 {
	ids := []int64{1 << 50}
	for id := range m.all {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return rapid.SampledFrom(ids).Draw(rt, "id")
}

// modelEnv is the real side: a client that is never started, drained inline.
type modelEnv struct {
	e      *env
	cl     *gendurable.Client
	kit    *durabletest.Kit
	st     *store.Store
	reaper *maintenance.Reaper
	tokens []string
	key    string
}

// TestModelOneInstance is docs/reliability.md T18: random action sequences on the instances of one
// machine and one correlation key (Insert, Signal, DrainOne, FireTimeouts, CrashReclaim,
// StaleCommit, GC, and the operator's Cancel and Retry), run on the real engine in inline Drain
// mode against Postgres, compared with the pure model after every action. 100 checks by default;
// GD_CHAOS=full runs 10,000 (or set -rapid.checks / RAPID_CHECKS). rapid shrinks a failure to its
// shortest action list and prints how to replay it (-rapid.seed, -rapid.failfile).
func TestModelOneInstance(t *testing.T) {
	if !rapidChecksSet() {
		n := 100
		if os.Getenv("GD_CHAOS") == "full" {
			n = 10000
		}
		require.NoError(t, flag.Set("rapid.checks", strconv.Itoa(n)))
	}
	// In parallel with the others once the flag is set: no other test of the package uses rapid.
	t.Parallel()
	e := newEnv(t)
	fsm := modelFSM()
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{fsm}, Lease: time.Minute,
		Logger: slog.New(slog.DiscardHandler)})
	eng, pool := bridge.Engine(cl)
	me := &modelEnv{e: e, cl: cl, kit: durabletest.New(t, cl, nil), st: eng.Store()}
	me.reaper = &maintenance.Reaper{Store: me.st, DB: pool, Interval: time.Hour, Logger: eng.Config().Logger, MaxRecoveries: modelMaxRecoveries,
		Emit: func(gendurable.Event) {}, Wake: func(string) {}}
	started, checks, actions := time.Now(), 0, 0
	ctx := context.Background()
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		// Each check starts from an empty schema, with a key of its own.
		if _, err := pool.Exec(ctx, expand(`DELETE FROM {schema}.instances`, e.schema)); err != nil {
			rt.Fatal(err)
		}
		me.key, me.tokens = fmt.Sprint("check-", checks), nil
		m := &model{all: map[int64]*inst{}}
		rt.Repeat(map[string]func(*rapid.T){
			"Insert": func(rt *rapid.T) {
				res, err := cl.Insert(ctx, fsm.With(modelState{}), &gendurable.InsertOpts{CorrelationKey: me.key})
				if err != nil {
					rt.Fatalf("insert: %v", err)
				}
				live := m.live()
				if res.Duplicate != (live != nil) || (live != nil && res.ID != live.id) {
					rt.Fatalf("insert: duplicate %v id %d; the model's live instance: %+v", res.Duplicate, res.ID, live)
				}
				if live == nil {
					m.all[res.ID] = &inst{id: res.ID, status: gendurable.StatusAvailable, step: "s0"}
				}
			},
			"Signal": func(rt *rapid.T) {
				name := rapid.SampledFrom([]string{"go", "note", "stop"}).Draw(rt, "name")
				var in *inst
				to := gendurable.ByKey("model", me.key)
				if rapid.Bool().Draw(rt, "byKey") {
					in = m.live()
				} else {
					id := m.target(rt)
					to, in = gendurable.ByID(id), m.all[id]
				}
				res, err := cl.Signal(ctx, to, name, map[string]string{"n": name})
				if in == nil || !in.live() {
					if !errors.Is(err, gendurable.ErrNoTarget) {
						rt.Fatalf("signal %q to %v, finished or missing: %v, want ErrNoTarget", name, to, err)
					}
					return
				}
				if err != nil {
					rt.Fatalf("signal %q: %v", name, err)
				}
				wakes := in.status == gendurable.StatusAwaiting && slices.Contains(in.awaitNames, name)
				in.inbox = append(in.inbox, name)
				if wakes {
					in.status = gendurable.StatusAvailable
				}
				if res.Woke != wakes || res.InstanceID != in.id {
					rt.Fatalf("signal %q went to %d (woke %v), the model says %d (woke %v)", name, res.InstanceID, res.Woke, in.id, wakes)
				}
			},
			"DrainOne": func(rt *rapid.T) {
				res, err := me.kit.TryDrain(ctx, &durabletest.DrainOpts{MaxSteps: 1})
				if err != nil && !errors.Is(err, durabletest.ErrMaxSteps) {
					rt.Fatalf("drain: %v", err)
				}
				want := 0
				if in := m.live(); in != nil && in.status == gendurable.StatusAvailable {
					want = 1
					in.drainOne()
				}
				if res.Steps != want {
					rt.Fatalf("drain ran %d steps, the model %d", res.Steps, want)
				}
			},
			"FireTimeouts": func(rt *rapid.T) {
				n := me.kit.FireTimeouts(ctx)
				want := 0
				if in := m.live(); in != nil && in.status == gendurable.StatusAwaiting && in.hasDeadline {
					want, in.status, in.hasDeadline = 1, gendurable.StatusAvailable, false
				}
				if n != want {
					rt.Fatalf("fired %d timeouts, the model %d", n, want)
				}
			},
			"CrashReclaim": func(rt *rapid.T) {
				// A worker claims the row with the production pick and dies; its lease is
				// forced to expire; the reaper's sweep releases the claim.
				token := fmt.Sprintf("dead-%d#%d", checks, len(me.tokens))
				res, err := me.st.Pick(ctx, pool, gendurable.DefaultQueue, 1, token, store.PickOpts{Lease: time.Minute, Horizon: 100 * 365 * 24 * time.Hour})
				if err != nil {
					rt.Fatalf("pick: %v", err)
				}
				in := m.live()
				if in != nil && in.status != gendurable.StatusAvailable {
					in = nil
				}
				if (len(res.Rows) == 1) != (in != nil) {
					rt.Fatalf("the dying worker claimed %d rows, the model's runnable instance: %+v", len(res.Rows), in)
				}
				me.tokens = append(me.tokens, token)
				if _, err := pool.Exec(ctx, expand(`UPDATE {schema}.instances SET locked_until = now() - interval '1 second'
					WHERE locked_by = $1`, e.schema), token); err != nil {
					rt.Fatal(err)
				}
				if _, err := me.reaper.Sweep(ctx); err != nil {
					rt.Fatalf("reaper: %v", err)
				}
				if in != nil {
					// The lost claim costs no attempt; it counts a recovery, and one past the
					// reaper's MaxRecoveries fails the instance.
					in.recoveries++
					if in.recoveries > modelMaxRecoveries {
						in.finish(gendurable.StatusFailed)
					}
				}
			},
			"StaleCommit": func(rt *rapid.T) {
				// A late outcome from a worker that lost its claim (or never had one): fenced out.
				token := "never#0"
				if len(me.tokens) > 0 {
					token = rapid.SampledFrom(me.tokens).Draw(rt, "token")
				}
				applied, _, err := me.st.ApplyOutcomes(ctx, pool, []store.Outcome{{Claim: store.Claim{ID: m.target(rt), Owner: token},
					Kind: store.KindNext, Step: "s2", State: []byte(`{"i": -1}`)}})
				if err != nil {
					rt.Fatalf("stale commit: %v", err)
				}
				if len(applied) != 0 {
					rt.Fatalf("a stale outcome (token %q) was applied", token)
				}
			},
			"GC": func(rt *rapid.T) {
				machines, err := me.st.GCMachines(ctx, pool)
				if err != nil {
					rt.Fatalf("gc: %v", err)
				}
				for _, machine := range machines {
					if _, _, err := me.st.GCInstances(ctx, pool, machine, 0, 100, store.GCCursor{}); err != nil {
						rt.Fatalf("gc: %v", err)
					}
				}
				for id, in := range m.all {
					if !in.live() {
						delete(m.all, id)
						m.gone = append(m.gone, id)
					}
				}
			},
			"Cancel": func(rt *rapid.T) {
				id := m.target(rt)
				err := cl.Cancel(ctx, id, "model")
				in := m.all[id]
				switch {
				case in == nil:
					if !errors.Is(err, gendurable.ErrNotFound) {
						rt.Fatalf("cancel of a missing instance: %v, want ErrNotFound", err)
					}
				case !in.live():
					if !errors.Is(err, gendurable.ErrWrongStatus) {
						rt.Fatalf("cancel of a %s instance: %v, want ErrWrongStatus", in.status, err)
					}
				default:
					if err != nil {
						rt.Fatalf("cancel: %v", err)
					}
					in.finish(gendurable.StatusCancelled)
					in.hasDeadline = false
				}
			},
			"Retry": func(rt *rapid.T) {
				id := m.target(rt)
				err := cl.Retry(ctx, id, nil)
				in := m.all[id]
				switch {
				case in == nil:
					if !errors.Is(err, gendurable.ErrNotFound) {
						rt.Fatalf("retry of a missing instance: %v, want ErrNotFound", err)
					}
				case (in.status != gendurable.StatusFailed && in.status != gendurable.StatusCancelled) || m.live() != nil:
					if !errors.Is(err, gendurable.ErrWrongStatus) {
						rt.Fatalf("retry of a %s instance (live one: %v): %v, want ErrWrongStatus", in.status, m.live() != nil, err)
					}
				default:
					if err != nil {
						rt.Fatalf("retry: %v", err)
					}
					in.status, in.attempt, in.recoveries, in.awaitNames, in.hasDeadline, in.result = gendurable.StatusAvailable, 0, 0, nil, false, 0
				}
			},
			"": func(rt *rapid.T) {
				actions++
				me.compare(rt, m)
			},
		})
	})
	oracle.Report(t, oracle.Summary{Test: "T18 model", Instances: checks, Seconds: time.Since(started).Seconds()})
	t.Logf("%d checks, %d actions compared, in %v", checks, actions, time.Since(started).Round(time.Millisecond))
}

// compare reads every instance of the check and its inbox and fails unless they are what the
// model says; instances GC deleted must be gone.
func (me *modelEnv) compare(rt *rapid.T, m *model) {
	ctx := context.Background()
	for _, id := range m.gone {
		if in := me.kit.Get(ctx, id); in != nil {
			rt.Fatalf("instance %d exists (%s), the model deleted it", id, in.Status)
		}
	}
	var n int
	if err := me.e.pool.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.instances`, me.e.schema)).Scan(&n); err != nil {
		rt.Fatal(err)
	}
	if n != len(m.all) {
		rt.Fatalf("%d instances, the model has %d", n, len(m.all))
	}
	for _, want := range m.all {
		me.compareOne(rt, want)
	}
}

func (me *modelEnv) compareOne(rt *rapid.T, m *inst) {
	ctx := context.Background()
	in := me.kit.Get(ctx, m.id)
	if in == nil {
		rt.Fatalf("instance %d is gone, the model has it %s", m.id, m.status)
		return
	}
	var st modelState
	if err := jsonUnmarshal(in.State, &st); err != nil {
		rt.Fatalf("state: %v", err)
	}
	var inbox []string
	rows, err := me.e.pool.Query(ctx, expand(`SELECT name FROM {schema}.signals WHERE instance_id = $1 ORDER BY id`, me.e.schema), m.id)
	if err != nil {
		rt.Fatalf("inbox: %v", err)
	}
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		inbox = append(inbox, n)
	}
	rows.Close()
	got := fmt.Sprintf("status %s step %s attempt %d recoveries %d i %d inbox %v", in.Status, in.Step, in.Attempt, in.Recoveries, st.I, inbox)
	want := fmt.Sprintf("status %s step %s attempt %d recoveries %d i %d inbox %v", m.status, m.step, m.attempt, m.recoveries, m.i, m.inbox)
	if got != want {
		rt.Fatalf("instance %d:\n engine %s\n model  %s", m.id, got, want)
	}
	if m.status == gendurable.StatusAwaiting {
		if !slices.Equal(in.AwaitNames, m.awaitNames) || (in.AwaitDeadline != nil) != m.hasDeadline {
			rt.Fatalf("instance %d awaits %v (deadline %v), the model %v (deadline %v)", m.id, in.AwaitNames,
				in.AwaitDeadline != nil, m.awaitNames, m.hasDeadline)
		}
	}
	if m.status == gendurable.StatusDone {
		var r modelState
		if err := jsonUnmarshal(in.Result, &r); err != nil || r.I != m.result {
			rt.Fatalf("result %s, the model %d (%v)", in.Result, m.result, err)
		}
	}
	if in.LockedBy != "" {
		rt.Fatalf("instance %d is claimed by %q between actions", m.id, in.LockedBy)
	}
}

// rapidChecksSet says whether the run chose the number of checks itself.
func rapidChecksSet() bool {
	if os.Getenv("RAPID_CHECKS") != "" {
		return true
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	return set
}
