package gendurable_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Every invalid option is a *ConfigError naming it, returned by NewClient before any goroutine
// starts or any query is sent. Not parallel: it counts the process's goroutines.
func TestConfigInvalidFieldsFailBeforeAnySideEffect(t *testing.T) {
	// A pool to a server that does not exist: any query would fail loudly.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	noSteps := gendurable.FSM[counter]{Name: "x", Start: "a"}
	badStart := gendurable.FSM[counter]{Name: "x", Start: "b", Steps: map[string]gendurable.StepFunc[counter]{
		"a": func(*gendurable.Ctx, counter) (gendurable.Outcome, error) { return gendurable.Done(nil), nil }}}
	cases := []struct {
		cfg   gendurable.Config
		field string
	}{
		{gendurable.Config{Name: "a:b"}, "Name"},
		{gendurable.Config{Name: strings.Repeat("n", 65)}, "Name"},
		{gendurable.Config{Schema: `x"; DROP SCHEMA public; --`}, "Schema"},
		{gendurable.Config{Lease: time.Millisecond}, "Lease"},
		{gendurable.Config{Lease: -time.Second}, "Lease"},
		{gendurable.Config{Heartbeat: 20 * time.Second}, "Heartbeat"},
		{gendurable.Config{Heartbeat: -time.Second}, "Heartbeat"},
		{gendurable.Config{PollInterval: -time.Second}, "PollInterval"},
		{gendurable.Config{Reaper: &gendurable.ReaperConfig{Interval: -time.Second}}, "Reaper.Interval"},
		{gendurable.Config{MaxPayloadBytes: -1}, "MaxPayloadBytes"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: -1}}}, "Queues[q].Concurrency"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 10001}}}, "Queues[q].Concurrency"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Prefetch: -1}}}, "Queues[q].Prefetch"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Prefetch: 10001}}}, "Queues[q].Prefetch"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {PollInterval: -1}}}, "Queues[q].PollInterval"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"": {}}}, "Queues[]"},
		{gendurable.Config{Machines: []gendurable.Machine{nil}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{noSteps}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{badStart}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{noop, noop}}, "Machines[1]"},
		{gendurable.Config{Machines: []gendurable.Machine{gendurable.Job[counter]{Name: "nope"}}}, "Machines[0]"},
		{gendurable.Config{Hooks: []func(gendurable.Event){nil}}, "Hooks[0]"},
		{gendurable.Config{Reaper: &gendurable.ReaperConfig{Interval: time.Microsecond}}, "Reaper.Interval"},
		{gendurable.Config{Reaper: &gendurable.ReaperConfig{Disabled: true, Interval: -time.Second}}, "Reaper.Interval"},
		{gendurable.Config{GC: &gendurable.GCConfig{Interval: -time.Second}}, "GC.Interval"},
		{gendurable.Config{GC: &gendurable.GCConfig{Interval: time.Microsecond}}, "GC.Interval"},
		{gendurable.Config{GC: &gendurable.GCConfig{Retention: -time.Hour}}, "GC.Retention"},
		{gendurable.Config{GC: &gendurable.GCConfig{Retention: 10 * time.Second}}, "GC.Retention"},
		{gendurable.Config{Lease: 2 * time.Minute, GC: &gendurable.GCConfig{Retention: time.Minute}}, "GC.Retention"},
		{gendurable.Config{GC: &gendurable.GCConfig{Batch: -1}}, "GC.Batch"},
		{gendurable.Config{GC: &gendurable.GCConfig{Batch: 10_001}}, "GC.Batch"},
		{gendurable.Config{GC: &gendurable.GCConfig{Disabled: true, Batch: -1}}, "GC.Batch"},
		{gendurable.Config{MaxChildren: -1}, "MaxChildren"},
		{gendurable.Config{Lease: time.Second, Heartbeat: time.Second / 2}, "Heartbeat"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{"bad\x00": {}}}, "Queues[bad\x00]"},
		{gendurable.Config{Queues: map[string]gendurable.QueueConfig{strings.Repeat("q", 129): {}}}, "Queues[" + strings.Repeat("q", 129) + "]"},
		{gendurable.Config{Machines: []gendurable.Machine{gendurable.Job[counter]{Name: "j", Perform: perform, Queue: "bad\x01"}}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{gendurable.Job[counter]{Name: "j", Perform: perform, MaxAttempts: -1}}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{gendurable.FSM[counter]{Name: "f", Start: "a", Steps: oneStep, Queue: strings.Repeat("q", 129)}}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{gendurable.FSM[counter]{Name: "f", Start: "a", Steps: oneStep, MaxAttempts: math.MaxInt32 + 1}}}, "Machines[0]"},
		{gendurable.Config{Machines: []gendurable.Machine{gendurable.FSM[counter]{Name: "", Start: "a", Steps: oneStep}}}, "Machines[0]"},
		{gendurable.Config{ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"a:b": {Limit: 1}}}, "ConcurrencyLimits[a:b]"},
		{gendurable.Config{ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"x": {Limit: 0}}}, "ConcurrencyLimits[x].Limit"},
		{gendurable.Config{ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"x": {Limit: math.MaxInt32 + 1}}}, "ConcurrencyLimits[x].Limit"},
		{gendurable.Config{ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"x": {Limit: 2, Shards: 3}}}, "ConcurrencyLimits[x].Shards"},
		{gendurable.Config{ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"x": {Limit: 5000, Shards: 1001}}}, "ConcurrencyLimits[x].Shards"},
		{gendurable.Config{RateLimits: map[string]gendurable.Rate{"": {Allowed: 1, Period: time.Second}}}, "RateLimits[]"},
		{gendurable.Config{RateLimits: map[string]gendurable.Rate{"r": {Allowed: 1, Period: -time.Second}}}, "RateLimits[r].Period"},
		{gendurable.Config{RateLimits: map[string]gendurable.Rate{"r": {Allowed: -1, Period: time.Second}}}, "RateLimits[r].Allowed"},
		{gendurable.Config{RateLimits: map[string]gendurable.Rate{"r": {Allowed: 1, Period: time.Second, Burst: -1}}}, "RateLimits[r].Burst"},
		{gendurable.Config{FairnessWeights: map[string]float64{"t": 0}}, "FairnessWeights[t]"},
		{gendurable.Config{FairnessWeights: map[string]float64{"t": math.NaN()}}, "FairnessWeights[t]"},
		{gendurable.Config{FairnessWeights: map[string]float64{"t": math.Inf(1)}}, "FairnessWeights[t]"},
		{gendurable.Config{FairnessWeights: map[string]float64{"": 1}}, "FairnessWeights[]"},
		{gendurable.Config{FairnessDefaultWeight: -1}, "FairnessDefaultWeight"},
		{gendurable.Config{FairnessDefaultWeight: 2e4}, "FairnessDefaultWeight"},
		{gendurable.Config{FairnessWeights: map[string]float64{"t": 0.001}}, "FairnessWeights[t]"},
	}
	before := runtime.NumGoroutine()
	for _, c := range cases {
		_, err := gendurable.NewClient(pool, &c.cfg)
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, c.field)
		var ce *gendurable.ConfigError
		require.True(t, errors.As(err, &ce), c.field)
		require.Equal(t, c.field, ce.Field)
		require.Contains(t, err.Error(), c.field)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before, "no goroutine started")
	require.Equal(t, int32(0), pool.Stat().TotalConns(), "no connection made")

	// Valid edges: a disabled component with valid options, a lease longer than the default
	// retention (the default retention follows it), GC's extremes.
	for _, cfg := range []gendurable.Config{
		{GC: &gendurable.GCConfig{Disabled: true}, Reaper: &gendurable.ReaperConfig{Disabled: true}},
		{Lease: 48 * time.Hour},
		{GC: &gendurable.GCConfig{Interval: time.Millisecond, Retention: gendurable.DefaultLease, Batch: 1}},
		{GC: &gendurable.GCConfig{Batch: 10_000}},
	} {
		_, err := gendurable.NewClient(pool, &cfg)
		require.NoError(t, err)
	}
	require.Equal(t, int32(0), pool.Stat().TotalConns(), "no connection made")
}

