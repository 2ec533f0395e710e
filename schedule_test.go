package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// tick is a job that does nothing: what a schedule fires in these tests.
var tick = gendurable.Job[string]{Name: "tick", Queue: "ticks", Perform: func(*gendurable.Ctx, string) error { return nil }}

// parked is a machine whose instances wait for a signal that never comes: they stay live.
var parked = gendurable.FSM[struct{}]{Name: "parked", Start: "wait", Queue: "ticks",
	Steps: map[string]gendurable.StepFunc[struct{}]{
		"wait": func(*gendurable.Ctx, struct{}) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"never"}, "wait", struct{}{}), nil
		},
	}}

func scheduleClient(t *testing.T, e *env, cfg gendurable.Config) *gendurable.Client {
	t.Helper()
	cfg.Machines = []gendurable.Machine{tick, parked}
	if cfg.Queues == nil {
		cfg.Queues = map[string]gendurable.QueueConfig{"ticks": {}}
	}
	return e.client(t, &cfg)
}

func TestSchedulesRefuseBadInputAndStoreNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	good := gendurable.Schedule{Name: "s", Input: tick.With("x"), Every: time.Second}
	for _, c := range []struct {
		edit  func(*gendurable.Schedule)
		field string
		text  string
	}{
		{func(s *gendurable.Schedule) { s.Every, s.Cron = 0, "61 * * * *" }, "Cron", "61"},
		{func(s *gendurable.Schedule) { s.Every, s.Cron, s.TimeZone = 0, "* * * * *", "Europe/Nowhere" }, "TimeZone", "Europe/Nowhere"},
		{func(s *gendurable.Schedule) { s.Every = 500 * time.Millisecond }, "Every", "at least 1s"},
		{func(s *gendurable.Schedule) { s.Every = 0 }, "Cron", "neither"},
		{func(s *gendurable.Schedule) {
			s.Input = gendurable.Job[string]{Name: "elsewhere", Perform: func(*gendurable.Ctx, string) error { return nil }}.With("")
		}, "Input", `machine "elsewhere" is not registered`},
		{func(s *gendurable.Schedule) { s.Name = "" }, "Name", `""`},
		{func(s *gendurable.Schedule) { s.Overlap = "sometimes" }, "Overlap", "sometimes"},
		{func(s *gendurable.Schedule) { s.Opts = &gendurable.InsertOpts{CorrelationKey: "k"} }, "Opts", "correlation key"},
		{func(s *gendurable.Schedule) { s.Opts = &gendurable.InsertOpts{In: time.Second} }, "Opts", "set by the schedule"},
		{func(s *gendurable.Schedule) { s.Opts = &gendurable.InsertOpts{FairnessKey: "t"} }, "Opts", "cannot take a FairnessKey"},
		{func(s *gendurable.Schedule) { s.Opts = &gendurable.InsertOpts{Priority: 12} }, "Priority", "12"},
	} {
		s := good
		c.edit(&s)
		// At declaration: NewClient names the field.
		_, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{tick},
			Schedules: []gendurable.Schedule{s}})
		var ce *gendurable.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", s)
		require.Equal(t, "Schedules[0]."+c.field, ce.Field)
		require.ErrorContains(t, err, c.text)
		// At run time: SetSchedule does.
		cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{tick}})
		err = cl.SetSchedule(context.Background(), s)
		var ie *gendurable.InputError
		require.ErrorAs(t, err, &ie)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput)
		require.Equal(t, c.field, ie.Field)
	}
	_, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{tick},
		Schedules: []gendurable.Schedule{good, good}})
	require.ErrorContains(t, err, "declared twice")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.schedules`))
}

func TestAScheduleFiresOnceAtEachFireTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	var fired []gendurable.Event
	cl := scheduleClient(t, e, gendurable.Config{Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
		if ev.Name == gendurable.EventScheduleFired {
			mu.Lock()
			fired = append(fired, ev)
			mu.Unlock()
		}
	}}})
	start(t, cl)
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "every-second", Input: tick.With("hi"), Every: time.Second,
		Overlap: gendurable.OverlapAllow}))
	eventually(t, 20*time.Second, "three fires done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'tick' AND status = 'done'`) >= 3
	})
	info, err := cl.GetSchedule(ctx, "every-second")
	require.NoError(t, err)
	require.Positive(t, info.Fired)
	require.Equal(t, gendurable.OverlapAllow, info.Overlap)
	require.NotNil(t, info.LastInstanceID)
	require.True(t, info.NextFireAt.After(*info.LastFireAt))
	// Every instance is keyed by its fire time, a whole second, one apart from the next.
	var keys []string
	rows, err := e.pool.Query(ctx, expand(`SELECT correlation_key FROM {schema}.instances WHERE machine = 'tick' ORDER BY id`, e.schema))
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	for i, k := range keys {
		at, err := time.Parse(time.RFC3339Nano, k[len("schedule/every-second/"):])
		require.NoError(t, err, k)
		require.Equal(t, at, at.Truncate(time.Second))
		if i > 0 {
			prev, _ := time.Parse(time.RFC3339Nano, keys[i-1][len("schedule/every-second/"):])
			require.Equal(t, time.Second, at.Sub(prev), "fire times %v", keys)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, fired)
	require.Equal(t, "every-second", fired[0].Schedule)
	require.Equal(t, "ticks", fired[0].Queue)
}

