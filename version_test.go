package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

// ticket is the state of the versioned test machine; Priority is the field version 2 adds.
type ticket struct {
	Title    string   `json:"title"`
	Priority string   `json:"priority,omitempty"`
	Path     []string `json:"path"`
}

func (t ticket) at(step string) ticket {
	t.Path = append(append([]string(nil), t.Path...), step)
	return t
}

// ticketV1: open, then parked on "go" until review, then close.
var ticketV1 = gendurable.FSM[ticket]{
	Name: "ticket", Start: "open", Queue: "tickets",
	Steps: map[string]gendurable.StepFunc[ticket]{
		"open": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "review", t.at("open")), nil
		},
		"review": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
			return gendurable.Next("close", t.at("review")), nil
		},
		"close": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
			return gendurable.Done(t.at("close")), nil
		},
	},
}

// ticketV2 renames review to approve (which needs the new Priority field), removes close in
// favour of finish, and adds triage after open.
func ticketV2(ups ...gendurable.Upgrade) gendurable.FSM[ticket] {
	return gendurable.FSM[ticket]{
		Name: "ticket", Start: "open", Queue: "tickets", Version: 2, Upgrades: ups,
		Steps: map[string]gendurable.StepFunc[ticket]{
			"open": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
				return gendurable.Next("triage", t.at("open")), nil
			},
			"triage": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
				t.Priority = "normal"
				return gendurable.Await([]string{"go"}, "approve", t.at("triage")), nil
			},
			"approve": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
				if t.Priority == "" {
					return gendurable.Outcome{}, errors.New("approve needs a priority")
				}
				return gendurable.Next("finish", t.at("approve")), nil
			},
			"finish": func(ctx *gendurable.Ctx, t ticket) (gendurable.Outcome, error) {
				return gendurable.Done(t.at("finish")), nil
			},
		},
	}
}

// ticketUpgrade brings version 1 forward: review is approve now, close is finish, and the state
// gains a priority (the example's upgrade: the same JSON fields).
var ticketUpgrade = gendurable.Upgrade{
	From:  1,
	Steps: map[string]string{"review": "approve", "close": "finish"},
	State: tickets.Upgrades[0].State,
}

func TestAnOlderVersionIsBroughtForwardWhenClaimed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	v1 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV1}})
	kit1 := durabletest.New(t, v1, nil)
	parked := make([]int64, 2)
	for i := range parked {
		res, err := v1.Insert(ctx, ticketV1.With(ticket{Title: "parked"}), nil)
		require.NoError(t, err)
		parked[i] = res.ID
	}
	require.Equal(t, 2, kit1.Drain(ctx).Steps)
	for _, id := range parked {
		kit1.RequireAwaiting(ctx, id, "go")
	}
	later, err := v1.Insert(ctx, ticketV1.With(ticket{Title: "later"}), &gendurable.InsertOpts{In: time.Hour})
	require.NoError(t, err)

	v2 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV2(ticketUpgrade)}})
	kit2 := durabletest.New(t, v2, nil)
	for _, id := range parked {
		_, err := v2.Signal(ctx, gendurable.ByID(id), "go", nil)
		require.NoError(t, err)
	}
	res := kit2.Drain(ctx)
	// Each of the three is brought forward once, then runs on version 2's steps: the parked two
	// from review (now approve), the scheduled one from open.
	require.Equal(t, 3, res.Outcomes["upgrade"])
	for _, id := range parked {
		var got ticket
		in := kit2.RequireDone(ctx, id, &got)
		require.Equal(t, []string{"open", "approve", "finish"}, got.Path)
		require.Equal(t, "normal", got.Priority)
		require.Equal(t, 2, in.MachineVersion)
		require.Len(t, in.Upgrades, 1)
		u := in.Upgrades[0]
		require.Equal(t, [4]any{1, 2, "review", "approve"}, [4]any{u.From, u.To, u.StepFrom, u.StepTo})
		require.NotEmpty(t, u.By)
		require.Equal(t, []string{"open", "approve", "finish"}, in.Path)
	}
	// The scheduled one went on at version 2's open, then triage, and parks as version 2 does.
	in := kit2.RequireAwaiting(ctx, later.ID, "go")
	require.Equal(t, 2, in.MachineVersion)
	require.Equal(t, []string{"open", "triage"}, in.Path)
	require.Len(t, in.Upgrades, 1)
	require.Equal(t, [2]string{"open", "open"}, [2]string{in.Upgrades[0].StepFrom, in.Upgrades[0].StepTo})
	// A new instance starts at version 2 and is never upgraded.
	fresh, err := v2.Insert(ctx, ticketV2(ticketUpgrade).With(ticket{Title: "new"}), nil)
	require.NoError(t, err)
	kit2.Drain(ctx)
	in = kit2.RequireAwaiting(ctx, fresh.ID, "go")
	require.Equal(t, 2, in.MachineVersion)
	require.Empty(t, in.Upgrades)
}

func TestANodeNeverClaimsANewerVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	v2 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV2(ticketUpgrade)}})
	res, err := v2.Insert(ctx, ticketV2(ticketUpgrade).With(ticket{Title: "v2"}), nil)
	require.NoError(t, err)

	v1 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV1}})
	kit1 := durabletest.New(t, v1, nil)
	dr, err := kit1.TryDrain(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, dr.Steps)
	in := kit1.Get(ctx, res.ID)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
	require.Equal(t, [3]any{2, "open", 0}, [3]any{in.MachineVersion, in.Step, in.Attempt})

	kit2 := durabletest.New(t, v2, nil)
	kit2.Drain(ctx)
	kit2.RequireAwaiting(ctx, res.ID, "go")
}

func TestARowThatCannotBeBroughtForwardIsHandedBackWithItsReason(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ups  []gendurable.Upgrade
		want string
	}{
		{"no upgrade declared", nil, "declares no Upgrade from version 1"},
		{"a removed step with no mapping", []gendurable.Upgrade{{From: 1, Steps: map[string]string{"close": "finish"}}},
			`step "review" became "review", which version 2 lacks`},
		{"the state function fails", []gendurable.Upgrade{{From: 1, Steps: ticketUpgrade.Steps,
			State: func(string, json.RawMessage) (json.RawMessage, error) { return nil, errors.New("no priority known") }}},
			"no priority known"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			v1 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV1}})
			res, err := v1.Insert(ctx, ticketV1.With(ticket{Title: "stuck"}), nil)
			require.NoError(t, err)
			durabletest.New(t, v1, nil).Drain(ctx)
			_, err = v1.Signal(ctx, gendurable.ByID(res.ID), "go", nil)
			require.NoError(t, err)

			v2 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV2(tc.ups...)}})
			kit2 := durabletest.New(t, v2, nil)
			_, err = kit2.TryDrain(ctx, nil)
			require.ErrorIs(t, err, gendurable.ErrUpgrade)
			require.ErrorContains(t, err, tc.want)
			// Handed back untouched: still version 1 at review, its attempt restored, nothing
			// recorded; a node of version 1 still runs it to the end.
			in := kit2.Get(ctx, res.ID)
			require.Equal(t, [4]any{1, "review", 0, gendurable.StatusAvailable},
				[4]any{in.MachineVersion, in.Step, in.Attempt, in.Status})
			require.Empty(t, in.Upgrades)
			require.Empty(t, in.Errors)
			var got ticket
			kit1 := durabletest.New(t, v1, nil)
			kit1.Drain(ctx)
			kit1.RequireDone(ctx, res.ID, &got)
			require.Equal(t, []string{"open", "review", "close"}, got.Path)
		})
	}
}

func TestMachineVersionsAreValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cases := []struct {
		name string
		m    gendurable.FSM[ticket]
		want string
	}{
		{"negative version", func() gendurable.FSM[ticket] { m := ticketV2(); m.Version = -1; return m }(), "Version -1"},
		{"upgrade from version 0", ticketV2(gendurable.Upgrade{From: 0}), "an Upgrade from version 0"},
		{"upgrade from the current version", ticketV2(gendurable.Upgrade{From: 2}), "an Upgrade from version 2"},
		{"two upgrades from one version", ticketV2(ticketUpgrade, ticketUpgrade), "two Upgrades from version 1"},
		{"a mapping to a step the machine lacks", ticketV2(gendurable.Upgrade{From: 1, Steps: map[string]string{"review": "nowhere"}}),
			`maps step "review" to "nowhere", which is not in Steps`},
		{"upgrades on a machine of version 1", func() gendurable.FSM[ticket] {
			m := ticketV1
			m.Upgrades = []gendurable.Upgrade{ticketUpgrade}
			return m
		}(),
			"an Upgrade from version 1"},
	}
	for _, tc := range cases {
		_, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{tc.m}})
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

