package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
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

// Contract migrations run while the fleet works, as a deploy and its rollback run them: two
// clients of this library work a stream of two-step instances (half of them under fairness keys)
// against a schema at durablemigrate.Required, and the contract migration that follows it is
// applied, undone (its down builds the dropped indexes again, plainly, in its transaction) and
// applied again; before the last, a third node joins the fleet the way a process starts, calling
// Migrate first (which leaves a contract migration alone). The first is asked for while another
// session holds its locks off (a transaction that read the table stays open): the fleet goes on
// working while it waits (a lock request that queued would stop every statement on the table
// behind it), and it applies once the session ends. Every migration succeeds, no statement of the
// fleet fails for them (no pick, commit, heartbeat or step error: plans that used a dropped index
// are planned again), and every instance runs each of its steps once, in order, under claims
// none of which was lost.
func TestContractMigrationsRunUnderAWorkingFleet(t *testing.T) {
	t.Parallel()
	require.Greater(t, durablemigrate.Version, durablemigrate.Required, "the library ends with a contract migration")
	e := newEnv(t)
	side := durabledbtest.Pool(t, 6) // the steps' records and the migrations, beside the fleet's pool
	ctx := context.Background()
	require.NoError(t, durablemigrate.MigrateTo(ctx, side, e.schema, durablemigrate.Required))
	e.exec(t, `CREATE TABLE {schema}.t_steps (id bigint, step text)`)
	record := expand(`INSERT INTO {schema}.t_steps (id, step) VALUES ($1, $2)`, e.schema)
	step := func(next string) gendurable.StepFunc[hop] {
		return func(ctx *gendurable.Ctx, h hop) (gendurable.Outcome, error) {
			if _, err := side.Exec(ctx, record, ctx.ID, ctx.Step); err != nil {
				return gendurable.Outcome{}, err
			}
			if next == "" {
				return gendurable.Done(h.at(ctx.Step)), nil
			}
			return gendurable.Next(next, h.at(ctx.Step)), nil
		}
	}
	line := gendurable.FSM[hop]{Name: "line", Start: "a", Queue: "work",
		Steps: map[string]gendurable.StepFunc[hop]{"a": step("b"), "b": step("")}}
	var mu sync.Mutex
	failures := map[gendurable.EventName]int{}
	failed := func(ev gendurable.Event) {
		switch ev.Name {
		case gendurable.EventSchedulerFailed, gendurable.EventCommitFailed, gendurable.EventHeartbeatFailed,
			gendurable.EventReaperFailed, gendurable.EventStepError:
			mu.Lock()
			failures[ev.Name]++
			mu.Unlock()
			t.Logf("%s: %v", ev.Name, ev.Err)
		}
	}
	node := func(name string) *gendurable.Client {
		cl := e.client(t, &gendurable.Config{Name: name, Machines: []gendurable.Machine{line}, PollInterval: 20 * time.Millisecond,
			Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 8}}, Hooks: []func(gendurable.Event){failed}})
		start(t, cl)
		return cl
	}
	ins := node("a")
	node("b")

	// The stream: 10 instances every 20 ms, every other one under one of three fairness keys.
	stop, streamed := make(chan struct{}), make(chan error, 1)
	total := 0
	go func() {
		for {
			select {
			case <-stop:
				streamed <- nil
				return
			case <-time.After(20 * time.Millisecond):
			}
			params := make([]gendurable.InsertManyParams, 10)
			for j := range params {
				params[j] = gendurable.InsertManyParams{Input: line.With(hop{})}
				if j%2 == 0 {
					params[j].Opts = &gendurable.InsertOpts{FairnessKey: fmt.Sprint("k", j%3)}
				}
			}
			if _, err := ins.InsertMany(ctx, params); err != nil {
				streamed <- err
				return
			}
			total += len(params)
		}
	}()
	done := func() int { return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) }
	migrate := func(target int) {
		t.Helper()
		before := done()
		eventually(t, 30*time.Second, "the fleet working", func() bool { return done() >= before+100 })
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, durablemigrate.MigrateTo(mctx, side, e.schema, target), "migrating to %d under the fleet", target)
		st, err := durablemigrate.Current(ctx, side, e.schema)
		require.NoError(t, err)
		require.Equal(t, target, st.Version)
	}
	// The first with a session in the way: a transaction that read the table and stays open
	// holds the migration's locks off, and the fleet works on while the migration waits.
	holder, err := side.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, expand(`SELECT count(*) FROM {schema}.instances`, e.schema))
	require.NoError(t, err)
	held := make(chan error, 1)
	go func() { held <- durablemigrate.MigrateTo(ctx, side, e.schema, durablemigrate.Version) }()
	// (Both waits are well short of the minute the migration tries for.)
	eventually(t, 15*time.Second, "the migration asking for its locks", func() bool {
		return e.count(t, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`,
			expand(`{schema}.instances`, e.schema)) > 0
	})
	before := done()
	eventually(t, 15*time.Second, "the fleet working while the migration waits for its locks", func() bool { return done() >= before+100 })
	require.Equal(t, durablemigrate.Required, e.count(t, `SELECT value::int FROM {schema}.meta WHERE key = 'version'`),
		"the migration applied while its locks were held")
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-held, "the migration once the session ended")
	migrate(durablemigrate.Required)
	// A process starting now migrates first, as every process may: at Required, that changes
	// nothing (a contract migration waits to be named).
	require.NoError(t, gendurable.Migrate(ctx, side, &gendurable.MigrateOpts{Schema: e.schema}))
	node("c")
	migrate(durablemigrate.Version)
	before = done()
	eventually(t, 30*time.Second, "the fleet working after the last migration", func() bool { return done() >= before+100 })
	close(stop)
	require.NoError(t, <-streamed)
	eventually(t, time.Minute, "every instance done", func() bool { return done() == total })

	require.Equal(t, 2*total, e.count(t, `SELECT count(*) FROM {schema}.t_steps`), "two steps an instance")
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT 1 FROM {schema}.t_steps GROUP BY id, step HAVING count(*) > 1) d`),
		"a step that ran twice")
	require.Equal(t, total, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE result -> 'path' = '["a", "b"]'`),
		"every instance ran a, then b")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors IS NOT NULL AND errors <> '[]'`),
		"an instance with an error (a lost claim, a failed step)")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, failures, "the fleet's failures while the schema migrated")
	t.Logf("%d instances through three migrations", total)
}

