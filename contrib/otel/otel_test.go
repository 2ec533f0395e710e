package durableotel_test

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	durableotel "github.com/gendurable/gendurable/contrib/otel"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

type mail struct {
	To   string `json:"to"`
	Fail bool   `json:"fail,omitempty"`
}

var mailJob = gendurable.Job[mail]{
	Name: "mail", Queue: "mail", MaxAttempts: 1,
	Perform: func(ctx *gendurable.Ctx, m mail) error {
		if m.Fail {
			return errors.New("mailbox full")
		}
		return nil
	},
}

var signup = gendurable.FSM[mail]{
	Name: "signup", Start: "create", Queue: "mail",
	Steps: map[string]gendurable.StepFunc[mail]{
		"create": func(ctx *gendurable.Ctx, m mail) (gendurable.Outcome, error) {
			return gendurable.Next("welcome", m), nil
		},
		"welcome": func(ctx *gendurable.Ctx, m mail) (gendurable.Outcome, error) { return gendurable.Done(m), nil },
	},
}

var quiet = slog.New(slog.DiscardHandler)

func newClient(t *testing.T, pool *pgxpool.Pool, schema string, hooks ...func(gendurable.Event)) *gendurable.Client {
	t.Helper()
	cl, err := gendurable.NewClient(pool, &gendurable.Config{
		Schema: schema, Machines: []gendurable.Machine{mailJob, signup},
		Queues:       map[string]gendurable.QueueConfig{"mail": {Concurrency: 4}},
		PollInterval: 50 * time.Millisecond, Logger: quiet, Hooks: hooks,
	})
	require.NoError(t, err)
	return cl
}

// points collects the reader and returns the data points of one instrument: sums and gauges by
// their value, histograms by their count, each keyed by its attributes.
func points(t *testing.T, reader *sdkmetric.ManualReader, name string) map[attribute.Distinct]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[attribute.Distinct]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[p.Attributes.Equivalent()] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[p.Attributes.Equivalent()] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[p.Attributes.Equivalent()] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[p.Attributes.Equivalent()] = float64(p.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return out
}

// shutdown shuts the providers down when the test ends.
func shutdown(t *testing.T, tp *sdktrace.TracerProvider, mp *sdkmetric.MeterProvider) {
	t.Cleanup(func() {
		if tp != nil {
			require.NoError(t, tp.Shutdown(context.Background()))
		}
		require.NoError(t, mp.Shutdown(context.Background()))
	})
}

func set(kvs ...attribute.KeyValue) attribute.Distinct {
	s := attribute.NewSet(kvs...)
	return s.Equivalent()
}

var (
	client = durableotel.ClientKey.String("default")
	mailQ  = attribute.String("messaging.destination.name", "mail")
)

