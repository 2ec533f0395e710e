package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// gatedSteps is a job whose steps block until open is closed (or their context ends), counting
// the steps running at once and each instance's runs.
type gatedSteps struct {
	open    chan struct{}
	running atomic.Int64
	most    atomic.Int64
	mu      sync.Mutex
	runs    map[int64]int
}

func newGatedSteps() *gatedSteps {
	return &gatedSteps{open: make(chan struct{}), runs: map[int64]int{}}
}

func (g *gatedSteps) job(queue string) gendurable.Job[int] {
	return gendurable.Job[int]{Name: "held", Queue: queue, Perform: func(ctx *gendurable.Ctx, _ int) error {
		n := g.running.Add(1)
		defer g.running.Add(-1)
		for {
			m := g.most.Load()
			if n <= m || g.most.CompareAndSwap(m, n) {
				break
			}
		}
		g.mu.Lock()
		g.runs[ctx.ID]++
		g.mu.Unlock()
		select {
		case <-g.open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

// client builds a client of cfg that works queue "pf" with g's job, conc executors and prefetch.
func (g *gatedSteps) client(t *testing.T, e *env, cfg gendurable.Config, conc, prefetch int) (*gendurable.Client, gendurable.Job[int]) {
	t.Helper()
	job := g.job("pf")
	cfg.Machines = []gendurable.Machine{job}
	cfg.Queues = map[string]gendurable.QueueConfig{"pf": {Concurrency: conc, Prefetch: prefetch}}
	return e.client(t, &cfg), job
}

func (g *gatedSteps) ran(id int64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runs[id]
}

func (g *gatedSteps) ranAll() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range g.runs {
		n += r
	}
	return n
}

// waitClaimed waits until the database shows claimed rows executing, running of them in g's steps.
func (g *gatedSteps) waitClaimed(t *testing.T, e *env, claimed, running int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("%d rows claimed, %d running", claimed, running), func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`) == claimed &&
			g.running.Load() == int64(running)
	})
}

// waitDone waits until n instances are done.
func waitDone(t *testing.T, e *env, n int) {
	t.Helper()
	eventually(t, 20*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
}

func insertHeld(t *testing.T, cl *gendurable.Client, job gendurable.Job[int], n int) []int64 {
	t.Helper()
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(i)}
	}
	res, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

// A queue with Prefetch claims rows beyond its free executors, but runs no more steps at once
// than its Concurrency; the claimed rows wait in the client and every instance runs once.
func TestPrefetchClaimsAheadButRunsAtMostConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGatedSteps()
	cl, job := g.client(t, e, gendurable.Config{}, 4, 12)
	insertHeld(t, cl, job, 40)
	start(t, cl)
	g.waitClaimed(t, e, 16, 4)
	// The 12 prefetched rows wait: no step beyond the four starts while they are held.
	require.Equal(t, 4, g.ranAll())
	close(g.open)
	waitDone(t, e, 40)
	require.LessOrEqual(t, g.most.Load(), int64(4), "more steps ran at once than the queue's Concurrency")
	require.Equal(t, 40, g.ranAll(), "every instance ran once")
}

// The heartbeat keeps the leases of rows that wait for an executor: a reaper sweeping past the
// lease they were claimed with releases none of them, and none runs twice.
func TestPrefetchedRowsKeepTheirLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGatedSteps()
	cl, job := g.client(t, e, gendurable.Config{Lease: time.Second, Reaper: &gendurable.ReaperConfig{Interval: 50 * time.Millisecond}}, 1, 3)
	insertHeld(t, cl, job, 4)
	start(t, cl)
	g.waitClaimed(t, e, 4, 1)
	var claimedUntil time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`SELECT max(locked_until) FROM {schema}.instances`, e.schema)).Scan(&claimedUntil))
	// Hold the running step until the database's clock is a second past the leases the rows were
	// claimed with: a waiting row no heartbeat extended would have been released by then.
	eventually(t, 30*time.Second, "a second past the first leases", func() bool {
		return e.count(t, `SELECT count(*) FROM (SELECT 1 WHERE now() > $1::timestamptz + interval '1 second') x`, claimedUntil) == 1
	})
	require.Equal(t, 4, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND locked_until > $1`, claimedUntil),
		"the heartbeat extends the leases of the rows waiting for an executor")
	close(g.open)
	waitDone(t, e, 4)
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors IS NOT NULL AND errors <> '[]'::jsonb`),
		"no claim was released by the reaper")
	require.Equal(t, 4, g.ranAll(), "every instance ran once")
}

// Stop hands back at once the rows that still wait for an executor, unrun, while the running
// step finishes: they are runnable for another node at once, not after the drain or their leases.
func TestStopHandsBackPrefetchedRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGatedSteps()
	cl, job := g.client(t, e, gendurable.Config{Lease: time.Minute, Reaper: &gendurable.ReaperConfig{Disabled: true}}, 1, 3)
	ids := insertHeld(t, cl, job, 4)
	require.NoError(t, cl.Start(context.Background()))
	g.waitClaimed(t, e, 4, 1)
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stopped <- cl.Stop(ctx)
	}()
	eventually(t, 10*time.Second, "the waiting rows handed back while the step runs", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available' AND locked_by IS NULL AND attempt = 0`) == 3
	})
	require.Equal(t, int64(1), g.running.Load(), "the running step still runs")
	close(g.open)
	require.NoError(t, <-stopped)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`))
	require.Equal(t, 1, g.ranAll(), "no prefetched row ran once Stop began")

	// Another client runs the rest.
	g2 := newGatedSteps()
	close(g2.open)
	other := e.client(t, &gendurable.Config{Name: "other", Machines: []gendurable.Machine{g2.job("pf")},
		Queues: map[string]gendurable.QueueConfig{"pf": {Concurrency: 4}}})
	start(t, other)
	waitDone(t, e, 4)
	for _, id := range ids {
		require.Equal(t, 1, g.ran(id)+g2.ran(id), "instance %d ran once", id)
	}
}

// Rows that wait for an executor when their queue is paused are handed back unrun, no attempt
// spent; they run once the queue is resumed.
func TestPrefetchedRowsOfAPausedQueueAreHandedBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := newGatedSteps()
	cl, job := g.client(t, e, gendurable.Config{}, 1, 3)
	ids := insertHeld(t, cl, job, 4)
	start(t, cl)
	ctx := context.Background()
	g.waitClaimed(t, e, 4, 1)
	require.NoError(t, cl.Pause(ctx, gendurable.PauseTarget{Queue: "pf"}, "test"))
	close(g.open)
	eventually(t, 10*time.Second, "the running step done and the waiting rows handed back", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 1 &&
			e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available' AND attempt = 0`) == 3
	})
	require.Equal(t, 1, g.ranAll(), "no row ran after the pause")
	require.NoError(t, cl.Resume(ctx, gendurable.PauseTarget{Queue: "pf"}))
	waitDone(t, e, 4)
	for _, id := range ids {
		require.Equal(t, 1, g.ran(id))
	}
}

