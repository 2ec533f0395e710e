package durableprom_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	durableprom "github.com/gendurable/gendurable/contrib/prometheus"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
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

// series is one scraped sample: its labels and value (a histogram's sample count).
type series struct {
	labels map[string]string
	value  float64
}

// scrape GETs the exposition from url and returns every sample by metric name.
func scrape(t *testing.T, url string) map[string][]series {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	out := map[string][]series{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			s := series{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				s.value = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s.value = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				s.value = float64(m.GetHistogram().GetSampleCount())
			}
			out[name] = append(out[name], s)
		}
	}
	return out
}

// value returns the sample of name whose labels are exactly labels; ok is false if none is.
func value(got map[string][]series, name string, labels map[string]string) (float64, bool) {
	for _, s := range got[name] {
		if len(s.labels) != len(labels) {
			continue
		}
		match := true
		for k, v := range labels {
			if s.labels[k] != v {
				match = false
				break
			}
		}
		if match {
			return s.value, true
		}
	}
	return 0, false
}

func requireValue(t *testing.T, got map[string][]series, want float64, name string, labels map[string]string) {
	t.Helper()
	v, ok := value(got, name, labels)
	require.True(t, ok, "no series %s%v; have %v", name, labels, got[name])
	require.Equal(t, want, v, "%s%v", name, labels)
}

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

