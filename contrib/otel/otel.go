// Package durableotel exports gendurable's events as OpenTelemetry spans and metrics, and its
// queues as observable gauges.
//
// Telemetry's Hook (pass it in gendurable.Config.Hooks) makes a span per step, from step.started
// to the event that settles it (step.finished, or outcome.stale or a given-up commit), and counts
// the engine's events with the same meaning as the Prometheus adapter's series. RegisterQueueMetrics
// reads queue depths, lag and (optionally) stuck instances through a client's inspection API
// whenever the meter provider collects.
//
// Attributes follow the OpenTelemetry messaging semantic conventions where they fit
// (messaging.system "gendurable", messaging.destination.name = the queue, messaging.operation.type
// "process", messaging.message.id = the instance id), and gendurable.* otherwise. Providers come
// from the options; nil means the globally registered ones (otel.GetTracerProvider,
// otel.GetMeterProvider), which this package never sets.
package durableotel

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/gendurable/gendurable"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/gendurable/gendurable/contrib/otel"

// System is the value of messaging.system.
const System = "gendurable"

// The gendurable.* attribute keys.
const (
	ClientKey     = attribute.Key("gendurable.client")
	MachineKey    = attribute.Key("gendurable.machine")
	StepKey       = attribute.Key("gendurable.step")
	InstanceIDKey = attribute.Key("gendurable.instance.id")
	AttemptKey    = attribute.Key("gendurable.attempt")
	OutcomeKey    = attribute.Key("gendurable.outcome")
	PanicKey      = attribute.Key("gendurable.panic")
	EventKey      = attribute.Key("gendurable.event")
	ResultKey     = attribute.Key("gendurable.result")
	KindKey       = attribute.Key("gendurable.kind")
	RateLimitKey  = attribute.Key("gendurable.rate_limit")
	StatusKey     = attribute.Key("gendurable.status")
	QueryKey      = attribute.Key("gendurable.query")
	CheckKey      = attribute.Key("gendurable.check")
	SeverityKey   = attribute.Key("gendurable.severity")
)

// DefaultMaxOpenSpans caps the spans of steps that started and have not settled yet.
const DefaultMaxOpenSpans = 100_000

// Opts configures Telemetry. Every field is optional.
type Opts struct {
	// TracerProvider makes the step spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the event metrics. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// MaxOpenSpans caps the spans of steps that started and have not settled yet. A span whose
	// settling event was dropped (the hooks fell behind by more than the engine's event buffer)
	// would stay open forever; past the cap, new steps get no span (the metrics still count
	// them). Default DefaultMaxOpenSpans.
	MaxOpenSpans int
}

// Telemetry turns gendurable's events into spans and metrics. It is safe for concurrent use and
// may serve several clients.
type Telemetry struct {
	tracer  trace.Tracer
	maxOpen int

	mu    sync.Mutex
	spans map[spanKey]*openSpan

	events, stepsStarted, stepsFinished, stepErrors, outcomesStale   metric.Int64Counter
	commitFailures, commitsGivenUp, fsmUnknown, heartbeatLost, picks metric.Int64Counter
	pickedRows, startupReclaimed, reaperReclaimed, awaitTimeouts     metric.Int64Counter
	concurrencyThrottled, concurrencyContended, rateThrottled        metric.Int64Counter
	rateContended, rateUnknown, gcSwept                              metric.Int64Counter
	stepDuration, pickDuration                                       metric.Float64Histogram
}

// spanKey names one claim's span. The step is part of it: a step's Next starts the next step at
// attempt 1 again, and its pick (on any node, as soon as the outcome commits) can report the next
// step's start before this node reports the last one's finish.
type spanKey struct {
	client  string
	id      int64
	attempt int
	step    string
}

type openSpan struct {
	span   trace.Span
	failed bool
}

