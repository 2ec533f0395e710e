package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// routedErrors remembers the error each instance's Handle last got.
type routedErrors struct {
	mu   sync.Mutex
	byID map[int64]error
}

func (r *routedErrors) get(id int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// badStep is a one-step machine whose step returns an outcome that cannot be applied; its Handle
// records the error and retries once without delay, then stops: two attempts in all.
func badStep(name string, routed *routedErrors, out func(path) gendurable.Outcome) gendurable.FSM[path] {
	return gendurable.FSM[path]{Name: name, Start: "a", MaxAttempts: 2,
		Steps: map[string]gendurable.StepFunc[path]{
			"a": func(_ *gendurable.Ctx, s path) (gendurable.Outcome, error) { return out(s), nil },
			"b": func(_ *gendurable.Ctx, s path) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
		},
		Handle: func(ctx *gendurable.Ctx, _ path, err error) gendurable.Outcome {
			routed.mu.Lock()
			routed.byID[ctx.ID] = err
			routed.mu.Unlock()
			if ctx.Attempt < ctx.MaxAttempts {
				return gendurable.Retry(0)
			}
			return gendurable.Stop(err)
		},
	}
}

// engineTableCounts counts the rows of every table in schema (read from the catalog, so a table
// added later is counted too).
func engineTableCounts(t *testing.T, e *env) map[string]int {
	t.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT c.relname FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY 1`, e.schema)
	require.NoError(t, err)
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	require.Subset(t, tables, []string{"instances", "signals", "gates", "gate_leases", "buckets", "meta"})
	out := map[string]int{}
	for _, name := range tables {
		out[name] = e.count(t, `SELECT count(*) FROM {schema}.`+`"`+name+`"`)
	}
	return out
}

// TestBadInput is docs/reliability.md T14: every bad input of the plan's table and of the issues, each
// answered with its exact error (errors.Is), no row of any engine table added or removed, and a
// canary instance done within 2 s after it, so the engine keeps serving. The cases the engine
// accepts by design (an unknown machine, an unknown rate limit, an outcome that cannot be
// applied) are checked for what the design promises instead.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	routed := &routedErrors{byID: map[int64]error{}}
	canary := linear("canary", 0, nil)
	parker := gendurable.FSM[path]{Name: "parker", Start: "park", Steps: map[string]gendurable.StepFunc[path]{
		"park": func(_ *gendurable.Ctx, s path) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "end", s), nil
		},
		"end": func(_ *gendurable.Ctx, s path) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	const maxChildren = 10
	bigDone := badStep("big-done", routed, func(path) gendurable.Outcome {
		return gendurable.Done(strings.Repeat("x", gendurable.DefaultMaxPayloadBytes))
	})
	bigNext := badStep("big-next", routed, func(s path) gendurable.Outcome {
		s.Path = []string{strings.Repeat("x", gendurable.DefaultMaxPayloadBytes)}
		return gendurable.Next("b", s)
	})
	nulNext := badStep("nul-next", routed, func(s path) gendurable.Outcome {
		s.Path = []string{"a\x00b"}
		return gendurable.Next("b", s)
	})
	unknownNext := badStep("unknown-next", routed, func(s path) gendurable.Outcome { return gendurable.Next("nope", s) })
	bigSpawn := badStep("big-spawn", routed, func(s path) gendurable.Outcome {
		children := make([]gendurable.Child, maxChildren+1)
		for i := range children {
			children[i] = gendurable.Child{Input: canary.With(path{})}
		}
		return gendurable.Spawn(children, "b", s)
	})
	badChild := badStep("bad-child", routed, func(s path) gendurable.Outcome {
		return gendurable.Spawn([]gendurable.Child{{Input: canary.With(path{}), Opts: &gendurable.InsertOpts{Priority: 99}}}, "b", s)
	})
	badTimeout := badStep("bad-timeout", routed, func(s path) gendurable.Outcome {
		return gendurable.Await([]string{"go"}, "b", s, gendurable.Timeout(-time.Second))
	})
	noNames := badStep("no-names", routed, func(s path) gendurable.Outcome { return gendurable.Await(nil, "b", s) })
	bigWeight := badStep("big-weight", routed, func(s path) gendurable.Outcome {
		return gendurable.Next("b", s, gendurable.RateLimit("r"), gendurable.Weight(math.MaxInt32+1))
	})
	badFairKey := badStep("bad-fair-key", routed, func(s path) gendurable.Outcome {
		return gendurable.Next("b", s, gendurable.FairnessKey(""))
	})
	ghostJob := gendurable.Job[path]{Name: "ghost", Perform: func(*gendurable.Ctx, path) error { return nil }}

	var evMu sync.Mutex
	var events []gendurable.Event
	seen := func(name gendurable.EventName, match func(gendurable.Event) bool) bool {
		evMu.Lock()
		defer evMu.Unlock()
		for _, ev := range events {
			if ev.Name == name && match(ev) {
				return true
			}
		}
		return false
	}
	cfg := &gendurable.Config{
		Machines: []gendurable.Machine{canary, parker, bigDone, bigNext, nulNext, unknownNext, bigSpawn, badChild,
			badTimeout, noNames, bigWeight, badFairKey},
		Queues:       map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}, "work": {Concurrency: 4}},
		MaxChildren:  maxChildren,
		PollInterval: 20 * time.Millisecond,
		Lease:        2 * time.Second,
		Reaper:       &gendurable.ReaperConfig{Interval: 50 * time.Millisecond},
		GC:           &gendurable.GCConfig{Disabled: true},
		RateLimits:   map[string]gendurable.Rate{"r": {Allowed: 100, Period: time.Second}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			evMu.Lock()
			events = append(events, ev)
			evMu.Unlock()
		}},
	}
	cl := e.client(t, cfg)
	start(t, cl)

	// Fixtures: a finished instance, a parked one, a failed one.
	doneID := insertOK(t, cl, canary.With(path{}), &gendurable.InsertOpts{CorrelationKey: "done-key"})
	awaitStatus(t, cl, doneID, gendurable.AwaitDone)
	liveID := insertOK(t, cl, parker.With(path{}), &gendurable.InsertOpts{CorrelationKey: "order-1"})
	eventually(t, 2*time.Second, "the parker parks", func() bool {
		in, err := cl.Get(ctx, liveID)
		return err == nil && in.Status == gendurable.StatusAwaiting
	})
	failedID := insertOK(t, cl, unknownNext.With(path{}), nil)
	awaitStatus(t, cl, failedID, gendurable.AwaitFailed)
	const nowhere = int64(1) << 50
	hostile := `a"; DROP SCHEMA public CASCADE; --`
	namespaces := func() (n int) {
		_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_namespace`).Scan(&n)
		return n
	}

	type badCase struct {
		name string
		call func() error
		// want is the error the call must match; nil for inputs the engine accepts by design,
		// whose promise after checks.
		want  error
		after func(t *testing.T)
	}
	insert := func(in gendurable.Input, opts *gendurable.InsertOpts) func() error {
		return func() error { _, err := cl.Insert(ctx, in, opts); return err }
	}
	signal := func(to gendurable.Target, name string, payload any) func() error {
		return func() error { _, err := cl.Signal(ctx, to, name, payload); return err }
	}
	list := func(opts gendurable.ListOpts) func() error {
		return func() error { _, err := cl.List(ctx, &opts); return err }
	}
	bigString := strings.Repeat("x", gendurable.DefaultMaxPayloadBytes) // encodes to 1 MiB + 2 bytes
	// Inputs of machines no node registers: nothing checks their steps, only their documents.
	raw := func(s string) gendurable.Input {
		return gendurable.Job[json.RawMessage]{Name: "raw"}.With(json.RawMessage(s))
	}
	nested := func(n int) any {
		var v any = 1
		for range n {
			v = []any{v}
		}
		return v
	}
	batch := func(bad int, opts *gendurable.InsertOpts, in gendurable.Input) func() error {
		return func() error {
			params := make([]gendurable.InsertManyParams, 10000)
			for i := range params {
				params[i] = gendurable.InsertManyParams{Input: canary.With(path{I: i})}
			}
			params[bad] = gendurable.InsertManyParams{Input: in, Opts: opts}
			_, err := cl.InsertMany(ctx, params)
			var ie *gendurable.InputError
			if errors.As(err, &ie) && ie.Index != bad {
				return fmt.Errorf("the error names row %d, not %d: %w", ie.Index, bad, err)
			}
			return err
		}
	}
	// stepFails runs a machine whose step produces a bad outcome: the error reaches Handle
	// (matching want), the instance fails after its two attempts, never through the reaper,
	// and nothing is left executing; check adds what the case promises.
	stepFails := func(m gendurable.FSM[path], want error, check func(t *testing.T, id int64)) badCase {
		var id int64
		return badCase{name: "step " + m.Name, call: func() error {
			r, err := cl.Insert(ctx, m.With(path{I: 7}), nil)
			if err != nil {
				return err
			}
			id = r.ID
			res, err := cl.Await(ctx, id, 2*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
			if err == nil && res.Status != gendurable.AwaitFailed {
				err = fmt.Errorf("instance %d: %s, want failed", id, res.Status)
			}
			return err
		}, after: func(t *testing.T) {
			if want != nil {
				require.ErrorIs(t, routed.get(id), want)
			} else {
				require.Error(t, routed.get(id))
			}
			in, err := cl.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, 2, in.Attempt, "the configured attempts, no more")
			for _, x := range in.Errors {
				require.NotEqual(t, "lease", x.Kind, "an outcome error must not go through the reaper")
			}
			require.JSONEq(t, `{"i": 7, "path": null}`, string(in.State), "the state is the one the step started from")
			require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`))
			if check != nil {
				check(t, id)
			}
		}}
	}
	noChildren := func(t *testing.T, id int64) {
		require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1`, id), "no child started")
	}

	cases := []badCase{
		// Payloads.
		{name: "state over MaxPayloadBytes", call: insert(canary.With(path{Path: []string{bigString}}), nil), want: gendurable.ErrPayloadTooLarge},
		{name: "args over MaxPayloadBytes", call: insert(ghostJob.With(path{Path: []string{bigString}}), nil), want: gendurable.ErrPayloadTooLarge},
		{name: "state with \\u0000", call: insert(canary.With(path{Path: []string{"a\x00"}}), nil), want: gendurable.ErrInvalidPayload},
		{name: "raw state with \\u0000", call: insert(raw(`{"i":"\u0000"}`), nil), want: gendurable.ErrInvalidPayload},
		{name: "raw state with a lone surrogate", call: insert(raw(`{"i":"\ud800"}`), nil), want: gendurable.ErrInvalidPayload},
		{name: "raw state with invalid UTF-8", call: insert(raw("{\"i\":\"\xff\"}"), nil), want: gendurable.ErrInvalidPayload},
		{name: "raw state with a number past numeric", call: insert(raw(`{"i":1e999999}`), nil), want: gendurable.ErrInvalidPayload},
		{name: "state nested 10,001 deep", call: insert(gendurable.Job[any]{Name: "raw"}.With(nested(10001)), nil), want: gendurable.ErrInvalidPayload},
		{name: "NaN state", call: insert(gendurable.Job[float64]{Name: "raw"}.With(math.NaN()), nil), want: gendurable.ErrInvalidPayload},
		{name: "signal payload over the limit", call: signal(gendurable.ByID(liveID), "note", bigString), want: gendurable.ErrPayloadTooLarge},
		{name: "signal payload with \\u0000", call: signal(gendurable.ByID(liveID), "note", "a\x00"), want: gendurable.ErrInvalidPayload},
		{name: "signal payload with a lone surrogate", call: signal(gendurable.ByID(liveID), "note", json.RawMessage(`"\udc00"`)), want: gendurable.ErrInvalidPayload},
		// Batches: one bad row among 10,000 rejects them all and the error names it.
		{name: "InsertMany, one oversized row of 10,000", call: batch(7777, nil, canary.With(path{Path: []string{bigString}})), want: gendurable.ErrPayloadTooLarge},
		{name: "InsertMany, one \\u0000 row of 10,000", call: batch(0, nil, canary.With(path{Path: []string{"\x00"}})), want: gendurable.ErrInvalidPayload},
		{name: "InsertMany, one bad option of 10,000", call: batch(9999, &gendurable.InsertOpts{Priority: 10}, canary.With(path{})), want: gendurable.ErrInvalidInput},
		// Insert options.
		{name: "priority 10", call: insert(canary.With(path{}), &gendurable.InsertOpts{Priority: 10}), want: gendurable.ErrInvalidInput},
		{name: "max attempts past 32 bits", call: insert(canary.With(path{}), &gendurable.InsertOpts{MaxAttempts: math.MaxInt32 + 1}), want: gendurable.ErrInvalidInput},
		{name: "negative delay", call: insert(canary.With(path{}), &gendurable.InsertOpts{In: -time.Second}), want: gendurable.ErrInvalidInput},
		{name: "scheduled before 4714 BC", call: insert(canary.With(path{}), &gendurable.InsertOpts{ScheduledAt: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}), want: gendurable.ErrInvalidInput},
		{name: "correlation key with \\u0000", call: insert(canary.With(path{}), &gendurable.InsertOpts{CorrelationKey: "k\x00"}), want: gendurable.ErrInvalidInput},
		{name: "correlation key of 513 bytes", call: insert(canary.With(path{}), &gendurable.InsertOpts{CorrelationKey: strings.Repeat("k", 513)}), want: gendurable.ErrInvalidInput},
		{name: "fairness key of 513 bytes", call: insert(canary.With(path{}), &gendurable.InsertOpts{FairnessKey: strings.Repeat("k", 513)}), want: gendurable.ErrInvalidInput},
		{name: "fairness key with a NUL", call: batch(77, &gendurable.InsertOpts{FairnessKey: "a\x00b"}, canary.With(path{})), want: gendurable.ErrInvalidInput},
		{name: "weight without a rate limit", call: insert(canary.With(path{}), &gendurable.InsertOpts{Weight: 2}), want: gendurable.ErrInvalidInput},
		{name: "queue with a control character", call: insert(canary.With(path{}), &gendurable.InsertOpts{Queue: "a\tb"}), want: gendurable.ErrInvalidInput},
		{name: "zero Input", call: insert(gendurable.Input{}, nil), want: gendurable.ErrInvalidInput},
		{name: "start step the machine lacks", call: insert(gendurable.FSM[path]{Name: "canary", Start: "s9", Steps: canary.Steps}.With(path{}), nil), want: gendurable.ErrUnknownStep},
		{name: "registered machine inserted at a step it lacks", call: insert(gendurable.FSM[path]{Name: "canary", Start: "zz",
			Steps: map[string]gendurable.StepFunc[path]{"zz": canary.Steps["s0"]}}.With(path{}), nil), want: gendurable.ErrUnknownStep},
		// Signals.
		{name: "signal to a finished instance", call: signal(gendurable.ByID(doneID), "go", nil), want: gendurable.ErrNoTarget},
		{name: "signal to a missing id", call: signal(gendurable.ByID(nowhere), "go", nil), want: gendurable.ErrNoTarget},
		{name: "signal to a finished key", call: signal(gendurable.ByKey("canary", "done-key"), "go", nil), want: gendurable.ErrNoTarget},
		{name: "signal to a key of another machine", call: signal(gendurable.ByKey("canary", "order-1"), "go", nil), want: gendurable.ErrNoTarget},
		{name: "signal to an unknown machine", call: signal(gendurable.ByKey("nobody", "order-1"), "go", nil), want: gendurable.ErrNoTarget},
		{name: "signal name with \\u0000", call: signal(gendurable.ByID(liveID), "g\x00", nil), want: gendurable.ErrInvalidInput},
		{name: "signal name of 129 bytes", call: signal(gendurable.ByID(liveID), strings.Repeat("n", 129), nil), want: gendurable.ErrInvalidInput},
		{name: "signal to a key with \\u0000", call: signal(gendurable.ByKey("parker", "k\x00"), "go", nil), want: gendurable.ErrInvalidInput},
		{name: "signal to a key of invalid UTF-8", call: signal(gendurable.ByKey("parker", "k\xff"), "go", nil), want: gendurable.ErrInvalidInput},
		{name: "signal to the zero Target", call: signal(gendurable.Target{}, "go", nil), want: gendurable.ErrInvalidInput},
		{name: "signal to a negative id", call: signal(gendurable.ByID(-1), "go", nil), want: gendurable.ErrInvalidInput},
		// Identifiers and configuration: refused before any database side effect.
		{name: "hostile schema name", call: func() error {
			before := namespaces()
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: hostile})
			if after := namespaces(); after != before {
				return fmt.Errorf("pg_namespace changed: %d schemas, then %d", before, after)
			}
			return err
		}, want: gendurable.ErrInvalidIdentifier},
		{name: "hostile schema name to Migrate", call: func() error {
			before := namespaces()
			err := gendurable.Migrate(ctx, e.pool, &gendurable.MigrateOpts{Schema: hostile})
			if after := namespaces(); after != before {
				return fmt.Errorf("pg_namespace changed: %d schemas, then %d", before, after)
			}
			return err
		}, want: gendurable.ErrInvalidIdentifier},
		{name: "schema named pg_evil", call: func() error {
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: "pg_evil"})
			return err
		}, want: gendurable.ErrInvalidIdentifier},
		{name: "negative lease", call: func() error {
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{Lease: -time.Second})
			return err
		}, want: gendurable.ErrInvalidConfig},
		{name: "heartbeat longer than a third of the lease", call: func() error {
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{Lease: time.Second, Heartbeat: time.Second})
			return err
		}, want: gendurable.ErrInvalidConfig},
		{name: "reaper interval under 1ms", call: func() error {
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{Reaper: &gendurable.ReaperConfig{Interval: time.Microsecond}})
			return err
		}, want: gendurable.ErrInvalidConfig},
		{name: "GC batch past 10,000", call: func() error {
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{GC: &gendurable.GCConfig{Batch: 10001}})
			return err
		}, want: gendurable.ErrInvalidConfig},
		{name: "gate with more shards than slots", call: func() error {
			_, err := gendurable.NewClient(e.pool, &gendurable.Config{ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"g": {Limit: 1, Shards: 2}}})
			return err
		}, want: gendurable.ErrInvalidConfig},
		// Await, Cancel, Retry, List, Inspect, Get.
		{name: "await with a zero timeout", call: func() error { _, err := cl.Await(ctx, liveID, 0, nil); return err }, want: gendurable.ErrInvalidInput},
		{name: "await with a negative timeout", call: func() error { _, err := cl.Await(ctx, liveID, -time.Second, nil); return err }, want: gendurable.ErrInvalidInput},
		{name: "await a negative id", call: func() error { _, err := cl.Await(ctx, -1, time.Second, nil); return err }, want: gendurable.ErrInvalidInput},
		{name: "cancel a finished instance", call: func() error { return cl.Cancel(ctx, doneID, "late") }, want: gendurable.ErrWrongStatus},
		{name: "cancel a failed instance", call: func() error { return cl.Cancel(ctx, failedID, "late") }, want: gendurable.ErrWrongStatus},
		{name: "cancel a missing instance", call: func() error { return cl.Cancel(ctx, nowhere, "x") }, want: gendurable.ErrNotFound},
		{name: "retry a live instance", call: func() error { return cl.Retry(ctx, liveID, nil) }, want: gendurable.ErrWrongStatus},
		{name: "retry a finished instance", call: func() error { return cl.Retry(ctx, doneID, nil) }, want: gendurable.ErrWrongStatus},
		{name: "retry a missing instance", call: func() error { return cl.Retry(ctx, nowhere, nil) }, want: gendurable.ErrNotFound},
		{name: "retry at a step the machine lacks", call: func() error { return cl.Retry(ctx, failedID, &gendurable.RetryOpts{Step: "nope"}) }, want: gendurable.ErrUnknownStep},
		{name: "retry at a step name with \\u0000", call: func() error { return cl.Retry(ctx, failedID, &gendurable.RetryOpts{Step: "a\x00"}) }, want: gendurable.ErrInvalidInput},
		{name: "list with limit -1", call: list(gendurable.ListOpts{Limit: -1}), want: gendurable.ErrInvalidInput},
		{name: "list with limit 1001", call: list(gendurable.ListOpts{Limit: 1001}), want: gendurable.ErrInvalidInput},
		{name: "list before a negative cursor", call: list(gendurable.ListOpts{Before: -1}), want: gendurable.ErrInvalidInput},
		{name: "list a status that is not one", call: list(gendurable.ListOpts{Statuses: []gendurable.Status{"zombie"}}), want: gendurable.ErrInvalidInput},
		{name: "list a queue of 129 bytes", call: list(gendurable.ListOpts{Queue: strings.Repeat("q", 129)}), want: gendurable.ErrInvalidInput},
		{name: "list a machine with a newline", call: list(gendurable.ListOpts{Machine: "a\nb"}), want: gendurable.ErrInvalidInput},
		{name: "list since before 4714 BC", call: list(gendurable.ListOpts{Since: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}), want: gendurable.ErrInvalidInput},
		{name: "list a key with \\u0000", call: list(gendurable.ListOpts{CorrelationKey: "k\x00"}), want: gendurable.ErrInvalidInput},
		{name: "inspect with inbox limit 1001", call: func() error {
			_, err := cl.Inspect(ctx, liveID, &gendurable.InspectOpts{InboxLimit: 1001})
			return err
		}, want: gendurable.ErrInvalidInput},
		{name: "get a missing instance", call: func() error { _, err := cl.Get(ctx, nowhere); return err }, want: gendurable.ErrNotFound},
		// Outcomes a step returns that cannot be applied: routed to Handle, the instance fails
		// after its configured attempts, nothing is written for the outcome.
		stepFails(bigDone, gendurable.ErrPayloadTooLarge, nil),
		stepFails(bigNext, gendurable.ErrPayloadTooLarge, nil),
		stepFails(nulNext, gendurable.ErrInvalidPayload, nil),
		stepFails(unknownNext, gendurable.ErrUnknownStep, nil),
		stepFails(bigSpawn, gendurable.ErrInvalidInput, noChildren),
		stepFails(badChild, gendurable.ErrInvalidInput, noChildren),
		stepFails(badTimeout, nil, nil),
		stepFails(noNames, nil, nil),
		stepFails(bigWeight, nil, nil),
		stepFails(badFairKey, nil, nil),
	}

	// Accepted by design: an insert of a machine this node does not know (a web node inserts
	// what its workers run). A worker without the machine hands the claim back untouched
	// (fsm.unknown, attempt unchanged); a node that has it runs it.
	var ghostID int64
	cases = append(cases, badCase{name: "insert of an unknown machine", call: func() error {
		r, err := cl.Insert(ctx, ghostJob.With(path{}), nil)
		ghostID = r.ID
		return err
	}, after: func(t *testing.T) {
		eventually(t, 5*time.Second, "fsm.unknown for the ghost", func() bool {
			return seen(gendurable.EventFSMUnknown, func(ev gendurable.Event) bool { return ev.InstanceID == ghostID })
		})
		eventually(t, 2*time.Second, "the ghost handed back", func() bool {
			in, err := cl.Get(ctx, ghostID)
			return err == nil && in.Status == gendurable.StatusAvailable && in.Attempt == 0
		})
		knows := e.client(t, &gendurable.Config{Name: "knows-ghost", Machines: []gendurable.Machine{ghostJob}})
		kit := durabletest.New(t, knows, nil)
		eventually(t, 5*time.Second, "a node that knows the ghost runs it", func() bool {
			_, _ = kit.TryDrain(ctx, &durabletest.DrainOpts{Queues: []string{gendurable.DefaultQueue}})
			in, err := cl.Get(ctx, ghostID)
			return err == nil && in.Status == gendurable.StatusDone
		})
	}})
	// Accepted by design (v1): a rate limit no node configures stalls its row and is reported
	// (rate_limit.unknown); the queue keeps serving the canary meanwhile.
	var stalledID int64
	cases = append(cases, badCase{name: "insert under an unknown rate limit", call: func() error {
		r, err := cl.Insert(ctx, canary.With(path{}), &gendurable.InsertOpts{RateLimit: "nobody:tenant", Queue: "work"})
		stalledID = r.ID
		return err
	}, after: func(t *testing.T) {
		eventually(t, 2*time.Second, "rate_limit.unknown", func() bool {
			return seen(gendurable.EventRateLimitUnknown, func(ev gendurable.Event) bool {
				return strings.HasPrefix(ev.Key, "nobody") && ev.Count >= 1
			})
		})
		in, err := cl.Get(ctx, stalledID)
		require.NoError(t, err)
		require.Equal(t, gendurable.StatusAvailable, in.Status, "stalled, not failed")
		require.Equal(t, 0, in.Attempt)
	}})

	started := time.Now()
	var slowest time.Duration
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := engineTableCounts(t, e)
			err := c.call()
			if c.want != nil {
				require.ErrorIs(t, err, c.want)
				var pgErr *pgconn.PgError
				require.False(t, errors.As(err, &pgErr), "a raw database error: %v", err)
				require.Equal(t, before, engineTableCounts(t, e), "rows of engine tables added or removed")
			} else {
				require.NoError(t, err)
			}
			if c.after != nil {
				c.after(t)
			}
			// The canary: inserted after the case, done within 2 s.
			began := time.Now()
			id := insertOK(t, cl, canary.With(path{}), nil)
			res, err := cl.Await(ctx, id, 2*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
			require.NoError(t, err)
			require.Equal(t, gendurable.AwaitDone, res.Status, "the canary after %q", c.name)
			slowest = max(slowest, time.Since(began))
		})
	}
	t.Logf("%d cases in %v; slowest canary %v", len(cases), time.Since(started).Round(time.Millisecond), slowest.Round(time.Millisecond))
	failed := 0
	if t.Failed() {
		failed = 1
	}
	oracle.Report(t, oracle.Summary{Test: "T14 bad input", Instances: len(cases), Violations: failed,
		Seconds: time.Since(started).Seconds()})
}

func insertOK(t *testing.T, cl *gendurable.Client, in gendurable.Input, opts *gendurable.InsertOpts) int64 {
	t.Helper()
	r, err := cl.Insert(context.Background(), in, opts)
	require.NoError(t, err)
	return r.ID
}

// awaitStatus waits (2 s at most) until instance id is terminal with the given answer.
func awaitStatus(t *testing.T, cl *gendurable.Client, id int64, want gendurable.AwaitStatus) {
	t.Helper()
	res, err := cl.Await(context.Background(), id, 2*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, want, res.Status, "instance %d", id)
}