// A real client works real jobs: one span per step with the messaging attributes, errors on the
// failed step, and the event metrics.
func TestSpansAndMetricsOfARealClient(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 8)
	schema := durabledbtest.Schema(t, pool)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	shutdown(t, tp, mp)
	tel, err := durableotel.New(&durableotel.Opts{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)
	cl := newClient(t, pool, schema, tel.Hook)
	ctx := context.Background()
	require.NoError(t, cl.Start(ctx))

	var ids []int64
	insert := func(in gendurable.Input) {
		r, err := cl.Insert(ctx, in, nil)
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	for range 2 {
		insert(mailJob.With(mail{To: "ada"}))
	}
	insert(mailJob.With(mail{To: "bob", Fail: true}))
	insert(signup.With(mail{To: "eve"}))
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			in, err := cl.Get(ctx, id)
			require.NoError(t, err)
			if in.Status.Terminal() {
				break
			}
			require.True(t, time.Now().Before(deadline), "instance %d is still %s", id, in.Status)
			time.Sleep(10 * time.Millisecond)
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, cl.Stop(stopCtx)) // delivers every buffered event
	require.Zero(t, tel.OpenSpans())

	// Spans: 3 mails, 2 signup steps.
	ended := spans.Ended()
	require.Len(t, ended, 5)
	sort.Slice(ended, func(i, j int) bool { return ended[i].StartTime().Before(ended[j].StartTime()) })
	byName := map[string]int{}
	for _, s := range ended {
		byName[s.Name()]++
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
		require.False(t, s.EndTime().Before(s.StartTime()))
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		require.Equal(t, "gendurable", attrs["messaging.system"].AsString())
		require.Equal(t, "mail", attrs["messaging.destination.name"].AsString())
		require.Equal(t, "process", attrs["messaging.operation.type"].AsString())
		id := attrs[durableotel.InstanceIDKey].AsInt64()
		require.Contains(t, ids, id)
		require.Equal(t, strconv.FormatInt(id, 10), attrs["messaging.message.id"].AsString())
		require.Equal(t, int64(1), attrs[durableotel.AttemptKey].AsInt64())
		require.Equal(t, "default", attrs[durableotel.ClientKey].AsString())
		require.Equal(t, s.Name(), "process "+attrs[durableotel.MachineKey].AsString()+"."+attrs[durableotel.StepKey].AsString())
		outcome := attrs[durableotel.OutcomeKey].AsString()
		if id == ids[2] { // the failing mail
			require.Equal(t, "failed", outcome)
			require.Equal(t, codes.Error, s.Status().Code)
			require.Equal(t, "mailbox full", s.Status().Description)
			require.True(t, attrs[durableotel.PanicKey].Type() == attribute.BOOL && !attrs[durableotel.PanicKey].AsBool())
			require.Len(t, s.Events(), 1)
			require.Equal(t, "exception", s.Events()[0].Name)
			continue
		}
		require.Equal(t, codes.Unset, s.Status().Code, "success leaves the status unset")
		require.Empty(t, s.Events())
		switch attrs[durableotel.StepKey].AsString() {
		case "create":
			require.Equal(t, "next", outcome)
		default:
			require.Equal(t, "done", outcome)
		}
	}
	require.Equal(t, map[string]int{"process mail.perform": 3, "process signup.create": 1, "process signup.welcome": 1}, byName)

	// Metrics.
	mailM, signupM := durableotel.MachineKey.String("mail"), durableotel.MachineKey.String("signup")
	outcome := durableotel.OutcomeKey.String
	require.Equal(t, map[attribute.Distinct]float64{
		set(client, mailQ, mailM, outcome("done")):   2,
		set(client, mailQ, mailM, outcome("failed")): 1,
		set(client, mailQ, signupM, outcome("next")): 1,
		set(client, mailQ, signupM, outcome("done")): 1,
	}, points(t, reader, "gendurable.step.finished"))
	require.Equal(t, map[attribute.Distinct]float64{
		set(client, mailQ, mailM): 3, set(client, mailQ, signupM): 2,
	}, points(t, reader, "gendurable.step.started"))
	require.Equal(t, map[attribute.Distinct]float64{
		set(client, mailQ, mailM): 3, set(client, mailQ, signupM): 2,
	}, points(t, reader, "gendurable.step.duration"))
	require.Equal(t, map[attribute.Distinct]float64{
		set(client, mailQ, mailM, durableotel.PanicKey.Bool(false)): 1,
	}, points(t, reader, "gendurable.step.errors"))
	require.Equal(t, map[attribute.Distinct]float64{set(client, mailQ): 5}, points(t, reader, "gendurable.picked_rows"))
	picks := points(t, reader, "gendurable.picks")[set(client, mailQ)]
	require.GreaterOrEqual(t, picks, 1.0)
	require.Equal(t, map[attribute.Distinct]float64{set(client, mailQ): picks}, points(t, reader, "gendurable.pick.duration"))
	events := points(t, reader, "gendurable.events")
	require.Equal(t, 5.0, events[set(client, durableotel.EventKey.String("step.started"))])
	require.Equal(t, 5.0, events[set(client, durableotel.EventKey.String("step.finished"))])
	require.Equal(t, 1.0, events[set(client, durableotel.EventKey.String("step.error"))])
	require.Empty(t, points(t, reader, "gendurable.outcome.stale"))
}