func TestRowsNoRunningNodeCanRunAreShownAsBlocked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	v1 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV1}})
	res, err := v1.Insert(ctx, ticketV1.With(ticket{Title: "parked"}), nil)
	require.NoError(t, err)
	durabletest.New(t, v1, nil).Drain(ctx)
	_, err = v1.Insert(ctx, ticketV1.With(ticket{Title: "other queue"}), &gendurable.InsertOpts{Queue: "nobody"})
	require.NoError(t, err)

	// A running node of version 2 whose upgrade forgets review: the parked row, and the row in a
	// queue no node works, are blocked; the node's own rows are not.
	v2 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV2(gendurable.Upgrade{From: 1,
		Steps: map[string]string{"close": "finish"}})}, Queues: map[string]gendurable.QueueConfig{"tickets": {}}})
	start(t, v2)
	fine, err := v2.Insert(ctx, ticketV2().With(ticket{Title: "new"}), &gendurable.InsertOpts{In: time.Hour})
	require.NoError(t, err)

	web := e.client(t, nil) // an operator's client: registers nothing, runs nothing
	groups, err := web.Stuck(ctx)
	require.NoError(t, err)
	var blocked []gendurable.StuckGroup
	for _, g := range groups {
		if g.Kind == gendurable.StuckBlocked {
			require.NotEqual(t, fine.ID, g.FirstID)
			g.Oldest = time.Time{}
			blocked = append(blocked, g)
		}
	}
	require.Equal(t, []gendurable.StuckGroup{
		{Kind: gendurable.StuckBlocked, Queue: "nobody", Machine: "ticket", Step: "open", Version: 1, Count: 1, FirstID: res.ID + 1,
			Reason: `no running node works queue "nobody"`},
		{Kind: gendurable.StuckBlocked, Queue: "tickets", Machine: "ticket", Step: "review", Version: 1, Count: 1, FirstID: res.ID,
			Reason: `the Upgrades of machine "ticket" take step "review" of version 1 to "review", which version 2 lacks`},
	}, blocked)

	d, err := web.Inspect(ctx, res.ID, nil)
	require.NoError(t, err)
	require.Equal(t, blocked[1].Reason, d.Blocked)
	d, err = web.Inspect(ctx, fine.ID, nil)
	require.NoError(t, err)
	require.Empty(t, d.Blocked)
	// The registry holds the running node with what it runs.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.nodes WHERE queues = '{tickets}'
		AND machines -> 'ticket' ->> 'version' = '2' AND machines -> 'ticket' -> 'upgrades' -> '1' -> 'steps' ->> 'close' = 'finish'`))

	// Once the node stops, it leaves the registry; nothing runs at all: nothing to compare with,
	// nothing reported.
	require.NoError(t, v2.Stop(ctx))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.nodes`))
	groups, err = web.Stuck(ctx)
	require.NoError(t, err)
	for _, g := range groups {
		require.NotEqual(t, gendurable.StuckBlocked, g.Kind, "%+v", g)
	}
}

// parkTickets inserts n version-1 tickets and parks them on "go" at review (the step version 2
// renames), through a version-1 client.
func parkTickets(t *testing.T, e *env, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	// A running client parks them (its steps run side by side and commit in groups), then stops.
	v1 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV1},
		Queues: map[string]gendurable.QueueConfig{"tickets": {Concurrency: 32}}})
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: ticketV1.With(ticket{Title: "parked"})}
	}
	res, err := v1.InsertMany(ctx, params)
	require.NoError(t, err)
	require.NoError(t, v1.Start(ctx))
	eventually(t, time.Minute, "the tickets parked", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting' AND step = 'review'`) == n
	})
	require.NoError(t, v1.Stop(ctx))
	ids := make([]int64, n)
	for i, r := range res {
		ids[i] = r.ID
	}
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting' AND step = 'review'`))
	return ids
}