// A running client learns of a migration that leaves its schema behind at its next registry
// refresh: migrated down below durablemigrate.Required under it, it logs an error, once, that
// names the schema's version and the way back (its statements may fail meanwhile); migrated up
// again, it says the schema is one it runs against.
func TestARunningClientSaysWhenItsSchemaIsMigratedFromUnderIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	rec := newRecorder()
	job := gendurable.Job[string]{Name: "noop", Queue: "work", Perform: func(*gendurable.Ctx, string) error { return nil }}
	cl := e.client(t, &gendurable.Config{Name: "behind", Machines: []gendurable.Machine{job}, Logger: rec.logger(),
		Queues: map[string]gendurable.QueueConfig{"work": {}}})
	gendurable.SetNodeRefresh(cl, 20*time.Millisecond)
	start(t, cl)
	const behind = "the schema was migrated under this running client"

	require.NoError(t, durablemigrate.MigrateTo(ctx, e.pool, e.schema, durablemigrate.Required-1))
	eventually(t, 10*time.Second, "the client logging that its schema is behind it", func() bool { return rec.lines(behind) > 0 })
	var seen time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT seen_at FROM {schema}.nodes`, e.schema)).Scan(&seen))
	eventually(t, 10*time.Second, "more registry refreshes", func() bool {
		var now time.Time
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT seen_at FROM {schema}.nodes`, e.schema)).Scan(&now))
		return now.Sub(seen) > 200*time.Millisecond
	})
	require.Equal(t, 1, rec.lines(behind), "the finding is logged once, not at every refresh")
	require.Equal(t, 1, rec.lines(fmt.Sprintf("is at version %d, older than this library's %d: migrate it first",
		durablemigrate.Required-1, durablemigrate.Required)), "the log names both versions and the way back")

	require.NoError(t, durablemigrate.MigrateTo(ctx, e.pool, e.schema, durablemigrate.Version))
	eventually(t, 10*time.Second, "the client saying the schema is in step again", func() bool {
		return rec.lines("a version this client runs against again") > 0
	})
	require.Equal(t, 1, rec.lines(behind))
}