// The queue gauges read through the inspection API at collection; a failed read is an error
// metric, never a failed collection.
func TestQueueMetrics(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	cl := newClient(t, pool, schema)
	ctx := context.Background()
	later := attribute.String("messaging.destination.name", "later")
	backlog := attribute.String("messaging.destination.name", "backlog")
	limbo := attribute.String("messaging.destination.name", "limbo")
	for range 2 {
		_, err := cl.Insert(ctx, mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "later", In: time.Hour})
		require.NoError(t, err)
	}
	_, err := cl.Insert(ctx, mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "backlog", ScheduledAt: time.Now().Add(-10 * time.Minute)})
	require.NoError(t, err)
	_, err = cl.Insert(ctx, mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "limbo", RateLimit: "ghost"})
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	shutdown(t, nil, mp)
	reg, err := durableotel.RegisterQueueMetrics(cl, &durableotel.QueueMetricsOpts{MeterProvider: mp, Stuck: true, Checkup: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, reg.Unregister()) }()

	status := durableotel.StatusKey.String
	require.Equal(t, map[attribute.Distinct]float64{
		set(later, status("available")): 2, set(later, status("executing")): 0,
		set(backlog, status("available")): 1, set(backlog, status("executing")): 0,
		set(limbo, status("available")): 1, set(limbo, status("executing")): 0,
	}, points(t, reader, "gendurable.queue.instances"))
	require.Equal(t, map[attribute.Distinct]float64{set(later): 0, set(backlog): 1, set(limbo): 1},
		points(t, reader, "gendurable.queue.runnable"))
	lag := points(t, reader, "gendurable.queue.oldest_runnable")
	require.Equal(t, 0.0, lag[set(later)])
	require.InDelta(t, 600, lag[set(backlog)], 60)
	require.Equal(t, map[attribute.Distinct]float64{
		set(durableotel.KindKey.String("unknown_rate_limit"), limbo, durableotel.MachineKey.String(""),
			durableotel.StepKey.String(""), durableotel.RateLimitKey.String("ghost")): 1,
	}, points(t, reader, "gendurable.stuck.instances"))
	require.Equal(t, map[attribute.Distinct]float64{set(): 1}, points(t, reader, "gendurable.inspect.up"))
	// The checkup: rows are due, and no node works a queue.
	workers := set(durableotel.CheckKey.String("workers"), durableotel.SeverityKey.String("problem"))
	require.Equal(t, 1.0, points(t, reader, "gendurable.checkup.findings")[workers])
	// A finding that goes is reported at zero.
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".instances SET status = 'done', finalized_at = now() WHERE status = 'available'`)
	require.NoError(t, err)
	require.Equal(t, 0.0, points(t, reader, "gendurable.checkup.findings")[workers])

	// A schema that does not exist: every read fails, the collection does not.
	broken := newClient(t, pool, "never_migrated")
	reader2 := sdkmetric.NewManualReader()
	mp2 := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader2))
	shutdown(t, nil, mp2)
	reg2, err := durableotel.RegisterQueueMetrics(broken, &durableotel.QueueMetricsOpts{MeterProvider: mp2, Stuck: true, Logger: quiet})
	require.NoError(t, err)
	defer func() { require.NoError(t, reg2.Unregister()) }()
	for range 2 {
		require.Equal(t, map[attribute.Distinct]float64{set(): 0}, points(t, reader2, "gendurable.inspect.up"))
	}
	// The third collection: three failures of each query so far.
	require.Equal(t, map[attribute.Distinct]float64{
		set(durableotel.QueryKey.String("queue_stats")): 3, set(durableotel.QueryKey.String("stuck")): 3,
	}, points(t, reader2, "gendurable.inspect.errors"))
	require.Empty(t, points(t, reader2, "gendurable.queue.instances"))
}

