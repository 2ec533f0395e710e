package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

// hop is the state of the machines the migration test leaves in flight.
type hop struct {
	N    int      `json:"n"`
	Path []string `json:"path"`
}

func (h hop) at(step string) hop {
	h.Path = append(append([]string(nil), h.Path...), step)
	return h
}

// TestASchemaFullOfLiveRowsIsMigratedAndEveryInstanceRunsToItsEnd leaves rows of every kind in a
// schema at version 1 (runnable, scheduled, executing under a dead worker's lease, parked with an
// inbox, joining with children, gated, rate-limited, finished), migrates it to the newest version
// and runs the fleet: every instance ends as it should, nothing lost. The rows are written by
// this library and the schema then taken down to version 1 (every row kept, as the downs
// promise): rows of version 1's shape, in version 1's schema.
func TestASchemaFullOfLiveRowsIsMigratedAndEveryInstanceRunsToItsEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	step := func(next string) gendurable.StepFunc[hop] {
		return func(ctx *gendurable.Ctx, h hop) (gendurable.Outcome, error) {
			if next == "" {
				return gendurable.Done(h.at(ctx.Step)), nil
			}
			return gendurable.Next(next, h.at(ctx.Step)), nil
		}
	}
	line := gendurable.FSM[hop]{Name: "line", Start: "a", Queue: "work",
		Steps: map[string]gendurable.StepFunc[hop]{"a": step("b"), "b": step("")}}
	waiter := gendurable.FSM[hop]{Name: "waiter", Start: "a", Queue: "work",
		Steps: map[string]gendurable.StepFunc[hop]{
			"a": func(ctx *gendurable.Ctx, h hop) (gendurable.Outcome, error) {
				return gendurable.Await([]string{"go"}, "b", h.at("a")), nil
			},
			"b": func(ctx *gendurable.Ctx, h hop) (gendurable.Outcome, error) {
				h = h.at("b")
				for _, s := range ctx.Inbox {
					h = h.at("inbox:" + s.Name)
				}
				return gendurable.Done(h), nil
			},
		}}
	parent := gendurable.FSM[hop]{Name: "parent", Start: "a", Queue: "work",
		Steps: map[string]gendurable.StepFunc[hop]{
			"a": func(ctx *gendurable.Ctx, h hop) (gendurable.Outcome, error) {
				kids := make([]gendurable.Child, 3)
				for i := range kids {
					kids[i] = gendurable.Child{Input: line.With(hop{N: i}), Opts: &gendurable.InsertOpts{Queue: "kids"}}
				}
				return gendurable.Spawn(kids, "join", h.at("a")), nil
			},
			"join": func(ctx *gendurable.Ctx, h hop) (gendurable.Outcome, error) {
				h = h.at("join")
				h.N = len(ctx.Children)
				return gendurable.Done(h), nil
			},
		}}
	machines := []gendurable.Machine{line, waiter, parent}
	cfg := func() *gendurable.Config {
		return &gendurable.Config{Machines: machines,
			ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"acct": {Limit: 1}},
			RateLimits:        map[string]gendurable.Rate{"api": {Allowed: 100, Period: time.Second}},
			Lease:             time.Second,
			Reaper:            &gendurable.ReaperConfig{Interval: 100 * time.Millisecond},
			Queues:            map[string]gendurable.QueueConfig{"work": {}, "kids": {}},
		}
	}
	cl := e.client(t, cfg())
	kit := durabletest.New(t, cl, nil)

	ins := func(in gendurable.Input, opts *gendurable.InsertOpts) int64 {
		res, err := cl.Insert(ctx, in, opts)
		require.NoError(t, err)
		return res.ID
	}
	done := ins(line.With(hop{}), nil)
	kit.Drain(ctx)
	kit.RequireDone(ctx, done, nil)
	parked := ins(waiter.With(hop{}), nil)
	joining := ins(parent.With(hop{}), nil)
	_, err := kit.TryDrain(ctx, &durabletest.DrainOpts{Queues: []string{"work"}})
	require.NoError(t, err)
	kit.RequireAwaiting(ctx, parked, "go")
	_, err = cl.Signal(ctx, gendurable.ByID(parked), "noise", nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusJoining, kit.Get(ctx, joining).Status)
	runnable := ins(line.With(hop{}), nil)
	scheduled := ins(line.With(hop{}), &gendurable.InsertOpts{In: 3 * time.Second})
	gated := []int64{ins(line.With(hop{}), &gendurable.InsertOpts{ConcurrencyKey: "acct:1"}),
		ins(line.With(hop{}), &gendurable.InsertOpts{ConcurrencyKey: "acct:1"})}
	rated := ins(line.With(hop{}), &gendurable.InsertOpts{RateLimit: "api"})
	executing := ins(line.With(hop{}), nil)
	// A worker that died mid-step: its claim and lease stay on the row.
	e.exec(t, `UPDATE {schema}.instances SET status = 'executing', attempt = 1, locked_by = 'dead:work@gone-1',
		locked_until = now() + interval '1 second' WHERE id = $1`, executing)
	const rows = `SELECT count(*) FROM {schema}.instances`
	before := e.count(t, rows)
	require.Equal(t, 12, before) // 9 inserted + 3 children
	signals := e.count(t, `SELECT count(*) FROM {schema}.signals`)

	require.NoError(t, gendurable.Migrate(ctx, e.pool, &gendurable.MigrateOpts{Schema: e.schema, Target: 1}))
	require.Zero(t, e.count(t, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'instances' AND column_name = 'machine_version'`, e.schema))
	require.Equal(t, before, e.count(t, rows))
	require.NoError(t, gendurable.Migrate(ctx, e.pool, &gendurable.MigrateOpts{Schema: e.schema}))
	require.Equal(t, before, e.count(t, rows))
	require.Equal(t, signals, e.count(t, `SELECT count(*) FROM {schema}.signals`))
	require.Equal(t, before, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine_version = 1`))

	worker := e.client(t, cfg())
	start(t, worker)
	_, err = worker.Signal(ctx, gendurable.ByID(parked), "go", nil)
	require.NoError(t, err)
	eventually(t, 60*time.Second, "every instance done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == before
	})
	var h hop
	for _, id := range append([]int64{done, runnable, scheduled, rated, executing}, gated...) {
		kit.RequireDone(ctx, id, &h)
		require.Equal(t, []string{"a", "b"}, h.Path, "instance %d", id)
	}
	kit.RequireDone(ctx, parked, &h)
	require.Equal(t, []string{"a", "b", "inbox:noise", "inbox:go"}, h.Path)
	kit.RequireDone(ctx, joining, &h)
	require.Equal(t, []string{"a", "join"}, h.Path)
	require.Equal(t, 3, h.N)
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.signals`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND jsonb_array_length(errors) = 1
		AND errors -> 0 ->> 'kind' = 'lease'`, executing))
}
