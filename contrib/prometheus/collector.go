package durableprom

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultTimeout bounds the inspection queries of one scrape unless the options say otherwise.
const DefaultTimeout = 5 * time.Second

// DefaultStatuses are the statuses QueueCollector counts unless the options say otherwise: the
// two its statements read from their partial indexes, at a cost proportional to the backlog and
// the running steps, never to the table.
var DefaultStatuses = []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting}

// QueueCollectorOpts configures a QueueCollector. Every field is optional.
type QueueCollectorOpts struct {
	// Namespace prefixes every metric name. Default DefaultNamespace.
	Namespace string
	// Timeout bounds the inspection queries of one scrape. Default DefaultTimeout.
	Timeout time.Duration
	// Statuses are the statuses to count. Default DefaultStatuses. The parked statuses add a read
	// of every parked row (through their index), the finished ones a read of the counts kept as
	// rows finish: neither grows with the history (see gendurable.QueueStatsOpts).
	Statuses []gendurable.Status
	// Stuck also reports stuck instances (gendurable.Client.Stuck) on every scrape, as the
	// client sees them: use a client configured like the workers.
	Stuck bool
	// Checkup also reports the findings of gendurable.Client.Checkup on every scrape, as
	// gendurable_checkup_findings{check, severity}; a check once found keeps being reported (at
	// zero once it is gone), so that an alert on it resolves. CheckupOpts tunes its thresholds.
	Checkup     bool
	CheckupOpts *gendurable.CheckupOpts
	// Logger receives a warning for each failed read. Default slog.Default().
	Logger *slog.Logger
}

// QueueCollector reports a schema's queues on every scrape: instances by queue and status, due
// rows and the queue's lag, and optionally stuck instances and the checkup's findings, read
// through a client's inspection
// API. It is a prometheus.Collector: register it on a registry (one per schema; to tell several
// schemas apart, wrap each registerer with prometheus.WrapRegistererWith). A failed read is
// reported as gendurable_inspect_up 0 and counted in gendurable_inspect_errors_total; the scrape
// still succeeds. A queue once seen keeps being reported (with zero counts) for as long as the
// collector lives, so that graphs fall to zero instead of stopping.
type QueueCollector struct {
	client   *gendurable.Client
	timeout  time.Duration
	statuses []gendurable.Status
	stuck    bool
	checkup  *gendurable.CheckupOpts // nil: no checkup
	log      *slog.Logger

	instances, runnable, oldest, stuckCount, stuckOldest, findings *prometheus.Desc
	up, errorsTotal, duration                                      *prometheus.Desc

	mu       sync.Mutex
	seen     map[string]bool
	found    map[[2]string]bool // the (check, severity) pairs the checkup ever reported
	failures map[string]float64
}