// Spans settle on every event that can end a step: an outcome dropped as stale, a commit given
// up; EndOpenSpans ends what never settled.
func TestSpansSettleOnStaleOutcomesAndGivenUpCommits(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	shutdown(t, tp, mp)
	tel, err := durableotel.New(&durableotel.Opts{TracerProvider: tp, MeterProvider: mp, MaxOpenSpans: 3})
	require.NoError(t, err)
	at := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) // before the span EndOpenSpans ends now
	start := func(id int64) {
		tel.Hook(gendurable.Event{Name: gendurable.EventStepStarted, At: at, Client: "c", Queue: "q", Machine: "m",
			Step: "s", InstanceID: id, Attempt: 1})
	}
	for id := int64(1); id <= 4; id++ {
		start(id) // the fourth is over the cap: no span
	}
	require.Equal(t, 3, tel.OpenSpans())
	tel.Hook(gendurable.Event{Name: gendurable.EventOutcomeStale, At: at.Add(time.Second), Client: "c", Queue: "q",
		Machine: "m", Step: "s", InstanceID: 1, Attempt: 1, Outcome: "next"})
	tel.Hook(gendurable.Event{Name: gendurable.EventCommitFailed, Client: "c", Count: 2, Err: errors.New("conn reset")})
	tel.Hook(gendurable.Event{Name: gendurable.EventCommitFailed, At: at.Add(2 * time.Second), Client: "c", Queue: "q",
		Machine: "m", Step: "s", InstanceID: 2, Attempt: 1, Count: 1, Err: errors.New("conn reset")})
	require.Equal(t, 1, tel.OpenSpans())
	tel.EndOpenSpans()
	require.Zero(t, tel.OpenSpans())

	ended := spans.Ended()
	require.Len(t, ended, 3)
	sort.Slice(ended, func(i, j int) bool { return ended[i].EndTime().Before(ended[j].EndTime()) })
	require.Equal(t, at.Add(time.Second), ended[0].EndTime())
	require.Equal(t, codes.Error, ended[0].Status().Code)
	require.Equal(t, "outcome dropped: the claim was lost", ended[0].Status().Description)
	require.Equal(t, at.Add(2*time.Second), ended[1].EndTime())
	require.Equal(t, "the outcome's commit was given up", ended[1].Status().Description)
	require.Len(t, ended[1].Events(), 1)
	require.Equal(t, "not settled: its outcome was never reported", ended[2].Status().Description)

	client := durableotel.ClientKey.String("c")
	require.Equal(t, map[attribute.Distinct]float64{set(client): 2}, points(t, reader, "gendurable.commit.failures"))
	require.Equal(t, map[attribute.Distinct]float64{set(client, attribute.String("messaging.destination.name", "q")): 1},
		points(t, reader, "gendurable.commit.given_up"))
	require.Equal(t, map[attribute.Distinct]float64{
		set(client, attribute.String("messaging.destination.name", "q"), durableotel.MachineKey.String("m"),
			durableotel.OutcomeKey.String("next")): 1,
	}, points(t, reader, "gendurable.outcome.stale"))
}

// A Next's following step can be reported started (its pick, on any node, comes as soon as the
// outcome commits) before the step that ran it is reported finished: each finish settles its own
// step's span.
func TestSpansOfAStepAndItsNextReportedOutOfOrder(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	shutdown(t, tp, mp)
	tel, err := durableotel.New(&durableotel.Opts{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)
	at := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := func(name gendurable.EventName, step, outcome string, s int) gendurable.Event {
		return gendurable.Event{Name: name, At: at.Add(time.Duration(s) * time.Second), Client: "c", Queue: "q",
			Machine: "signup", Step: step, InstanceID: 7, Attempt: 1, Outcome: outcome}
	}
	tel.Hook(ev(gendurable.EventStepStarted, "create", "", 0))
	tel.Hook(ev(gendurable.EventStepStarted, "welcome", "", 1))
	tel.Hook(ev(gendurable.EventStepFinished, "create", "next", 2))
	tel.Hook(ev(gendurable.EventStepFinished, "welcome", "done", 3))
	require.Zero(t, tel.OpenSpans())
	outcomes := map[string]string{}
	for _, s := range spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == durableotel.OutcomeKey {
				outcomes[s.Name()] = kv.Value.AsString()
			}
		}
	}
	require.Equal(t, map[string]string{"process signup.create": "next", "process signup.welcome": "done"}, outcomes)
}
