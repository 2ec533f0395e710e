package durableotel

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// DefaultTimeout bounds the inspection queries of one collection unless the options say
// otherwise.
const DefaultTimeout = 5 * time.Second

// DefaultStatuses are the statuses the queue metrics count unless the options say otherwise: the
// two read from their partial indexes, at a cost proportional to the backlog and the running
// steps, never to the table.
var DefaultStatuses = []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting}

// QueueMetricsOpts configures RegisterQueueMetrics. Every field is optional.
type QueueMetricsOpts struct {
	// MeterProvider makes the gauges. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Timeout bounds the inspection queries of one collection. Default DefaultTimeout.
	Timeout time.Duration
	// Statuses are the statuses to count. Default DefaultStatuses. The parked statuses add a read
	// of every parked row (through their index), the finished ones a read of the counts kept as
	// rows finish: neither grows with the history (see gendurable.QueueStatsOpts).
	Statuses []gendurable.Status
	// Stuck also reports stuck instances (gendurable.Client.Stuck), as the client sees them: use
	// a client configured like the workers.
	Stuck bool
	// Checkup also reports the findings of gendurable.Client.Checkup, as
	// gendurable.checkup.findings by check and severity; a pair once found keeps being reported
	// (at zero once it is gone), so that an alert on it resolves. CheckupOpts tunes its
	// thresholds.
	Checkup     bool
	CheckupOpts *gendurable.CheckupOpts
	// Logger receives a warning for each failed read. Default slog.Default().
	Logger *slog.Logger
}

// RegisterQueueMetrics registers observable gauges that read a schema's queues through client's
// inspection API whenever the meter provider collects: gendurable.queue.instances (by queue and
// status), gendurable.queue.runnable, gendurable.queue.oldest_runnable (the lag, in seconds),
// optionally gendurable.stuck.instances and gendurable.checkup.findings, and gendurable.inspect.up and gendurable.inspect.errors,
// which report failed reads (a failed read never fails the collection). A queue once seen keeps
// being reported (at zero). Unregister the returned registration to stop.
func RegisterQueueMetrics(client *gendurable.Client, opts *QueueMetricsOpts) (metric.Registration, error) {
	if opts == nil {
		opts = &QueueMetricsOpts{}
	}
	q := &queueMetrics{client: client, timeout: opts.Timeout, statuses: slices.Clone(opts.Statuses), stuck: opts.Stuck,
		log: opts.Logger, seen: map[string]bool{}, found: map[[2]string]bool{}, failures: map[string]int64{"queue_stats": 0}}
	if q.timeout <= 0 {
		q.timeout = DefaultTimeout
	}
	if len(q.statuses) == 0 {
		q.statuses = slices.Clone(DefaultStatuses)
	}
	if q.log == nil {
		q.log = slog.Default()
	}
	if q.stuck {
		q.failures["stuck"] = 0
	}
	if opts.Checkup {
		q.checkup = &gendurable.CheckupOpts{}
		if opts.CheckupOpts != nil {
			*q.checkup = *opts.CheckupOpts
		}
		q.failures["checkup"] = 0
	}
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var err error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		if err != nil {
			return nil
		}
		var g metric.Int64ObservableGauge
		g, err = meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return g
	}
	q.instances = gauge("gendurable.queue.instances", "{instance}", "Instances by queue and status.")
	q.runnable = gauge("gendurable.queue.runnable", "{instance}", "Available instances that are due now.")
	q.stuckCount = gauge("gendurable.stuck.instances", "{instance}", "Instances that cannot make progress on their own, by kind.")
	q.findings = gauge("gendurable.checkup.findings", "{finding}", "Findings of the checkup (gendurable.Client.Checkup), by check and severity.")
	q.up = gauge("gendurable.inspect.up", "1", "1 if the last collection's inspection queries succeeded, else 0.")
	if err == nil {
		q.oldest, err = meter.Float64ObservableGauge("gendurable.queue.oldest_runnable", metric.WithUnit("s"),
			metric.WithDescription("How long the longest-waiting due instance has been due (the queue's lag); 0 when nothing is due."))
	}
	if err == nil {
		q.errors, err = meter.Int64ObservableCounter("gendurable.inspect.errors", metric.WithUnit("{query}"),
			metric.WithDescription("Inspection queries that failed, by query."))
	}
	if err != nil {
		return nil, fmt.Errorf("durableotel: create queue instruments: %w", err)
	}
	observed := []metric.Observable{q.instances, q.runnable, q.oldest, q.up, q.errors}
	if q.stuck {
		observed = append(observed, q.stuckCount)
	}
	if q.checkup != nil {
		observed = append(observed, q.findings)
	}
	reg, err := meter.RegisterCallback(q.observe, observed...)
	if err != nil {
		return nil, fmt.Errorf("durableotel: register queue callback: %w", err)
	}
	return reg, nil
}