// New builds the adapter; opts may be nil.
func New(opts *Opts) (*Telemetry, error) {
	if opts == nil {
		opts = &Opts{}
	}
	tp, mp := opts.TracerProvider, opts.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &Telemetry{
		tracer:  tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		maxOpen: opts.MaxOpenSpans,
		spans:   map[spanKey]*openSpan{},
	}
	if t.maxOpen <= 0 {
		t.maxOpen = DefaultMaxOpenSpans
	}
	meter := mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var err error
	counter := func(dst *metric.Int64Counter, name, unit, desc string) {
		if err != nil {
			return
		}
		*dst, err = meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	}
	histogram := func(dst *metric.Float64Histogram, name, desc string, buckets []float64) {
		if err != nil {
			return
		}
		*dst, err = meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
	}
	counter(&t.events, "gendurable.events", "{event}", "Events emitted, by name.")
	counter(&t.stepsStarted, "gendurable.step.started", "{step}", "Steps that began to run.")
	counter(&t.stepsFinished, "gendurable.step.finished", "{step}", "Steps whose outcome committed, by outcome kind.")
	counter(&t.stepErrors, "gendurable.step.errors", "{step}", "Steps that returned an error, panicked or produced an outcome that cannot be applied (routed to Handle).")
	counter(&t.outcomesStale, "gendurable.outcome.stale", "{outcome}", "Outcomes dropped because their claim was gone.")
	counter(&t.commitFailures, "gendurable.commit.failures", "{outcome}", "Outcomes in group-commit statements that failed (each failed try counts).")
	counter(&t.commitsGivenUp, "gendurable.commit.given_up", "{outcome}", "Outcomes this worker gave up committing; the reaper re-runs their steps once the lease expires.")
	counter(&t.fsmUnknown, "gendurable.fsm.unknown", "{row}", "Claimed rows of a machine or step this client does not know, handed back.")
	counter(&t.heartbeatLost, "gendurable.heartbeat.lost", "{claim}", "Claims the heartbeat found lost; their steps were cancelled.")
	counter(&t.picks, "gendurable.picks", "{pick}", "Picks that claimed at least one row.")
	counter(&t.pickedRows, "gendurable.picked_rows", "{row}", "Rows claimed by picks.")
	counter(&t.startupReclaimed, "gendurable.startup.reclaimed", "{claim}", "Claims of a dead predecessor released at start.")
	counter(&t.reaperReclaimed, "gendurable.reaper.reclaimed", "{claim}", "Expired claims the reaper released (result released) or failed for lack of attempts (result failed).")
	counter(&t.awaitTimeouts, "gendurable.await.timeouts", "{instance}", "Parked instances woken by their await deadline.")
	counter(&t.concurrencyThrottled, "gendurable.concurrency.throttled", "{row}", "Rows a pick's window held that their concurrency key or gate could not admit.")
	counter(&t.concurrencyContended, "gendurable.concurrency.contended", "{pick}", "Picks retried after losing a race for a concurrency key or gate slot.")
	counter(&t.rateThrottled, "gendurable.rate_limit.throttled", "{row}", "Rate-limited rows a pick's window held that their bucket could not afford yet.")
	counter(&t.rateContended, "gendurable.rate_limit.contended", "{bucket}", "Buckets whose tokens another pick took first.")
	counter(&t.rateUnknown, "gendurable.rate_limit.unknown_reports", "{report}", "Maintenance sweeps that found available rows naming a rate limit this client does not configure.")
	counter(&t.gcSwept, "gendurable.gc.swept", "{row}", "Finished instances deleted (kind instances), gate counters repaired or removed (kind gates) and rate-limit buckets pruned (kind buckets) by GC.")
	histogram(&t.stepDuration, "gendurable.step.duration", "Time from a step's start to its outcome's commit.",
		[]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 150})
	histogram(&t.pickDuration, "gendurable.pick.duration", "Round trip of picks that claimed rows.",
		[]float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5})
	if err != nil {
		return nil, fmt.Errorf("durableotel: create instruments: %w", err)
	}
	return t, nil
}