func TestOperatorsPauseResumeTriggerAndRemoveSchedules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cl := scheduleClient(t, e, gendurable.Config{})
	start(t, cl)
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "daily", Input: tick.With("d"), Cron: "0 3 * * *",
		TimeZone: "Europe/Berlin"}))
	require.NoError(t, cl.PauseSchedule(ctx, "daily"))
	info, err := cl.GetSchedule(ctx, "daily")
	require.NoError(t, err)
	require.True(t, info.Paused)
	// Trigger fires now, paused or not, without moving the next fire time.
	id, err := cl.TriggerSchedule(ctx, "daily")
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the triggered instance done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, id) == 1
	})
	after, err := cl.GetSchedule(ctx, "daily")
	require.NoError(t, err)
	require.Equal(t, info.NextFireAt, after.NextFireAt)
	require.Equal(t, id, *after.LastInstanceID)
	require.Equal(t, int64(1), after.Fired)
	// Resume: the next fire time is after now, at 03:00 Berlin.
	require.NoError(t, cl.ResumeSchedule(ctx, "daily"))
	after, err = cl.GetSchedule(ctx, "daily")
	require.NoError(t, err)
	require.False(t, after.Paused)
	berlin, _ := time.LoadLocation("Europe/Berlin")
	require.Equal(t, 3, after.NextFireAt.In(berlin).Hour())
	require.True(t, after.NextFireAt.After(time.Now()))
	// Unknown names.
	for _, err := range []error{cl.PauseSchedule(ctx, "nope"), cl.ResumeSchedule(ctx, "nope"), cl.RemoveSchedule(ctx, "nope")} {
		require.ErrorIs(t, err, gendurable.ErrUnknownSchedule)
	}
	_, err = cl.TriggerSchedule(ctx, "nope")
	require.ErrorIs(t, err, gendurable.ErrUnknownSchedule)
	// Remove: the schedule goes, its instances stay.
	require.NoError(t, cl.RemoveSchedule(ctx, "daily"))
	_, err = cl.GetSchedule(ctx, "daily")
	require.ErrorIs(t, err, gendurable.ErrUnknownSchedule)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1`, id))
}

func TestAServiceReconcilesOnlyItsOwnSchedules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	daily := func(name string) gendurable.Schedule {
		return gendurable.Schedule{Name: name, Input: tick.With(name), Cron: "0 0 4 * * *"}
	}
	noQueues := map[string]gendurable.QueueConfig{}
	a := scheduleClient(t, e, gendurable.Config{Service: "billing", Queues: noQueues,
		Schedules: []gendurable.Schedule{daily("invoices"), daily("reminders"), daily("shared")}})
	require.NoError(t, a.Start(ctx))
	require.NoError(t, a.Stop(ctx))
	require.NoError(t, a.SetSchedule(ctx, daily("adhoc")))
	// Another service with no schedules, and one that declares the shared one too: nothing of
	// billing's goes, and the shared one stays billing's.
	b := scheduleClient(t, e, gendurable.Config{Service: "mail", Queues: noQueues})
	require.NoError(t, b.Start(ctx))
	require.NoError(t, b.Stop(ctx))
	c := scheduleClient(t, e, gendurable.Config{Service: "reports", Queues: noQueues,
		Schedules: []gendurable.Schedule{daily("shared"), daily("weekly")}})
	require.NoError(t, c.Start(ctx))
	require.NoError(t, c.Stop(ctx))
	owners := func() map[string]string {
		list, err := a.Schedules(ctx)
		require.NoError(t, err)
		out := map[string]string{}
		for _, s := range list {
			out[s.Name] = s.DeclaredBy
		}
		return out
	}
	require.Equal(t, map[string]string{"invoices": "billing", "reminders": "billing", "shared": "billing", "adhoc": "",
		"weekly": "reports"}, owners())
	// A run-time SetSchedule may not rewrite a declared schedule.
	require.ErrorIs(t, b.SetSchedule(ctx, daily("invoices")), gendurable.ErrScheduleOwned)
	// Billing drops "reminders" and changes "invoices": only its own schedules change.
	changed := daily("invoices")
	changed.Cron = "0 0 5 * * *"
	a2 := scheduleClient(t, e, gendurable.Config{Service: "billing", Queues: noQueues,
		Schedules: []gendurable.Schedule{changed, daily("shared")}})
	require.NoError(t, a2.Start(ctx))
	require.NoError(t, a2.Stop(ctx))
	require.Equal(t, map[string]string{"invoices": "billing", "shared": "billing", "adhoc": "", "weekly": "reports"}, owners())
	inv, err := a.GetSchedule(ctx, "invoices")
	require.NoError(t, err)
	require.Equal(t, "0 0 5 * * *", inv.Cron)
	require.Equal(t, 5, inv.NextFireAt.UTC().Hour())
}

// A schedule whose fire times passed while no node ran: the ones inside its catch-up window
// fire when a node comes back, the older ones are skipped and reported.
func TestMissedFireTimesAreCaughtUpWithinTheWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	skipped := map[string]int{}
	setup := scheduleClient(t, e, gendurable.Config{Queues: map[string]gendurable.QueueConfig{}})
	require.NoError(t, setup.SetSchedule(ctx, gendurable.Schedule{Name: "window", Input: tick.With("w"), Every: time.Second,
		CatchUp: 5 * time.Second, Overlap: gendurable.OverlapAllow}))
	require.NoError(t, setup.SetSchedule(ctx, gendurable.Schedule{Name: "latest", Input: tick.With("l"), Every: time.Second,
		Overlap: gendurable.OverlapAllow}))
	// Down for 30 seconds: the schedules' next fire times lie that far back. The database's own
	// clock decides what is due.
	e.exec(t, `UPDATE {schema}.schedules SET next_fire_at = date_trunc('second', now()) - interval '30 seconds'`)
	var due time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT next_fire_at FROM {schema}.schedules LIMIT 1`, e.schema)).Scan(&due))
	cl := scheduleClient(t, e, gendurable.Config{Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
		if ev.Name == gendurable.EventScheduleSkipped && ev.Reason == "catch-up" {
			mu.Lock()
			skipped[ev.Schedule] += ev.Count
			mu.Unlock()
		}
	}}})
	start(t, cl)
	eventually(t, 20*time.Second, "both schedules fired", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.schedules WHERE last_fire_at IS NOT NULL`) == 2
	})
	// The first round's fires: all fire times from the first fired one on are contiguous, and
	// nothing older than the window (counted from the round's clock) fired.
	for _, c := range []struct {
		name   string
		window time.Duration
	}{{"window", 5 * time.Second}, {"latest", 0}} {
		var first time.Time
		var n int
		var skip int64
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT min(i.inserted_at), count(*), s.skipped FROM {schema}.instances i
			JOIN {schema}.schedules s ON i.correlation_key LIKE 'schedule/' || s.name || '/%'
			WHERE s.name = $1 GROUP BY s.skipped`, e.schema), c.name).Scan(&first, &n, &skip))
		// The first round ran at `first` (the insert's clock): what it fired lies within the
		// window of it, and every fire time before that was skipped.
		var oldest time.Time
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT min(scheduled_at) FROM {schema}.instances
			WHERE correlation_key LIKE 'schedule/' || $1 || '/%'`, e.schema), c.name).Scan(&oldest))
		require.False(t, oldest.Before(first.Add(-c.window-time.Second)), "%s: fired %v, older than its window at %v", c.name, oldest, first)
		require.Equal(t, int64(oldest.Sub(due)/time.Second), skip, "%s: skipped count", c.name)
		// Hooks get events on a goroutine of their own, behind the commit: wait for the report.
		eventually(t, 10*time.Second, c.name+": the skips reported as the schedule counts them", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return skipped[c.name] == int(skip)
		})
		if c.window == 0 {
			// Only the latest missed time: nothing older than a second before the round.
			require.False(t, oldest.Before(first.Add(-time.Second)))
		} else {
			require.GreaterOrEqual(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE correlation_key LIKE 'schedule/window/%'
				AND scheduled_at <= $1`, first), 5, "the window's fire times fired")
		}
	}
}