var (
	perform = func(*gendurable.Ctx, counter) error { return nil }
	oneStep = map[string]gendurable.StepFunc[counter]{
		"a": func(*gendurable.Ctx, counter) (gendurable.Outcome, error) { return gendurable.Done(nil), nil }}
)

func TestStartRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: "t_never_migrated"})
	require.NoError(t, err)
	require.ErrorIs(t, cl.Start(context.Background()), gendurable.ErrNotMigrated)
}

func TestDrainInsideTheTestsTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE {schema}.audit (id bigint)`)
	job := gendurable.Job[counter]{Name: "audited", Perform: func(ctx *gendurable.Ctx, _ counter) error {
		tx, err := ctx.Tx()
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, expand(`INSERT INTO {schema}.audit VALUES ($1)`, e.schema), ctx.ID)
		return err
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job, orderFSM}})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	kit := durabletest.New(t, cl, &durabletest.Opts{Tx: tx})
	a, err := cl.InsertTx(ctx, tx, job.With(counter{}), nil)
	require.NoError(t, err)
	b, err := cl.InsertTx(ctx, tx, orderFSM.With(order{ID: 1}), &gendurable.InsertOpts{In: 48 * time.Hour})
	require.NoError(t, err)
	res := kit.Drain(ctx)
	require.Equal(t, 4, res.Steps, "the job, and the order's three steps with their delays collapsed")
	kit.RequireDone(ctx, a.ID, nil)
	kit.RequireDone(ctx, b.ID, nil)
	var n int
	require.NoError(t, tx.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.audit`, e.schema)).Scan(&n))
	require.Equal(t, 1, n, "the step's write is in the test's transaction")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances`), "nothing escaped the test's transaction")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.audit`))

	// KeepDelays runs only what is due.
	_, err = cl.Insert(ctx, orderFSM.With(order{ID: 2}), &gendurable.InsertOpts{In: time.Hour})
	require.NoError(t, err)
	kit2 := durabletest.New(t, cl, nil)
	r, err := kit2.TryDrain(ctx, &durabletest.DrainOpts{KeepDelays: true})
	require.NoError(t, err)
	require.Equal(t, 0, r.Steps)
}

func TestDrainReportsARowOfAnUnregisteredMachine(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writer := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	res, err := writer.Insert(context.Background(), noop.With(counter{}), nil)
	require.NoError(t, err)
	reader := e.client(t, &gendurable.Config{Name: "reader"})
	_, err = durabletest.New(t, reader, nil).TryDrain(context.Background(), nil)
	require.ErrorIs(t, err, gendurable.ErrUnknownMachine)
	in, err := reader.Get(context.Background(), res.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status, "the row is handed back, not lost")
	require.Equal(t, 0, in.Attempt)
}
