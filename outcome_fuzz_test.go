package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/jsonx"
	"github.com/gendurable/gendurable/internal/store"
)

// FuzzOutcome: whatever outcome a step returns (any kind, step name, await names, options with
// any keys, weights and durations, any state or result), applying it never panics; it is an
// outcome error (routed to Handle), or an engine outcome that keeps every bound the statements
// rely on. No database.
//
//	go test -run '^$' -fuzz '^FuzzOutcome$' -fuzztime 5m -parallel 1 .
func FuzzOutcome(f *testing.F) {
	f.Add(uint8(1), "b", "go,stop", "", "", 0, int64(0), uint8(0), "x", 0)
	f.Add(uint8(5), "b", "go", "stripe:t1", "mail:t1", 3, int64(time.Second), uint8(0xff), "\x00", 11)
	f.Add(uint8(6), "b", "", "", "", math.MaxInt32+1, int64(-1), uint8(0x0f), `{"a":1}`, 3)
	step := func(*Ctx, string) (Outcome, error) { return Done(nil), nil }
	m := FSM[string]{Name: "fuzzed", Start: "a", Steps: map[string]StepFunc[string]{"a": step, "b": step}}
	child := FSM[string]{Name: "child", Start: "a", Steps: map[string]StepFunc[string]{"a": step}}
	f.Fuzz(func(t *testing.T, kind uint8, next, names, key, rate string, weight int, d int64, opts uint8,
		state string, children int) {
		ctx := &Ctx{Context: context.Background(), Attempt: 1, MaxAttempts: 3, call: &engine.Call{
			MaxPayload: 1 << 16, MaxChildren: 10, Machine: func(string) *engine.MachineDef { return nil },
			Row: &store.Claimed{Machine: "fuzzed", Step: "a"}}}
		var oo []OutcomeOption
		for i, o := range []OutcomeOption{ConcurrencyKey(key), RateLimit(rate), Weight(weight), ReleaseConcurrencyKey(),
			Timeout(time.Duration(d)), After(time.Duration(d)), {}} {
			if opts&(1<<i) != 0 {
				oo = append(oo, o)
			}
		}
		var out Outcome
		switch kind % 7 {
		case 0:
			out = Outcome{}
		case 1:
			out = Next(next, state, oo...)
		case 2:
			out = Retry(time.Duration(d))
		case 3:
			out = Done(state)
		case 4:
			out = Stop(errors.New(state))
		case 5:
			out = Await(strings.Split(names, ","), next, state, oo...)
		case 6:
			var cs []Child
			for i := range children % 16 {
				cs = append(cs, Child{Input: child.With(state), Opts: &InsertOpts{Priority: i % 11}})
			}
			out = Spawn(cs, next, state)
		}
		enc, err := m.encode(ctx, out)
		if err != nil {
			if !isOutcomeError(err) {
				t.Fatalf("not an outcome error: %T %v", err, err)
			}
			_ = m.route(ctx, "", err, "outcome") // the error reaches Handle without a panic
			return
		}
		checkEncoded(t, m, enc)
	})
}

// checkEncoded fails unless an applied outcome keeps the bounds of the outcome statement.
func checkEncoded(t *testing.T, m FSM[string], o store.Outcome) {
	t.Helper()
	switch o.Kind {
	case store.KindNext, store.KindRetry, store.KindDone, store.KindFailed, store.KindAwait, store.KindSpawn:
	default:
		t.Fatalf("kind %v", o.Kind)
	}
	if o.Kind.Progress() && m.Steps[o.Step] == nil {
		t.Fatalf("%v to unknown step %q", o.Kind, o.Step)
	}
	for _, doc := range [][]byte{o.State, o.Result} {
		if doc != nil && (!json.Valid(doc) || jsonx.Check(doc, 1<<16) != nil) {
			t.Fatalf("document %q", doc)
		}
	}
	if o.Delay < 0 || o.AwaitTimeout < 0 || o.Weight > math.MaxInt32 || (o.Kind == store.KindNext && o.Weight < 1) {
		t.Fatalf("delay %v timeout %v weight %d", o.Delay, o.AwaitTimeout, o.Weight)
	}
	if o.Kind == store.KindAwait && checkAwaitNames(o.AwaitNames) != nil {
		t.Fatalf("await names %q", o.AwaitNames)
	}
	if (o.Key == store.KeySet) != (o.NewKey != "") || (o.Key != store.KeyKeep && o.Key != store.KeySet && o.Key != store.KeyRelease) {
		t.Fatalf("key change %q to %q", o.Key, o.NewKey)
	}
	for _, k := range []string{o.NewKey, o.RateLimit} {
		if k != "" && checkKey(k) != nil {
			t.Fatalf("key %q", k)
		}
	}
	if len(o.Children) > 10 {
		t.Fatalf("%d children", len(o.Children))
	}
}