// Hook records one event. Pass it in gendurable.Config.Hooks.
func (t *Telemetry) Hook(ev gendurable.Event) {
	t.span(ev)
	t.count(ev)
}

// OpenSpans is how many step spans are open: started and not settled yet.
func (t *Telemetry) OpenSpans() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.spans)
}

// EndOpenSpans ends every open span, with an error status saying it was not settled. Call it
// after the clients it serves have stopped: a step cancelled at shutdown reports its settling
// event, but one whose event was dropped never does.
func (t *Telemetry) EndOpenSpans() {
	t.mu.Lock()
	spans := t.spans
	t.spans = map[spanKey]*openSpan{}
	t.mu.Unlock()
	for _, s := range spans {
		s.span.SetStatus(codes.Error, "not settled: its outcome was never reported")
		s.span.End()
	}
}

func (t *Telemetry) span(ev gendurable.Event) {
	key := spanKey{ev.Client, ev.InstanceID, ev.Attempt, ev.Step}
	switch ev.Name {
	case gendurable.EventStepStarted:
		t.mu.Lock()
		defer t.mu.Unlock()
		if len(t.spans) >= t.maxOpen {
			return
		}
		if old, ok := t.spans[key]; ok { // the same claim again: its settling event was lost
			old.span.End()
		}
		_, span := t.tracer.Start(context.Background(), "process "+ev.Machine+"."+ev.Step,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(ev.At),
			trace.WithAttributes(
				semconv.MessagingSystemKey.String(System),
				semconv.MessagingDestinationName(ev.Queue),
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingOperationName("process"),
				semconv.MessagingMessageID(strconv.FormatInt(ev.InstanceID, 10)),
				ClientKey.String(ev.Client),
				MachineKey.String(ev.Machine),
				StepKey.String(ev.Step),
				InstanceIDKey.Int64(ev.InstanceID),
				AttemptKey.Int(ev.Attempt),
			))
		t.spans[key] = &openSpan{span: span}
	case gendurable.EventStepError:
		t.mu.Lock()
		defer t.mu.Unlock()
		s, ok := t.spans[key]
		if !ok {
			return
		}
		s.failed = true
		s.span.SetAttributes(PanicKey.Bool(ev.Panic))
		if ev.Err != nil {
			s.span.RecordError(ev.Err, trace.WithTimestamp(ev.At))
			s.span.SetStatus(codes.Error, summary(ev.Err))
		} else {
			s.span.SetStatus(codes.Error, "step error")
		}
	case gendurable.EventStepFinished:
		t.end(key, ev, func(s *openSpan) {
			if ev.Outcome == "failed" && !s.failed {
				s.span.SetStatus(codes.Error, "the instance failed")
			}
		})
	case gendurable.EventOutcomeStale:
		t.end(key, ev, func(s *openSpan) {
			s.span.SetStatus(codes.Error, "outcome dropped: the claim was lost")
		})
	case gendurable.EventCommitFailed:
		if ev.InstanceID == 0 {
			return // a failed group statement: its outcomes are retried
		}
		t.end(key, ev, func(s *openSpan) {
			if ev.Err != nil {
				s.span.RecordError(ev.Err, trace.WithTimestamp(ev.At))
			}
			s.span.SetStatus(codes.Error, "the outcome's commit was given up")
		})
	}
}

// summary is an error's first line, at most 256 bytes: a span status, not a report (a panic's
// error carries its stack, which the span's exception event keeps).
func summary(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if len(msg) > 256 {
		msg = strings.ToValidUTF8(msg[:256], "")
	}
	return msg
}

// end settles the span of key: sets the outcome, lets set adjust it, and ends it at ev.At.
func (t *Telemetry) end(key spanKey, ev gendurable.Event, set func(*openSpan)) {
	t.mu.Lock()
	s, ok := t.spans[key]
	delete(t.spans, key)
	t.mu.Unlock()
	if !ok {
		return
	}
	if ev.Outcome != "" {
		s.span.SetAttributes(OutcomeKey.String(ev.Outcome))
	}
	set(s)
	s.span.End(trace.WithTimestamp(ev.At))
}

