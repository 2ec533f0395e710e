package gendurable_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// recorder keeps a node's events and log lines.
type recorder struct {
	mu     sync.Mutex
	events map[gendurable.EventName][]gendurable.Event
	logs   bytes.Buffer
}

func newRecorder() *recorder {
	return &recorder{events: map[gendurable.EventName][]gendurable.Event{}}
}

func (r *recorder) hook(ev gendurable.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events[ev.Name] = append(r.events[ev.Name], ev)
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logs.Write(p)
}

func (r *recorder) logger() *slog.Logger { return slog.New(slog.NewTextHandler(r, nil)) }

func (r *recorder) count(name gendurable.EventName) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events[name])
}

// sum adds up a field of every event of that name.
func (r *recorder) sum(name gendurable.EventName, field func(gendurable.Event) int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events[name] {
		n += field(ev)
	}
	return n
}

func (r *recorder) lines(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Count(r.logs.String(), substr)
}

const (
	logNoQueues = "no queues configured"
	logNoReaper = "reaper disabled on this node"
	logNoGC     = "GC disabled on this node"
)

// maintenanceWork is what only the sweepers change: a claim whose lease ran out (in a queue no
// node here runs), a finished row two days old, a refilled bucket and a leaked gate counter.
type maintenanceWork struct{ claim, finished int64 }

func seedMaintenanceWork(t *testing.T, e *env) maintenanceWork {
	t.Helper()
	var w maintenanceWork
	ctx := context.Background()
	require.NoError(t, e.pool.QueryRow(ctx, expand(`INSERT INTO {schema}.instances
		(machine, step, queue, status, attempt, max_attempts, state, locked_by, locked_until)
		VALUES ('topo', 'perform', 'elsewhere', 'executing', 1, 5, '{}', 'gone:elsewhere@nowhere-0#1', now() - interval '1 minute')
		RETURNING id`, e.schema)).Scan(&w.claim))
	require.NoError(t, e.pool.QueryRow(ctx, expand(`INSERT INTO {schema}.instances
		(machine, step, queue, status, max_attempts, state, finalized_at)
		VALUES ('topo', 'perform', 'default', 'done', 5, '{}', now() - interval '2 days')
		RETURNING id`, e.schema)).Scan(&w.finished))
	e.exec(t, `INSERT INTO {schema}.buckets (key, tokens, rate, burst, updated_at) VALUES ('api:x', 10, 10, 10, now() - interval '1 minute')`)
	e.exec(t, `INSERT INTO {schema}.gates (key, shard, held, capacity) VALUES ('pool:x', 0, 2, 2)`)
	return w
}