func TestBulkUpgradeBringsParkedInstancesForwardOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const n = 1200
	parkTickets(t, e, n)
	// One ticket's state the upgrade refuses: it stays at version 1, counted as blocked.
	e.exec(t, `UPDATE {schema}.instances SET state = state || '{"title": "refuse"}' WHERE id = (SELECT min(id) FROM {schema}.instances)`)
	up := ticketUpgrade
	up.State = func(step string, state json.RawMessage) (json.RawMessage, error) {
		var tk ticket
		if err := json.Unmarshal(state, &tk); err != nil || tk.Title == "refuse" {
			return nil, errors.New("refused")
		}
		return ticketUpgrade.State(step, state)
	}
	v2 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV2(up)}})

	// Four callers at once: every row is brought forward exactly once, whoever does it.
	results := make(chan gendurable.UpgradeResult, 4)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			r, err := v2.Upgrade(ctx, "ticket")
			results <- r
			errs <- err
		}()
	}
	var upgraded, blocked int64
	for range 4 {
		require.NoError(t, <-errs)
		r := <-results
		upgraded += r.Upgraded
		blocked += r.Blocked
	}
	require.Equal(t, int64(n-1), upgraded)
	require.GreaterOrEqual(t, blocked, int64(1))
	require.Equal(t, n-1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine_version = 2 AND step = 'approve'
		AND status = 'awaiting' AND state ->> 'priority' = 'normal' AND jsonb_array_length(upgrades) = 1
		AND upgrades -> 0 ->> 'step_from' = 'review' AND upgrades -> 0 ->> 'by' LIKE 'Client.Upgrade on %'`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine_version = 1 AND upgrades IS NULL`))

	// Again: nothing left but the blocked one.
	r, err := v2.Upgrade(ctx, "ticket")
	require.NoError(t, err)
	require.Equal(t, gendurable.UpgradeResult{Upgraded: 0, Blocked: 1}, r)
	_, err = v2.Upgrade(ctx, "nope")
	require.ErrorIs(t, err, gendurable.ErrUnknownMachine)
}

func TestAnOperatorsUpgradeRequestIsWorkedByARunningNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	parkTickets(t, e, 50)
	op := e.client(t, nil)
	// No running node can take it: refused, nothing recorded.
	_, err := op.RequestUpgrade(ctx, "ticket")
	require.ErrorIs(t, err, gendurable.ErrUnknownMachine)
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.upgrade_requests`))
	v2 := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{ticketV2(ticketUpgrade)},
		Queues: map[string]gendurable.QueueConfig{"tickets": {}}})
	start(t, v2)
	id, err := op.RequestUpgrade(ctx, "ticket")
	require.NoError(t, err)
	var r *gendurable.UpgradeRequest
	eventually(t, 30*time.Second, "the request finished", func() bool {
		r, err = op.UpgradeRequestStatus(ctx, id)
		require.NoError(t, err)
		return r.FinishedAt != nil
	})
	require.Equal(t, [4]any{int64(50), int64(0), 2, ""}, [4]any{r.Upgraded, r.Blocked, r.Version, r.Error})
	require.Equal(t, v2.Schema(), e.schema)
	require.NotEmpty(t, r.TakenBy)
	require.Equal(t, 50, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine_version = 2 AND step = 'approve'`))
	_, err = op.UpgradeRequestStatus(ctx, id+100)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

// Four running nodes race for three requests: each request is worked by one node at a time, and
// every parked instance is brought forward exactly once, whoever does it.
func TestNodesRacingForUpgradeRequestsUpgradeEachInstanceOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const n = 600
	parkTickets(t, e, n)
	for i := range 4 {
		start(t, e.client(t, &gendurable.Config{Name: fmt.Sprint("v2-", i), Machines: []gendurable.Machine{ticketV2(ticketUpgrade)},
			Queues: map[string]gendurable.QueueConfig{"tickets": {}}}))
	}
	op := e.client(t, nil)
	var ids []int64
	for range 3 {
		id, err := op.RequestUpgrade(ctx, "ticket")
		require.NoError(t, err)
		ids = append(ids, id)
	}
	var total int64
	for _, id := range ids {
		var r *gendurable.UpgradeRequest
		eventually(t, time.Minute, "the requests finished", func() bool {
			var err error
			r, err = op.UpgradeRequestStatus(ctx, id)
			require.NoError(t, err)
			return r.FinishedAt != nil
		})
		require.Empty(t, r.Error)
		require.NotEmpty(t, r.TakenBy)
		total += r.Upgraded
	}
	require.Equal(t, int64(n), total, "upgrades counted by the requests")
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine_version = 2
		AND jsonb_array_length(upgrades) = 1`))
}