func (t *Telemetry) count(ev gendurable.Event) {
	ctx := context.Background()
	client := ClientKey.String(ev.Client)
	queue := semconv.MessagingDestinationName(ev.Queue)
	machine := MachineKey.String(ev.Machine)
	n := int64(ev.Count)
	t.events.Add(ctx, 1, metric.WithAttributes(client, EventKey.String(string(ev.Name))))
	switch ev.Name {
	case gendurable.EventSchedulerPicked:
		attrs := metric.WithAttributes(client, queue)
		t.picks.Add(ctx, 1, attrs)
		t.pickedRows.Add(ctx, n, attrs)
		t.pickDuration.Record(ctx, ev.Duration.Seconds(), attrs)
	case gendurable.EventSchedulerReclaimed:
		t.startupReclaimed.Add(ctx, n, metric.WithAttributes(client, queue))
	case gendurable.EventStepStarted:
		t.stepsStarted.Add(ctx, 1, metric.WithAttributes(client, queue, machine))
	case gendurable.EventStepFinished:
		t.stepsFinished.Add(ctx, 1, metric.WithAttributes(client, queue, machine, OutcomeKey.String(ev.Outcome)))
		t.stepDuration.Record(ctx, ev.Duration.Seconds(), metric.WithAttributes(client, queue, machine))
	case gendurable.EventStepError:
		t.stepErrors.Add(ctx, 1, metric.WithAttributes(client, queue, machine, PanicKey.Bool(ev.Panic)))
	case gendurable.EventOutcomeStale:
		t.outcomesStale.Add(ctx, 1, metric.WithAttributes(client, queue, machine, OutcomeKey.String(ev.Outcome)))
	case gendurable.EventCommitFailed:
		if ev.InstanceID == 0 {
			t.commitFailures.Add(ctx, n, metric.WithAttributes(client))
		} else {
			t.commitsGivenUp.Add(ctx, n, metric.WithAttributes(client, queue))
		}
	case gendurable.EventFSMUnknown:
		t.fsmUnknown.Add(ctx, 1, metric.WithAttributes(client, queue, machine))
	case gendurable.EventHeartbeatLost:
		t.heartbeatLost.Add(ctx, n, metric.WithAttributes(client))
	case gendurable.EventReaperReclaimed:
		t.reaperReclaimed.Add(ctx, int64(ev.Count-ev.Failed), metric.WithAttributes(client, ResultKey.String("released")))
		t.reaperReclaimed.Add(ctx, int64(ev.Failed), metric.WithAttributes(client, ResultKey.String("failed")))
	case gendurable.EventAwaitTimeout:
		t.awaitTimeouts.Add(ctx, n, metric.WithAttributes(client))
	case gendurable.EventConcurrencyThrottled:
		t.concurrencyThrottled.Add(ctx, n, metric.WithAttributes(client, queue))
	case gendurable.EventConcurrencyContended:
		t.concurrencyContended.Add(ctx, 1, metric.WithAttributes(client, queue))
	case gendurable.EventRateLimitThrottled:
		t.rateThrottled.Add(ctx, n, metric.WithAttributes(client, queue))
	case gendurable.EventRateLimitContended:
		t.rateContended.Add(ctx, n, metric.WithAttributes(client, queue))
	case gendurable.EventRateLimitUnknown:
		t.rateUnknown.Add(ctx, 1, metric.WithAttributes(client, RateLimitKey.String(ev.Key)))
	case gendurable.EventGCSwept:
		t.gcSwept.Add(ctx, int64(ev.Count), metric.WithAttributes(client, KindKey.String("instances")))
		t.gcSwept.Add(ctx, int64(ev.Gates), metric.WithAttributes(client, KindKey.String("gates")))
		t.gcSwept.Add(ctx, int64(ev.Buckets), metric.WithAttributes(client, KindKey.String("buckets")))
	}
}