// untouched checks that no sweeper has been at w.
func (w maintenanceWork) untouched(t *testing.T, e *env) {
	t.Helper()
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'executing'`, w.claim), "the expired claim was released")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1`, w.finished), "the old finished row was collected")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.buckets`), "the refilled bucket was pruned")
	require.Equal(t, 2, e.count(t, `SELECT held FROM {schema}.gates`), "the gate counter was reconciled")
}

// done reports whether sweepers have done all of w.
func (w maintenanceWork) done(t *testing.T, e *env) bool {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'available'`, w.claim) == 1 &&
		e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1`, w.finished) == 0 &&
		e.count(t, `SELECT count(*) FROM {schema}.buckets`) == 0 &&
		e.count(t, `SELECT count(*) FROM {schema}.gates WHERE held > 0`) == 0
}

// quietPeriod is how long a node whose sweepers are disabled is watched for sweeping anyway: were
// they running at the 10ms intervals the tests give them, they would have swept many times.
const quietPeriod = 300 * time.Millisecond

var (
	topoJob = gendurable.Job[counter]{Name: "topo", Perform: func(*gendurable.Ctx, counter) error { return nil }}
	limits  = map[string]gendurable.ConcurrencyLimit{"pool": {Limit: 2}}
	rates   = map[string]gendurable.Rate{"api": {Allowed: 10, Period: time.Second}}
)

// A worker-only node runs steps and neither reaps nor collects; a maintenance node started next
// to it does both.
func TestTopologyWorkerOnlyNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	work := seedMaintenanceWork(t, e)
	rec := newRecorder()
	worker := &gendurable.Config{
		Machines:          []gendurable.Machine{topoJob},
		Queues:            map[string]gendurable.QueueConfig{"default": {Concurrency: 20}},
		ConcurrencyLimits: limits,
		RateLimits:        rates,
		Reaper:            &gendurable.ReaperConfig{Disabled: true},
		GC:                &gendurable.GCConfig{Disabled: true},
	}
	worker.Reaper.Interval, worker.GC.Interval = 10*time.Millisecond, 10*time.Millisecond
	worker.Logger, worker.Hooks = rec.logger(), []func(gendurable.Event){rec.hook}
	cl := e.client(t, worker)
	start(t, cl)
	params := make([]gendurable.InsertManyParams, 20)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: topoJob.With(counter{})}
	}
	ctx := context.Background()
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 20*time.Second, "the worker ran the jobs", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done' AND finalized_at > now() - interval '1 hour'`) == 20
	})
	time.Sleep(quietPeriod)
	work.untouched(t, e)
	require.Zero(t, rec.count(gendurable.EventReaperReclaimed))
	require.Zero(t, rec.count(gendurable.EventGCSwept))
	require.Equal(t, 20, rec.count(gendurable.EventStepStarted))
	require.Equal(t, 1, rec.lines(logNoReaper))
	require.Equal(t, 1, rec.lines(logNoGC))
	require.Zero(t, rec.lines(logNoQueues))

	// The work was there to do: a maintenance node does it.
	mrec := newRecorder()
	m := e.client(t, &gendurable.Config{Name: "maintenance", ConcurrencyLimits: limits, RateLimits: rates,
		Reaper: &gendurable.ReaperConfig{Interval: 10 * time.Millisecond},
		GC:     &gendurable.GCConfig{Interval: 10 * time.Millisecond, Retention: time.Hour},
		Logger: mrec.logger(), Hooks: []func(gendurable.Event){mrec.hook}})
	start(t, m)
	eventually(t, 10*time.Second, "the maintenance node swept", func() bool { return work.done(t, e) })
	require.Equal(t, 20, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`), "young finished rows are kept")
}

// A maintenance-only node reaps and collects and runs no step.
func TestTopologyMaintenanceOnlyNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	work := seedMaintenanceWork(t, e)
	inserter := e.client(t, &gendurable.Config{Name: "inserter", Machines: []gendurable.Machine{topoJob}})
	ctx := context.Background()
	waiting, err := inserter.Insert(ctx, topoJob.With(counter{}), nil)
	require.NoError(t, err)
	rec := newRecorder()
	maintenance := &gendurable.Config{
		Name:              "maintenance",
		ConcurrencyLimits: limits, // the same gates and rate limits as the workers
		RateLimits:        rates,
		Reaper:            &gendurable.ReaperConfig{Interval: 5 * time.Second},
		GC:                &gendurable.GCConfig{Interval: time.Minute, Retention: 7 * 24 * time.Hour},
	}
	maintenance.Reaper.Interval, maintenance.GC.Interval = 10*time.Millisecond, 10*time.Millisecond
	maintenance.GC.Retention = time.Hour
	maintenance.Logger, maintenance.Hooks = rec.logger(), []func(gendurable.Event){rec.hook}
	cl := e.client(t, maintenance)
	start(t, cl)
	eventually(t, 10*time.Second, "the maintenance node swept", func() bool { return work.done(t, e) })
	eventually(t, 5*time.Second, "gc.swept reported it", func() bool {
		return rec.sum(gendurable.EventGCSwept, func(ev gendurable.Event) int { return ev.Count }) == 1 &&
			rec.sum(gendurable.EventGCSwept, func(ev gendurable.Event) int { return ev.Buckets }) == 1 &&
			rec.sum(gendurable.EventGCSwept, func(ev gendurable.Event) int { return ev.Gates }) == 1
	})
	require.Equal(t, 1, rec.sum(gendurable.EventReaperReclaimed, func(ev gendurable.Event) int { return ev.Count }))

	in, err := cl.Get(ctx, waiting.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status, "no step ran here")
	require.Zero(t, in.Attempt)
	require.Zero(t, rec.count(gendurable.EventSchedulerPicked))
	require.Zero(t, rec.count(gendurable.EventStepStarted))
	require.Equal(t, 1, rec.lines(logNoQueues))
	require.Zero(t, rec.lines(logNoReaper))
	require.Zero(t, rec.lines(logNoGC))
}

// A web-only node inserts and signals, and neither runs steps nor sweeps.
func TestTopologyWebOnlyNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	work := seedMaintenanceWork(t, e)
	rec := newRecorder()
	web := &gendurable.Config{
		Name:     "web",
		Machines: []gendurable.Machine{topoJob}, // optional: With carries what an insert needs
		Reaper:   &gendurable.ReaperConfig{Disabled: true},
		GC:       &gendurable.GCConfig{Disabled: true},
	}
	web.Reaper.Interval, web.GC.Interval = 10*time.Millisecond, 10*time.Millisecond
	web.Logger, web.Hooks = rec.logger(), []func(gendurable.Event){rec.hook}
	cl := e.client(t, web)
	start(t, cl)
	ctx := context.Background()
	res, err := cl.Insert(ctx, topoJob.With(counter{}), nil)
	require.NoError(t, err)
	sig, err := cl.Signal(ctx, gendurable.ByID(res.ID), "hello", nil)
	require.NoError(t, err)
	require.Equal(t, res.ID, sig.InstanceID)
	time.Sleep(quietPeriod)
	work.untouched(t, e)
	in, err := cl.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
	require.Zero(t, in.Attempt)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, res.ID))
	require.Zero(t, rec.count(gendurable.EventSchedulerPicked))
	require.Zero(t, rec.count(gendurable.EventReaperReclaimed))
	require.Zero(t, rec.count(gendurable.EventGCSwept))
	for _, line := range []string{logNoQueues, logNoReaper, logNoGC} {
		require.Equal(t, 1, rec.lines(line), line)
	}
}
