package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
)

// SoakWindow is one window of the soak scenario: the work done in it and the instances table's
// state at its end.
type SoakWindow struct {
	// Index counts the windows from 1; Seconds is the time since the load began.
	Index   int     `json:"index"`
	Seconds float64 `json:"seconds"`
	// Inserted and Worked are the instances inserted and finished in the window, per second.
	InsertPerS float64 `json:"insert_per_s"`
	WorkPerS   float64 `json:"work_per_s"`
	// PickupP50ms and PickupP99ms: from an instance's insert to its step's start.
	PickupP50ms *float64 `json:"pickup_p50_ms,omitempty"`
	PickupP99ms *float64 `json:"pickup_p99_ms,omitempty"`
	// Backlog is the instances not finished at the window's end; BacklogMax the most seen in the
	// window (sampled every 50 ms: GC's and vacuum's passes come at a period of their own, which
	// the window's end may always miss).
	Backlog    int64 `json:"backlog"`
	BacklogMax int64 `json:"backlog_max"`
	// The instances table at the window's end: rows (live and dead, from the statistics), its
	// size with indexes and TOAST, the heap alone and the indexes alone, in MB.
	LiveTuples int64   `json:"live_tuples"`
	DeadTuples int64   `json:"dead_tuples"`
	TotalMB    float64 `json:"total_mb"`
	TableMB    float64 `json:"table_mb"`
	IndexesMB  float64 `json:"indexes_mb"`
	// AutovacuumRuns and AutoanalyzeRuns count the instances table's autovacuums and
	// autoanalyzes since the soak began; GCDeleted the finished instances GC deleted.
	AutovacuumRuns  int64 `json:"autovacuum_runs"`
	AutoanalyzeRuns int64 `json:"autoanalyze_runs"`
	GCDeleted       int64 `json:"gc_deleted"`
	// LockWaitMaxMs is the longest a backend of the benchmark was seen waiting on a lock in the
	// window (sampled every 50 ms: the time since its statement began); LockWaitsOver100ms how
	// many samples saw one waiting longer than 100 ms.
	LockWaitMaxMs      float64 `json:"lock_wait_max_ms"`
	LockWaitsOver100ms int     `json:"lock_waits_over_100ms"`
}

type soakArgs struct {
	T0 int64 `json:"t0"`
}

// runSoak inserts Rate instances a second (open loop: a batch every 10 ms, whatever the client
// does) for Duration, while one client works them with GC at Retention, and reports every
// Window what was done and what the table looks like (one Result per window, Window set, then
// the summary).
func runSoak(ctx context.Context, r *runner, _ int) (Result, error) {
	o := r.opts
	var mu sync.Mutex
	var pickups []time.Duration
	job := gendurable.Job[soakArgs]{Name: "soak", Queue: "bench", Perform: func(_ *gendurable.Ctx, a soakArgs) error {
		d := time.Since(time.Unix(0, a.T0))
		mu.Lock()
		pickups = append(pickups, d)
		mu.Unlock()
		return nil
	}}
	var finished, deleted atomic.Int64
	hook := func(ev gendurable.Event) {
		switch {
		case ev.Name == gendurable.EventStepFinished && (ev.Outcome == "done" || ev.Outcome == "failed"):
			finished.Add(1)
		case ev.Name == gendurable.EventGCSwept:
			deleted.Add(int64(ev.Count))
		}
	}
	gc := &gendurable.GCConfig{Retention: o.Retention}
	cl, err := gendurable.NewClient(r.pool, &gendurable.Config{Name: "soak", Schema: o.Schema, Logger: o.Logger,
		Machines: []gendurable.Machine{job}, Queues: map[string]gendurable.QueueConfig{"bench": {Concurrency: o.Concurrency}},
		Hooks: []func(gendurable.Event){hook}, GC: gc})
	if err != nil {
		return Result{}, err
	}
	if err := cl.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() { _ = stop(cl) }()

	base, err := tableStats(ctx, r, o.Schema)
	if err != nil {
		return Result{}, err
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var inserted atomic.Int64
	loadErr := make(chan error, 1)
	go func() { loadErr <- soakLoad(lctx, cl, job, o.Rate, &inserted) }()
	waits := startLockSampler(lctx, r)
	var backlogMax atomic.Int64
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
			b := inserted.Load() - finished.Load()
			for cur := backlogMax.Load(); b > cur && !backlogMax.CompareAndSwap(cur, b); cur = backlogMax.Load() {
			}
		}
	}()

	t0 := time.Now()
	var windows []SoakWindow
	var lastIns, lastDone, lastDel int64
	for i := 1; time.Since(t0) < o.Duration; i++ {
		end := t0.Add(time.Duration(i) * o.Window)
		if end.After(t0.Add(o.Duration)) {
			end = t0.Add(o.Duration)
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case err := <-loadErr:
			return Result{}, fmt.Errorf("the load stopped: %w", err)
		case <-time.After(time.Until(end)):
		}
		span := end.Sub(t0.Add(time.Duration(i-1) * o.Window)).Seconds()
		st, err := tableStats(ctx, r, o.Schema)
		if err != nil {
			return Result{}, err
		}
		mu.Lock()
		p := pickups
		pickups = nil
		mu.Unlock()
		sort.Slice(p, func(a, b int) bool { return p[a] < p[b] })
		ins, done, del := inserted.Load(), finished.Load(), deleted.Load()
		maxWait, over := waits.take()
		w := SoakWindow{Index: i, Seconds: round(time.Since(t0).Seconds()),
			InsertPerS: round(float64(ins-lastIns) / span), WorkPerS: round(float64(done-lastDone) / span),
			PickupP50ms: pct(p, 0.5), PickupP99ms: pct(p, 0.99), Backlog: ins - done, BacklogMax: max(backlogMax.Swap(0), ins-done),
			LiveTuples: st.live, DeadTuples: st.dead, TotalMB: mb(st.total), TableMB: mb(st.table), IndexesMB: mb(st.indexes),
			AutovacuumRuns: st.autovacuum - base.autovacuum, AutoanalyzeRuns: st.autoanalyze - base.autoanalyze,
			GCDeleted: del - lastDel, LockWaitMaxMs: round(maxWait), LockWaitsOver100ms: over}
		lastIns, lastDone, lastDel = ins, done, del
		windows = append(windows, w)
		if o.Window < o.Duration {
			r.emitWindow(w)
		}
	}
	cancel()
	if err := <-loadErr; err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		return Result{}, err
	}
	d := time.Since(t0)
	res := Result{Seconds: round(d.Seconds()), InsertPerS: rate(int(inserted.Load()), d), WorkPerS: rate(int(finished.Load()), d)}
	var all []float64
	for _, w := range windows {
		if w.PickupP99ms != nil {
			all = append(all, *w.PickupP99ms)
		}
	}
	if len(all) > 0 {
		sort.Float64s(all)
		worst := all[len(all)-1]
		res.P99ms = &worst // the worst window's pickup p99
	}
	last := windows[len(windows)-1]
	res.Window = &last
	return res, nil
}