// Overlap policies: skip leaves a live instance alone and fires nothing; cancel cancels it (with
// the event an operator's cancel has) and fires.
func TestOverlapPolicies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	cancelEvents := map[int64]int{}
	cl := scheduleClient(t, e, gendurable.Config{Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
		if ev.Name == gendurable.EventInstanceCancelled {
			mu.Lock()
			cancelEvents[ev.InstanceID]++
			mu.Unlock()
		}
	}}})
	start(t, cl)
	for _, o := range []gendurable.Overlap{gendurable.OverlapSkip, gendurable.OverlapCancel} {
		require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: string(o), Input: parked.With(struct{}{}),
			Every: time.Second, Overlap: o}))
	}
	eventually(t, 20*time.Second, "three fire times past each", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.schedules WHERE fired + skipped >= 3`) == 2
	})
	// Skip: one instance, live; the rest skipped.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE correlation_key LIKE 'schedule/skip/%'`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.schedules WHERE name = 'skip' AND fired = 1 AND skipped >= 2
		AND last_skip ->> 'reason' = 'overlap'`))
	// Cancel: every fire made an instance and cancelled the one before; one is live.
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE correlation_key LIKE 'schedule/cancel/%'
		AND status IN ('available', 'executing', 'awaiting')`))
	require.GreaterOrEqual(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE correlation_key LIKE 'schedule/cancel/%'
		AND status = 'cancelled'`), 2)
	// One instance.cancelled per cancelled row (reported after each round's commit).
	eventually(t, 10*time.Second, "an event per cancelled instance", func() bool {
		rows, err := e.pool.Query(ctx, expand(`SELECT id FROM {schema}.instances WHERE status = 'cancelled'`, e.schema))
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if cancelEvents[id] != 1 {
				return false
			}
		}
		return len(cancelEvents) >= len(ids)
	})
}

// Many nodes fire the same schedules at once: exactly one instance per schedule and fire time.
func TestRacingNodesFireEachFireTimeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const nodes, schedules = 6, 20
	setup := scheduleClient(t, e, gendurable.Config{Queues: map[string]gendurable.QueueConfig{}})
	for i := range schedules {
		// A catch-up window of a minute: a round that comes late on a loaded machine fires the
		// times it missed instead of skipping them, so every fire time has its instance.
		require.NoError(t, setup.SetSchedule(ctx, gendurable.Schedule{Name: fmt.Sprint("s", i), Input: tick.With(""),
			Every: time.Second, Overlap: gendurable.OverlapAllow, CatchUp: time.Minute}))
	}
	for i := range nodes {
		cl := scheduleClient(t, e, gendurable.Config{Name: fmt.Sprint("n", i), Queues: map[string]gendurable.QueueConfig{}})
		start(t, cl)
	}
	eventually(t, 30*time.Second, "five fire times of each", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.schedules WHERE fired >= 5`) == schedules
	})
	// From the rows: one instance per key, and per schedule the fire times form an unbroken run
	// of whole seconds (as many as it counted fired, none skipped).
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT correlation_key FROM {schema}.instances
		GROUP BY 1 HAVING count(*) > 1) d`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM (
		SELECT s.name, s.fired, s.skipped, count(i.id) AS n,
		       extract(epoch FROM max(i.scheduled_at) - min(i.scheduled_at))::int + 1 AS span
		FROM {schema}.schedules s JOIN {schema}.instances i ON i.correlation_key LIKE 'schedule/' || s.name || '/%'
		GROUP BY 1, 2, 3) x WHERE n <> span OR n <> fired OR skipped <> 0`))
}