// A real client works real jobs; the registry is served over HTTP and scraped like Prometheus
// would: the event metrics count what happened, the queue collector reads the queues.
func TestMetricsAndQueuesOverHTTP(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 8)
	schema := durabledbtest.Schema(t, pool)
	metrics := durableprom.NewMetrics(nil)
	cl := newClient(t, pool, schema, metrics.Hook)
	ctx := context.Background()
	require.NoError(t, cl.Start(ctx))

	var ids []int64
	insert := func(in gendurable.Input, opts *gendurable.InsertOpts) int64 {
		r, err := cl.Insert(ctx, in, opts)
		require.NoError(t, err)
		return r.ID
	}
	for range 4 {
		ids = append(ids, insert(mailJob.With(mail{To: "ada"}), nil))
	}
	ids = append(ids, insert(mailJob.With(mail{To: "bob", Fail: true}), nil))
	for range 2 {
		ids = append(ids, insert(signup.With(mail{To: "eve"}), nil))
	}
	// Queues this client does not work: two rows for later, one 10 minutes late, one stalled on
	// a rate limit nobody configures.
	later := []int64{
		insert(mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "later", In: time.Hour}),
		insert(mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "later", In: time.Hour}),
	}
	insert(mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "backlog", ScheduledAt: time.Now().Add(-10 * time.Minute)})
	insert(mailJob.With(mail{}), &gendurable.InsertOpts{Queue: "limbo", RateLimit: "ghost"})

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

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, durableprom.NewQueueCollector(cl, &durableprom.QueueCollectorOpts{Stuck: true, Checkup: true}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got := scrape(t, srv.URL)

	l := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	// Steps: 4 mails done, 1 failed (its error routed to Handle); 2 signups of two steps each.
	requireValue(t, got, 5, "gendurable_steps_started_total", l("client", "default", "queue", "mail", "machine", "mail"))
	requireValue(t, got, 4, "gendurable_steps_started_total", l("client", "default", "queue", "mail", "machine", "signup"))
	requireValue(t, got, 4, "gendurable_steps_finished_total", l("client", "default", "queue", "mail", "machine", "mail", "outcome", "done"))
	requireValue(t, got, 1, "gendurable_steps_finished_total", l("client", "default", "queue", "mail", "machine", "mail", "outcome", "failed"))
	requireValue(t, got, 2, "gendurable_steps_finished_total", l("client", "default", "queue", "mail", "machine", "signup", "outcome", "next"))
	requireValue(t, got, 2, "gendurable_steps_finished_total", l("client", "default", "queue", "mail", "machine", "signup", "outcome", "done"))
	require.Len(t, got["gendurable_steps_finished_total"], 4)
	requireValue(t, got, 1, "gendurable_step_errors_total", l("client", "default", "queue", "mail", "machine", "mail", "panic", "false"))
	requireValue(t, got, 5, "gendurable_step_duration_seconds", l("client", "default", "queue", "mail", "machine", "mail"))
	requireValue(t, got, 4, "gendurable_step_duration_seconds", l("client", "default", "queue", "mail", "machine", "signup"))
	requireValue(t, got, 9, "gendurable_events_total", l("client", "default", "event", "step.started"))
	requireValue(t, got, 9, "gendurable_events_total", l("client", "default", "event", "step.finished"))
	requireValue(t, got, 1, "gendurable_events_total", l("client", "default", "event", "step.error"))
	// Picks: every step was claimed by one; fewer picks than rows when they batched.
	requireValue(t, got, 9, "gendurable_picked_rows_total", l("client", "default", "queue", "mail"))
	picks, ok := value(got, "gendurable_picks_total", l("client", "default", "queue", "mail"))
	require.True(t, ok)
	require.GreaterOrEqual(t, picks, 1.0)
	require.LessOrEqual(t, picks, 9.0)
	requireValue(t, got, picks, "gendurable_pick_duration_seconds", l("client", "default", "queue", "mail"))
	requireValue(t, got, picks, "gendurable_events_total", l("client", "default", "event", "scheduler.picked"))
	// Nothing went wrong.
	for _, name := range []string{"gendurable_outcomes_stale_total", "gendurable_commit_failures_total",
		"gendurable_heartbeat_lost_total", "gendurable_fsm_unknown_total"} {
		require.Empty(t, got[name], name)
	}

	// Queues, by default available and executing. The worked queue is empty, so absent.
	requireValue(t, got, 2, "gendurable_queue_instances", l("queue", "later", "status", "available"))
	requireValue(t, got, 0, "gendurable_queue_instances", l("queue", "later", "status", "executing"))
	requireValue(t, got, 0, "gendurable_queue_runnable", l("queue", "later"))
	requireValue(t, got, 0, "gendurable_queue_oldest_runnable_seconds", l("queue", "later"))
	requireValue(t, got, 1, "gendurable_queue_instances", l("queue", "backlog", "status", "available"))
	requireValue(t, got, 1, "gendurable_queue_runnable", l("queue", "backlog"))
	lag, ok := value(got, "gendurable_queue_oldest_runnable_seconds", l("queue", "backlog"))
	require.True(t, ok)
	require.InDelta(t, 600, lag, 60)
	requireValue(t, got, 1, "gendurable_queue_instances", l("queue", "limbo", "status", "available"))
	_, ok = value(got, "gendurable_queue_instances", l("queue", "mail", "status", "available"))
	require.False(t, ok)
	require.Len(t, got["gendurable_queue_instances"], 6)
	requireValue(t, got, 1, "gendurable_stuck_instances",
		l("kind", "unknown_rate_limit", "queue", "limbo", "machine", "", "step", "", "rate_limit", "ghost"))
	require.Len(t, got["gendurable_stuck_instances"], 1)
	requireValue(t, got, 1, "gendurable_inspect_up", l())
	requireValue(t, got, 0, "gendurable_inspect_errors_total", l("query", "queue_stats"))
	requireValue(t, got, 0, "gendurable_inspect_errors_total", l("query", "stuck"))
	requireValue(t, got, 0, "gendurable_inspect_errors_total", l("query", "checkup"))
	require.Len(t, got["gendurable_inspect_duration_seconds"], 3)
	// The checkup: rows are due and the only worker stopped.
	requireValue(t, got, 1, "gendurable_checkup_findings", l("check", "workers", "severity", "problem"))

	// A queue that empties keeps being reported, at zero.
	_, err := pool.Exec(ctx, `UPDATE "`+schema+`".instances SET status = 'done', finalized_at = now() WHERE id = ANY($1)`, later)
	require.NoError(t, err)
	got = scrape(t, srv.URL)
	requireValue(t, got, 0, "gendurable_queue_instances", l("queue", "later", "status", "available"))
	requireValue(t, got, 0, "gendurable_queue_runnable", l("queue", "later"))
	requireValue(t, got, 1, "gendurable_queue_instances", l("queue", "backlog", "status", "available"))

	// A finding that goes is reported at zero: nothing is due once the due rows are done.
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".instances SET status = 'done', finalized_at = now() WHERE status = 'available'`)
	require.NoError(t, err)
	got = scrape(t, srv.URL)
	requireValue(t, got, 0, "gendurable_checkup_findings", l("check", "workers", "severity", "problem"))
}