// soakLoad inserts rate instances a second, a batch every 10 ms, until ctx ends.
func soakLoad(ctx context.Context, cl *gendurable.Client, job gendurable.Job[soakArgs], rate float64, n *atomic.Int64) error {
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var params []gendurable.InsertManyParams
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		// Open loop: the batch is what the schedule owes by now, however late this tick is.
		owed := int64(time.Since(start).Seconds()*rate) - n.Load()
		if owed <= 0 {
			continue
		}
		params = params[:0]
		now := time.Now().UnixNano()
		for range owed {
			params = append(params, gendurable.InsertManyParams{Input: job.With(soakArgs{T0: now})})
		}
		if _, err := cl.InsertMany(ctx, params); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		n.Add(owed)
	}
}

type relStats struct {
	total, table, indexes, live, dead, autovacuum, autoanalyze int64
}

func tableStats(ctx context.Context, r *runner, schema string) (relStats, error) {
	var s relStats
	err := r.pool.QueryRow(ctx, `SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid),
		coalesce(st.n_live_tup, 0), coalesce(st.n_dead_tup, 0), coalesce(st.autovacuum_count, 0), coalesce(st.autoanalyze_count, 0)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
		WHERE n.nspname = $1 AND c.relname = 'instances'`, schema).Scan(&s.total, &s.table, &s.indexes, &s.live, &s.dead,
		&s.autovacuum, &s.autoanalyze)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("no instances table in schema %q", schema)
	}
	return s, err
}

// WriteWindow prints a soak window as one line.
func WriteWindow(w io.Writer, s SoakWindow) {
	f := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	fmt.Fprintf(w, "soak %3d %7.0fs  insert/s %8.1f  work/s %8.1f  pickup p50 %6s p99 %6s ms  backlog %6d (max %6d)  "+
		"table %7.1f MB (heap %.1f, indexes %.1f)  live %9d dead %8d  autovacuum %3d  gc deleted %7d  lock wait max %.0f ms (>100ms: %d)\n",
		s.Index, s.Seconds, s.InsertPerS, s.WorkPerS, f(s.PickupP50ms), f(s.PickupP99ms), s.Backlog, s.BacklogMax, s.TotalMB, s.TableMB,
		s.IndexesMB, s.LiveTuples, s.DeadTuples, s.AutovacuumRuns, s.GCDeleted, s.LockWaitMaxMs, s.LockWaitsOver100ms)
}

func mb(b int64) float64 { return round(float64(b) / (1 << 20)) }

// lockSampler records how long the benchmark's backends wait on locks.
type lockSampler struct {
	mu   sync.Mutex
	max  float64
	over int
}

func startLockSampler(ctx context.Context, r *runner) *lockSampler {
	s := &lockSampler{}
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var ms float64
			err := r.pool.QueryRow(ctx, `SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start) * 1000), 0)
				FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&ms)
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.max = max(s.max, ms)
			if ms > 100 {
				s.over++
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// take returns the window's figures and starts the next window.
func (s *lockSampler) take() (float64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, o := s.max, s.over
	s.max, s.over = 0, 0
	return m, o
}