// NewQueueCollector builds a collector reading through client; opts may be nil.
func NewQueueCollector(client *gendurable.Client, opts *QueueCollectorOpts) *QueueCollector {
	if opts == nil {
		opts = &QueueCollectorOpts{}
	}
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	c := &QueueCollector{
		client: client, timeout: opts.Timeout, statuses: slices.Clone(opts.Statuses), stuck: opts.Stuck,
		log: opts.Logger, seen: map[string]bool{}, found: map[[2]string]bool{}, failures: map[string]float64{"queue_stats": 0},
	}
	if opts.Checkup {
		c.checkup = &gendurable.CheckupOpts{}
		if opts.CheckupOpts != nil {
			*c.checkup = *opts.CheckupOpts
		}
		c.failures["checkup"] = 0
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if len(c.statuses) == 0 {
		c.statuses = slices.Clone(DefaultStatuses)
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.stuck {
		c.failures["stuck"] = 0
	}
	name := func(n string) string { return prometheus.BuildFQName(ns, "", n) }
	c.instances = prometheus.NewDesc(name("queue_instances"), "Instances by queue and status.", []string{"queue", "status"}, nil)
	c.runnable = prometheus.NewDesc(name("queue_runnable"), "Available instances that are due now.", []string{"queue"}, nil)
	c.oldest = prometheus.NewDesc(name("queue_oldest_runnable_seconds"),
		"How long the longest-waiting due instance has been due (the queue's lag); 0 when nothing is due.", []string{"queue"}, nil)
	c.stuckCount = prometheus.NewDesc(name("stuck_instances"),
		"Instances that cannot make progress on their own, by kind.", []string{"kind", "queue", "machine", "step", "rate_limit"}, nil)
	c.stuckOldest = prometheus.NewDesc(name("stuck_oldest_timestamp_seconds"),
		"The earliest scheduled time (or await deadline) among a group of stuck instances, as a Unix time.",
		[]string{"kind", "queue", "machine", "step", "rate_limit"}, nil)
	c.findings = prometheus.NewDesc(name("checkup_findings"),
		"Findings of the checkup (gendurable.Client.Checkup), by check and severity.", []string{"check", "severity"}, nil)
	c.up = prometheus.NewDesc(name("inspect_up"), "1 if this scrape's inspection queries succeeded, else 0.", nil, nil)
	c.errorsTotal = prometheus.NewDesc(name("inspect_errors_total"), "Inspection queries that failed, by query.", []string{"query"}, nil)
	c.duration = prometheus.NewDesc(name("inspect_duration_seconds"), "How long this scrape's inspection queries took, by query.", []string{"query"}, nil)
	return c
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.instances, c.runnable, c.oldest, c.up, c.errorsTotal, c.duration} {
		ch <- d
	}
	if c.stuck {
		ch <- c.stuckCount
		ch <- c.stuckOldest
	}
	if c.checkup != nil {
		ch <- c.findings
	}
}

// Collect implements prometheus.Collector: it runs the inspection queries, under the timeout.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	up := 1.0

	start := time.Now()
	stats, err := c.client.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: c.statuses})
	ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, time.Since(start).Seconds(), "queue_stats")
	if err != nil {
		up = 0
		c.failed("queue_stats", err)
	} else {
		c.queues(ch, stats)
	}

	if c.stuck {
		start := time.Now()
		groups, err := c.client.Stuck(ctx)
		ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, time.Since(start).Seconds(), "stuck")
		if err != nil {
			up = 0
			c.failed("stuck", err)
		} else {
			for _, g := range groups {
				labels := []string{string(g.Kind), g.Queue, g.Machine, g.Step, g.RateLimit}
				ch <- prometheus.MustNewConstMetric(c.stuckCount, prometheus.GaugeValue, float64(g.Count), labels...)
				ch <- prometheus.MustNewConstMetric(c.stuckOldest, prometheus.GaugeValue,
					float64(g.Oldest.UnixNano())/1e9, labels...)
			}
		}
	}

	if c.checkup != nil {
		start := time.Now()
		fs, err := c.client.Checkup(ctx, c.checkup)
		ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, time.Since(start).Seconds(), "checkup")
		if err != nil {
			up = 0
			c.failed("checkup", err)
		} else {
			c.reportFindings(ch, fs)
		}
	}

	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	c.mu.Lock()
	for query, n := range c.failures {
		ch <- prometheus.MustNewConstMetric(c.errorsTotal, prometheus.CounterValue, n, query)
	}
	c.mu.Unlock()
}

// queues reports the queue gauges: every queue of stats, and every queue seen before with zeros.
func (c *QueueCollector) queues(ch chan<- prometheus.Metric, stats []gendurable.QueueStats) {
	c.mu.Lock()
	for _, q := range stats {
		c.seen[q.Queue] = true
	}
	byQueue := make(map[string]gendurable.QueueStats, len(c.seen))
	for q := range c.seen {
		byQueue[q] = gendurable.QueueStats{Queue: q}
	}
	c.mu.Unlock()
	for _, q := range stats {
		byQueue[q.Queue] = q
	}
	lag := slices.Contains(c.statuses, gendurable.StatusAvailable)
	for _, q := range byQueue {
		for _, s := range c.statuses {
			ch <- prometheus.MustNewConstMetric(c.instances, prometheus.GaugeValue, float64(q.Counts[s]), q.Queue, string(s))
		}
		if lag {
			ch <- prometheus.MustNewConstMetric(c.runnable, prometheus.GaugeValue, float64(q.Runnable), q.Queue)
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, q.OldestRunnable.Seconds(), q.Queue)
		}
	}
}

// reportFindings counts the findings by check and severity, with zeros for those seen before.
func (c *QueueCollector) reportFindings(ch chan<- prometheus.Metric, fs []gendurable.Finding) {
	counts := map[[2]string]float64{}
	c.mu.Lock()
	for _, f := range fs {
		k := [2]string{f.Check, string(f.Severity)}
		c.found[k] = true
		counts[k]++
	}
	for k := range c.found {
		ch <- prometheus.MustNewConstMetric(c.findings, prometheus.GaugeValue, counts[k], k[0], k[1])
	}
	c.mu.Unlock()
}

func (c *QueueCollector) failed(query string, err error) {
	c.mu.Lock()
	c.failures[query]++
	c.mu.Unlock()
	c.log.Warn("gendurable: metrics: inspection query failed", "query", query, "error", err)
}
