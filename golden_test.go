package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

// goldenState is the state of the golden rows' machine. Sub is kept verbatim (json.RawMessage):
// its numbers survive exactly, as they would not through an any.
type goldenState struct {
	N    int             `json:"n"`
	Seen []string        `json:"seen,omitempty"`
	Sub  json.RawMessage `json:"sub,omitempty"`
}

// TestGoldenRows is docs/reliability.md T19: rows of every outcome kind and state shape, as this
// version stores them (testdata/golden/*.sql), load, decode, and advance one step to the
// expected state. A format change that old rows would not survive fails here.
func TestGoldenRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	golden := gendurable.FSM[goldenState]{Name: "golden", Start: "step", Steps: map[string]gendurable.StepFunc[goldenState]{
		"step": func(ctx *gendurable.Ctx, s goldenState) (gendurable.Outcome, error) {
			s.N++
			for _, sig := range ctx.Awaited {
				var p struct{ V string }
				if err := sig.Decode(&p); err != nil {
					return gendurable.Outcome{}, err
				}
				s.Seen = append(s.Seen, "sig:"+sig.Name+":"+p.V)
			}
			for _, ch := range ctx.Children {
				var r struct{ V string }
				if ch.Result != nil {
					if err := ch.Decode(&r); err != nil {
						return gendurable.Outcome{}, err
					}
				}
				s.Seen = append(s.Seen, fmt.Sprintf("child:%d:%s:%s%s", ch.ID, ch.Status, r.V, ch.Error))
			}
			s.Seen = append(s.Seen, fmt.Sprint("inbox:", len(ctx.Inbox)))
			return gendurable.Next("end", s), nil
		},
		"end": func(_ *gendurable.Ctx, s goldenState) (gendurable.Outcome, error) { return gendurable.Done(s), nil },
	}}
	var mu sync.Mutex
	got := map[int64]any{}
	record := func(id int64, v any) {
		mu.Lock()
		got[id] = v
		mu.Unlock()
	}
	text := gendurable.Job[string]{Name: "golden-text", Perform: func(ctx *gendurable.Ctx, s string) error {
		record(ctx.ID, s)
		return nil
	}}
	ints := gendurable.Job[[]int]{Name: "golden-ints", Perform: func(ctx *gendurable.Ctx, xs []int) error {
		record(ctx.ID, xs)
		return nil
	}}
	child := gendurable.Job[string]{Name: "golden-child", Perform: func(*gendurable.Ctx, string) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{golden, text, ints, child}})
	kit := durabletest.New(t, cl, nil)

	// drain runs up to steps steps of the file's queue.
	drain := func(t *testing.T, queue string, steps int) {
		t.Helper()
		res, err := kit.TryDrain(ctx, &durabletest.DrainOpts{Queues: []string{queue}, MaxSteps: steps})
		if err != nil && !errors.Is(err, durabletest.ErrMaxSteps) {
			t.Fatal(err)
		}
		require.Equal(t, steps, res.Steps)
	}
	// advanced checks that instance id ran its step once: at step end, available, with the
	// state (compared by jsonb equality, exact for numbers) the step wrote.
	advanced := func(t *testing.T, id int64, state string) *gendurable.Instance {
		t.Helper()
		in := kit.RequireStatus(ctx, id, gendurable.StatusAvailable)
		require.Equal(t, "end", in.Step)
		require.Equal(t, 0, in.Attempt)
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND state = $2::jsonb
			AND jsonb_typeof(state) = 'object'`, id, state), "instance %d: state %s, want %s", id, in.State, state)
		return in
	}
	signals := func(id int64) []string {
		var names []string
		rows, err := e.pool.Query(ctx, expand(`SELECT name FROM {schema}.signals WHERE instance_id = $1 ORDER BY id`, e.schema), id)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			names = append(names, n)
		}
		return names
	}

	scenarios := map[string]func(t *testing.T){
		"fresh": func(t *testing.T) {
			drain(t, "fresh", 1)
			advanced(t, 101, `{"n": 2, "seen": ["inbox:0"]}`)
		},
		"after_next": func(t *testing.T) {
			drain(t, "after_next", 1)
			in := advanced(t, 201, `{"n": 6, "seen": ["x", "inbox:0"], "sub": {"deep": [1, 2.5, {"k": "v"}], "big": 9007199254740993}}`)
			require.Equal(t, []string{"s0", "step"}, in.Path)
			require.Equal(t, 2, in.Priority)
			require.Equal(t, "order-201", in.CorrelationKey)
		},
		"retry_pending": func(t *testing.T) {
			drain(t, "retry_pending", 1) // the delay collapses
			in := advanced(t, 301, `{"n": 4, "seen": ["inbox:0"]}`)
			require.Len(t, in.Errors, 1)
			require.Equal(t, gendurable.ErrorEntry{At: in.Errors[0].At, Step: "step", Attempt: 1, Kind: "error", Error: "boom"}, in.Errors[0])
		},
		"woken_by_signal": func(t *testing.T) {
			drain(t, "woken_by_signal", 1)
			in := advanced(t, 401, `{"n": 5, "seen": ["sig:go:a", "inbox:2"]}`)
			require.Nil(t, in.AwaitNames)
			require.Equal(t, []string{"note"}, signals(401), "the awaited signal consumed, the other kept")
		},
		"await_timeout": func(t *testing.T) {
			require.Equal(t, 1, kit.FireTimeouts(ctx))
			drain(t, "await_timeout", 1)
			advanced(t, 501, `{"n": 6, "seen": ["inbox:0"]}`)
		},
		"join_settled": func(t *testing.T) {
			drain(t, "join_settled", 1)
			in := advanced(t, 601, `{"n": 7, "seen": ["child:602:done:c1", "child:603:failed:no luck", "inbox:0"]}`)
			require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = 601 AND join_due`))
			require.Equal(t, []string{"s0", "step"}, in.Path)
		},
		"legacy_state": func(t *testing.T) {
			drain(t, "legacy_state", 1)
			advanced(t, 701, `{"n": 42, "seen": ["old", "inbox:0"]}`) // and now stored as an object
		},
		"job_args": func(t *testing.T) {
			drain(t, "job_args", 5)
			for id := int64(801); id <= 805; id++ {
				kit.RequireDone(ctx, id, nil)
			}
			require.Equal(t, map[int64]any{801: "hello", 802: `{"a": 1}`, 803: []int{1, 2, 3}, 804: []int{4, 5}, 805: []int(nil)},
				pick(got, 801, 802, 803, 804, 805))
		},
		"failed": func(t *testing.T) {
			in := kit.RequireFailed(ctx, 901)
			require.Equal(t, []string{"error", "lease", "outcome"}, kinds(in.Errors))
			require.NoError(t, cl.Retry(ctx, 901, nil))
			drain(t, "failed", 1)
			in = advanced(t, 901, `{"n": 10, "seen": ["inbox:0"]}`)
			require.Len(t, in.Errors, 3, "the history stays")
		},
		"cancelled": func(t *testing.T) {
			kit.RequireStatus(ctx, 1001, gendurable.StatusCancelled)
			require.NoError(t, cl.Retry(ctx, 1001, nil))
			drain(t, "cancelled", 1)
			advanced(t, 1001, `{"n": 11, "seen": ["inbox:0"]}`)
		},
		"done": func(t *testing.T) {
			var r goldenState
			kit.RequireDone(ctx, 1101, &r)
			require.Equal(t, goldenState{N: 12, Seen: []string{"end"}}, r)
			a, err := cl.Await(ctx, 1101, 10*time.Second, nil) // a finished instance is answered at once
			require.NoError(t, err)
			require.Equal(t, gendurable.AwaitDone, a.Status)
			var d goldenState
			require.NoError(t, a.Decode(&d))
			require.Equal(t, r, d)
			_, err = cl.Signal(ctx, gendurable.ByKey("golden", "order-1101"), "go", nil)
			require.ErrorIs(t, err, gendurable.ErrNoTarget)
			require.ErrorIs(t, cl.Retry(ctx, 1101, nil), gendurable.ErrWrongStatus)
		},
	}
	files, err := filepath.Glob("testdata/golden/*.sql")
	require.NoError(t, err)
	require.Len(t, files, len(scenarios), "a scenario for every golden file")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".sql")
		run, ok := scenarios[name]
		require.True(t, ok, "no scenario for %s", f)
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		t.Run(name, func(t *testing.T) {
			_, err := e.pool.Exec(ctx, expand(string(b), e.schema))
			require.NoError(t, err, "load %s", f)
			run(t)
		})
	}
}

func kinds(errs []gendurable.ErrorEntry) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Kind)
	}
	return out
}

func pick(m map[int64]any, ids ...int64) map[int64]any {
	out := map[int64]any{}
	for _, id := range ids {
		if v, ok := m[id]; ok {
			out[id] = v
		}
	}
	return out
}