// A read that fails is an error metric, not a failed scrape and not a panic.
func TestQueueCollectorReportsFailedReads(t *testing.T) {
	t.Parallel()
	pool := durabledbtest.Pool(t, 2)
	cl := newClient(t, pool, "never_migrated")
	reg := prometheus.NewRegistry()
	reg.MustRegister(durableprom.NewQueueCollector(cl, &durableprom.QueueCollectorOpts{
		Stuck: true, Timeout: 2 * time.Second, Logger: quiet}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for try := 1; try <= 2; try++ {
		got := scrape(t, srv.URL)
		requireValue(t, got, 0, "gendurable_inspect_up", map[string]string{})
		requireValue(t, got, float64(try), "gendurable_inspect_errors_total", map[string]string{"query": "queue_stats"})
		requireValue(t, got, float64(try), "gendurable_inspect_errors_total", map[string]string{"query": "stuck"})
		require.Empty(t, got["gendurable_queue_instances"])
		require.Empty(t, got["gendurable_stuck_instances"])
	}
}

// Every event feeds its series: the ones a healthy test run never produces are fed by hand.
func TestHookFeedsEverySeries(t *testing.T) {
	t.Parallel()
	metrics := durableprom.NewMetrics(&durableprom.MetricsOpts{Namespace: "jobs", StepLabel: true})
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	c := "api"
	for _, ev := range []gendurable.Event{
		{Name: gendurable.EventSchedulerPicked, Client: c, Queue: "q", Count: 7, Duration: 3 * time.Millisecond},
		{Name: gendurable.EventSchedulerReclaimed, Client: c, Queue: "q", Count: 2},
		{Name: gendurable.EventStepStarted, Client: c, Queue: "q", Machine: "m", Step: "s", InstanceID: 1, Attempt: 1},
		{Name: gendurable.EventStepError, Client: c, Queue: "q", Machine: "m", Step: "s", InstanceID: 1, Attempt: 1, Panic: true},
		{Name: gendurable.EventStepFinished, Client: c, Queue: "q", Machine: "m", Step: "s", InstanceID: 1, Attempt: 1,
			Outcome: "retry", Duration: 20 * time.Millisecond},
		{Name: gendurable.EventOutcomeStale, Client: c, Queue: "q", Machine: "m", Step: "s", InstanceID: 2, Outcome: "next"},
		{Name: gendurable.EventCommitFailed, Client: c, Count: 12},
		{Name: gendurable.EventCommitFailed, Client: c, Queue: "q", Machine: "m", Step: "s", InstanceID: 3, Count: 1},
		{Name: gendurable.EventFSMUnknown, Client: c, Queue: "q", Machine: "gone", Step: "s", InstanceID: 4},
		{Name: gendurable.EventHeartbeatLost, Client: c, Count: 3},
		{Name: gendurable.EventReaperReclaimed, Client: c, Count: 5, Failed: 2},
		{Name: gendurable.EventConcurrencyThrottled, Client: c, Queue: "q", Count: 4},
		{Name: gendurable.EventConcurrencyContended, Client: c, Queue: "q"},
		{Name: gendurable.EventGCSwept, Client: c, Count: 5, Gates: 2, Buckets: 9},
		{Name: gendurable.EventRateLimitThrottled, Client: c, Queue: "q", Count: 6},
		{Name: gendurable.EventRateLimitContended, Client: c, Queue: "q", Count: 1},
		{Name: gendurable.EventRateLimitUnknown, Client: c, Key: "ghost", Count: 40},
		{Name: gendurable.EventAwaitTimeout, Client: c, Count: 8},
	} {
		metrics.Hook(ev)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got := scrape(t, srv.URL)
	step := map[string]string{"client": c, "queue": "q", "machine": "m", "step": "s"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cq := map[string]string{"client": c, "queue": "q"}
	cl := map[string]string{"client": c}
	for _, w := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"jobs_picks_total", cq, 1},
		{"jobs_picked_rows_total", cq, 7},
		{"jobs_pick_duration_seconds", cq, 1},
		{"jobs_startup_reclaimed_total", cq, 2},
		{"jobs_steps_started_total", step, 1},
		{"jobs_step_errors_total", with(step, "panic", "true"), 1},
		{"jobs_steps_finished_total", with(step, "outcome", "retry"), 1},
		{"jobs_step_duration_seconds", step, 1},
		{"jobs_outcomes_stale_total", with(cq, "machine", "m", "outcome", "next"), 1},
		{"jobs_commit_failures_total", cl, 12},
		{"jobs_commits_given_up_total", cq, 1},
		{"jobs_fsm_unknown_total", with(cq, "machine", "gone"), 1},
		{"jobs_heartbeat_lost_total", cl, 3},
		{"jobs_reaper_reclaimed_total", with(cl, "result", "released"), 3},
		{"jobs_reaper_reclaimed_total", with(cl, "result", "failed"), 2},
		{"jobs_concurrency_throttled_total", cq, 4},
		{"jobs_concurrency_contended_total", cq, 1},
		{"jobs_gc_swept_total", with(cl, "kind", "instances"), 5},
		{"jobs_gc_swept_total", with(cl, "kind", "gates"), 2},
		{"jobs_gc_swept_total", with(cl, "kind", "buckets"), 9},
		{"jobs_rate_limit_throttled_total", cq, 6},
		{"jobs_rate_limit_contended_total", cq, 1},
		{"jobs_rate_limit_unknown_reports_total", with(cl, "limit", "ghost"), 1},
		{"jobs_await_timeouts_total", cl, 8},
		{"jobs_events_total", with(cl, "event", "commit.failed"), 2},
	} {
		requireValue(t, got, w.want, w.name, w.labels)
	}
	require.Len(t, got["jobs_events_total"], 17, "one series per event name")
}
