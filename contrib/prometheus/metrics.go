// Package durableprom exports gendurable's events and queues as Prometheus metrics.
//
// Two collectors, both registered by the caller on a registry of its choosing (nothing here
// touches the default registry):
//
//   - Metrics turns the engine's events into counters and histograms: pass its Hook in
//     gendurable.Config.Hooks. One Metrics may serve several clients (the client label tells
//     them apart).
//   - QueueCollector reads queue depths, lag and (optionally) stuck instances through the
//     client's inspection API on every scrape, under a timeout; a failed read is reported by
//     gendurable_inspect_up and gendurable_inspect_errors_total, never by a failed scrape.
//
// docs/events.md in the gendurable repository lists every series, what it counts and example
// PromQL for dashboards.
package durableprom

import (
	"strconv"

	"github.com/gendurable/gendurable"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultNamespace prefixes every metric name unless the options say otherwise.
const DefaultNamespace = "gendurable"

// DefaultStepBuckets are the step-duration histogram's buckets, in seconds: 1 ms to about 150 s.
var DefaultStepBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 14)

// DefaultPickBuckets are the pick-duration histogram's buckets, in seconds: 0.5 ms to about 4 s.
var DefaultPickBuckets = prometheus.ExponentialBuckets(0.0005, 2, 14)

// MetricsOpts configures Metrics. Every field is optional.
type MetricsOpts struct {
	// Namespace prefixes every metric name. Default DefaultNamespace.
	Namespace string
	// StepLabel adds a step label to the step metrics (started, finished, duration, errors).
	// Steps are known at registration, so the label is bounded, but it multiplies the series by
	// the steps per machine.
	StepLabel bool
	// StepBuckets are the step-duration histogram's buckets in seconds. Default
	// DefaultStepBuckets.
	StepBuckets []float64
	// PickBuckets are the pick-duration histogram's buckets in seconds. Default
	// DefaultPickBuckets.
	PickBuckets []float64
}

// Metrics counts gendurable's events. It is a prometheus.Collector: register it on a registry,
// and pass its Hook in gendurable.Config.Hooks. It is safe for concurrent use.
type Metrics struct {
	stepLabel bool
	all       []prometheus.Collector

	events               *prometheus.CounterVec
	stepsStarted         *prometheus.CounterVec
	stepsFinished        *prometheus.CounterVec
	stepDuration         *prometheus.HistogramVec
	stepErrors           *prometheus.CounterVec
	outcomesStale        *prometheus.CounterVec
	commitFailures       *prometheus.CounterVec
	commitsGivenUp       *prometheus.CounterVec
	fsmUnknown           *prometheus.CounterVec
	heartbeatLost        *prometheus.CounterVec
	picks                *prometheus.CounterVec
	pickedRows           *prometheus.CounterVec
	pickDuration         *prometheus.HistogramVec
	startupReclaimed     *prometheus.CounterVec
	reaperReclaimed      *prometheus.CounterVec
	awaitTimeouts        *prometheus.CounterVec
	concurrencyThrottled *prometheus.CounterVec
	concurrencyContended *prometheus.CounterVec
	rateThrottled        *prometheus.CounterVec
	rateContended        *prometheus.CounterVec
	rateUnknown          *prometheus.CounterVec
	gcSwept              *prometheus.CounterVec
}

// NewMetrics builds the event metrics; opts may be nil.
func NewMetrics(opts *MetricsOpts) *Metrics {
	if opts == nil {
		opts = &MetricsOpts{}
	}
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	stepBuckets, pickBuckets := opts.StepBuckets, opts.PickBuckets
	if len(stepBuckets) == 0 {
		stepBuckets = DefaultStepBuckets
	}
	if len(pickBuckets) == 0 {
		pickBuckets = DefaultPickBuckets
	}
	m := &Metrics{stepLabel: opts.StepLabel}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
		m.all = append(m.all, c)
		return c
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
		m.all = append(m.all, h)
		return h
	}
	step := []string{"client", "queue", "machine"}
	if opts.StepLabel {
		step = append(step, "step")
	}
	with := func(labels []string, more ...string) []string {
		return append(append([]string{}, labels...), more...)
	}

	m.events = counter("events_total", "Events emitted, by name.", "client", "event")
	m.stepsStarted = counter("steps_started_total", "Steps that began to run.", step...)
	m.stepsFinished = counter("steps_finished_total", "Steps whose outcome committed, by outcome kind.", with(step, "outcome")...)
	m.stepDuration = histogram("step_duration_seconds", "Time from a step's start to its outcome's commit.", stepBuckets, step...)
	m.stepErrors = counter("step_errors_total", "Steps that returned an error, panicked or produced an outcome that cannot be applied (routed to Handle).", with(step, "panic")...)
	m.outcomesStale = counter("outcomes_stale_total", "Outcomes dropped because their claim was gone.", "client", "queue", "machine", "outcome")
	m.commitFailures = counter("commit_failures_total", "Outcomes in group-commit statements that failed (each failed try counts).", "client")
	m.commitsGivenUp = counter("commits_given_up_total", "Outcomes this worker gave up committing; the reaper re-runs their steps once the lease expires.", "client", "queue")
	m.fsmUnknown = counter("fsm_unknown_total", "Claimed rows of a machine or step this client does not know, handed back.", "client", "queue", "machine")
	m.heartbeatLost = counter("heartbeat_lost_total", "Claims the heartbeat found lost; their steps were cancelled.", "client")
	m.picks = counter("picks_total", "Picks that claimed at least one row.", "client", "queue")
	m.pickedRows = counter("picked_rows_total", "Rows claimed by picks.", "client", "queue")
	m.pickDuration = histogram("pick_duration_seconds", "Round trip of picks that claimed rows.", pickBuckets, "client", "queue")
	m.startupReclaimed = counter("startup_reclaimed_total", "Claims of a dead predecessor released at start.", "client", "queue")
	m.reaperReclaimed = counter("reaper_reclaimed_total", "Expired claims the reaper released (result released) or failed for lack of attempts (result failed).", "client", "result")
	m.awaitTimeouts = counter("await_timeouts_total", "Parked instances woken by their await deadline.", "client")
	m.concurrencyThrottled = counter("concurrency_throttled_total", "Rows a pick's window held that their concurrency key or gate could not admit.", "client", "queue")
	m.concurrencyContended = counter("concurrency_contended_total", "Picks retried after losing a race for a concurrency key or gate slot.", "client", "queue")
	m.rateThrottled = counter("rate_limit_throttled_total", "Rate-limited rows a pick's window held that their bucket could not afford yet.", "client", "queue")
	m.rateContended = counter("rate_limit_contended_total", "Buckets whose tokens another pick took first.", "client", "queue")
	m.rateUnknown = counter("rate_limit_unknown_reports_total", "Maintenance sweeps that found available rows naming a rate limit this client does not configure.", "client", "limit")
	m.gcSwept = counter("gc_swept_total", "Finished instances deleted (kind instances), gate counters repaired or removed (kind gates) and rate-limit buckets pruned (kind buckets) by GC.", "client", "kind")
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