// A row that waits for an executor when its instance is paused on its own is handed back unrun,
// no attempt spent, once a heartbeat has seen the pause; the instance runs once resumed. One
// resumed before it starts is not handed back (it is claimed once), and the other waiting rows run.
func TestPrefetchedRowOfAPausedInstanceIsHandedBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	logClaims(t, e)
	g := newGatedSteps()
	var beats atomic.Int64
	cl, job := g.client(t, e, gendurable.Config{Heartbeat: 50 * time.Millisecond,
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventHeartbeatBeat {
				beats.Add(1)
			}
		}}}, 1, 3)
	ids := insertHeld(t, cl, job, 4)
	start(t, cl)
	ctx := context.Background()
	g.waitClaimed(t, e, 4, 1)
	eventually(t, 10*time.Second, "the running step recorded", func() bool { return g.ranAll() == 1 })
	var waiting []int64 // the prefetched rows, not the one running
	for _, id := range ids {
		if g.ran(id) == 0 {
			waiting = append(waiting, id)
		}
	}
	require.Len(t, waiting, 3)
	paused, resumed := waiting[0], waiting[1]
	// A beat that began after a change committed has seen it, and marked the rows before its
	// heartbeat.beat event: the second beat from now.
	seen := func() {
		n := beats.Load() + 2
		eventually(t, 10*time.Second, "two heartbeats", func() bool { return beats.Load() >= n })
	}
	require.NoError(t, cl.Pause(ctx, gendurable.PauseTarget{Instance: paused}, "test"))
	require.NoError(t, cl.Pause(ctx, gendurable.PauseTarget{Instance: resumed}, "test"))
	seen()
	require.NoError(t, cl.Resume(ctx, gendurable.PauseTarget{Instance: resumed}))
	seen()
	close(g.open)
	eventually(t, 10*time.Second, "the others done and the paused instance's row handed back", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 3 &&
			e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'available' AND attempt = 0
				AND paused_at IS NOT NULL`, paused) == 1
	})
	require.Zero(t, g.ran(paused), "the paused instance's step ran")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.t_claims WHERE id = $1`, resumed),
		"the instance resumed before its row started was handed back")
	require.NoError(t, cl.Resume(ctx, gendurable.PauseTarget{Instance: paused}))
	waitDone(t, e, 4)
	for _, id := range ids {
		require.Equal(t, 1, g.ran(id))
	}
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM {schema}.t_claims WHERE id = $1`, paused))
}