type queueMetrics struct {
	client   *gendurable.Client
	timeout  time.Duration
	statuses []gendurable.Status
	stuck    bool
	checkup  *gendurable.CheckupOpts // nil: no checkup
	log      *slog.Logger

	instances, runnable, stuckCount, findings, up metric.Int64ObservableGauge
	oldest                                        metric.Float64ObservableGauge
	errors                                        metric.Int64ObservableCounter

	mu       sync.Mutex
	seen     map[string]bool
	found    map[[2]string]bool // the (check, severity) pairs the checkup ever reported
	failures map[string]int64
}

// observe runs the inspection queries and reports what they read; it never returns an error (a
// failed read is reported by the up gauge and the error counter).
func (q *queueMetrics) observe(ctx context.Context, o metric.Observer) error {
	ctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	up := int64(1)
	stats, err := q.client.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: q.statuses})
	if err != nil {
		up = 0
		q.failed("queue_stats", err)
	} else {
		q.queues(o, stats)
	}
	if q.stuck {
		groups, err := q.client.Stuck(ctx)
		if err != nil {
			up = 0
			q.failed("stuck", err)
		} else {
			for _, g := range groups {
				o.ObserveInt64(q.stuckCount, g.Count, metric.WithAttributes(
					KindKey.String(string(g.Kind)), semconv.MessagingDestinationName(g.Queue), MachineKey.String(g.Machine),
					StepKey.String(g.Step), RateLimitKey.String(g.RateLimit)))
			}
		}
	}
	if q.checkup != nil {
		fs, err := q.client.Checkup(ctx, q.checkup)
		if err != nil {
			up = 0
			q.failed("checkup", err)
		} else {
			q.reportFindings(o, fs)
		}
	}
	o.ObserveInt64(q.up, up)
	q.mu.Lock()
	for query, n := range q.failures {
		o.ObserveInt64(q.errors, n, metric.WithAttributes(QueryKey.String(query)))
	}
	q.mu.Unlock()
	return nil
}

func (q *queueMetrics) queues(o metric.Observer, stats []gendurable.QueueStats) {
	q.mu.Lock()
	for _, s := range stats {
		q.seen[s.Queue] = true
	}
	byQueue := make(map[string]gendurable.QueueStats, len(q.seen))
	for name := range q.seen {
		byQueue[name] = gendurable.QueueStats{Queue: name}
	}
	q.mu.Unlock()
	for _, s := range stats {
		byQueue[s.Queue] = s
	}
	lag := slices.Contains(q.statuses, gendurable.StatusAvailable)
	for _, s := range byQueue {
		queue := semconv.MessagingDestinationName(s.Queue)
		for _, st := range q.statuses {
			o.ObserveInt64(q.instances, s.Counts[st], metric.WithAttributes(queue, StatusKey.String(string(st))))
		}
		if lag {
			o.ObserveInt64(q.runnable, s.Runnable, metric.WithAttributes(queue))
			o.ObserveFloat64(q.oldest, s.OldestRunnable.Seconds(), metric.WithAttributes(queue))
		}
	}
}

// reportFindings counts the findings by check and severity, with zeros for those seen before.
func (q *queueMetrics) reportFindings(o metric.Observer, fs []gendurable.Finding) {
	counts := map[[2]string]int64{}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, f := range fs {
		k := [2]string{f.Check, string(f.Severity)}
		q.found[k] = true
		counts[k]++
	}
	for k := range q.found {
		o.ObserveInt64(q.findings, counts[k], metric.WithAttributes(CheckKey.String(k[0]), SeverityKey.String(k[1])))
	}
}

func (q *queueMetrics) failed(query string, err error) {
	q.mu.Lock()
	q.failures[query]++
	q.mu.Unlock()
	q.log.Warn("gendurable: metrics: inspection query failed", "query", query, "error", err)
}