// Hook records one event. Pass it in gendurable.Config.Hooks.
func (m *Metrics) Hook(ev gendurable.Event) {
	m.events.WithLabelValues(ev.Client, string(ev.Name)).Inc()
	n := float64(ev.Count)
	switch ev.Name {
	case gendurable.EventSchedulerPicked:
		m.picks.WithLabelValues(ev.Client, ev.Queue).Inc()
		m.pickedRows.WithLabelValues(ev.Client, ev.Queue).Add(n)
		m.pickDuration.WithLabelValues(ev.Client, ev.Queue).Observe(ev.Duration.Seconds())
	case gendurable.EventSchedulerReclaimed:
		m.startupReclaimed.WithLabelValues(ev.Client, ev.Queue).Add(n)
	case gendurable.EventStepStarted:
		m.stepsStarted.WithLabelValues(m.step(ev)...).Inc()
	case gendurable.EventStepFinished:
		m.stepsFinished.WithLabelValues(append(m.step(ev), ev.Outcome)...).Inc()
		m.stepDuration.WithLabelValues(m.step(ev)...).Observe(ev.Duration.Seconds())
	case gendurable.EventStepError:
		m.stepErrors.WithLabelValues(append(m.step(ev), strconv.FormatBool(ev.Panic))...).Inc()
	case gendurable.EventOutcomeStale:
		m.outcomesStale.WithLabelValues(ev.Client, ev.Queue, ev.Machine, ev.Outcome).Inc()
	case gendurable.EventCommitFailed:
		if ev.InstanceID == 0 {
			m.commitFailures.WithLabelValues(ev.Client).Add(n)
		} else {
			m.commitsGivenUp.WithLabelValues(ev.Client, ev.Queue).Add(n)
		}
	case gendurable.EventFSMUnknown:
		m.fsmUnknown.WithLabelValues(ev.Client, ev.Queue, ev.Machine).Inc()
	case gendurable.EventHeartbeatLost:
		m.heartbeatLost.WithLabelValues(ev.Client).Add(n)
	case gendurable.EventReaperReclaimed:
		m.reaperReclaimed.WithLabelValues(ev.Client, "released").Add(float64(ev.Count - ev.Failed))
		m.reaperReclaimed.WithLabelValues(ev.Client, "failed").Add(float64(ev.Failed))
	case gendurable.EventAwaitTimeout:
		m.awaitTimeouts.WithLabelValues(ev.Client).Add(n)
	case gendurable.EventConcurrencyThrottled:
		m.concurrencyThrottled.WithLabelValues(ev.Client, ev.Queue).Add(n)
	case gendurable.EventConcurrencyContended:
		m.concurrencyContended.WithLabelValues(ev.Client, ev.Queue).Inc()
	case gendurable.EventRateLimitThrottled:
		m.rateThrottled.WithLabelValues(ev.Client, ev.Queue).Add(n)
	case gendurable.EventRateLimitContended:
		m.rateContended.WithLabelValues(ev.Client, ev.Queue).Add(n)
	case gendurable.EventRateLimitUnknown:
		m.rateUnknown.WithLabelValues(ev.Client, ev.Key).Inc()
	case gendurable.EventGCSwept:
		m.gcSwept.WithLabelValues(ev.Client, "instances").Add(float64(ev.Count))
		m.gcSwept.WithLabelValues(ev.Client, "gates").Add(float64(ev.Gates))
		m.gcSwept.WithLabelValues(ev.Client, "buckets").Add(float64(ev.Buckets))
	}
}

// step returns the label values of the step metrics.
func (m *Metrics) step(ev gendurable.Event) []string {
	if m.stepLabel {
		return []string{ev.Client, ev.Queue, ev.Machine, ev.Step}
	}
	return []string{ev.Client, ev.Queue, ev.Machine}
}
