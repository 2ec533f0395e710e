package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// cronDuration is how long the cron scenario lets its schedules fire, unless Options.Duration
// says otherwise.
const cronDuration = 10 * time.Second

// runCron measures the schedule firer: n schedules firing every second on one node (which runs
// no queue, so that the database's time is the firing's alone) for cronDuration (or
// Options.Duration). Lag is from a
// fire time to the commit of its instance's insert (event schedule.fired), over the fires after
// the first second (the first round fires the times missed while the schedules were set); the
// database time per fire is the database's statement time (pg_stat_database.active_time) over
// the run divided by the fires.
func runCron(ctx context.Context, r *runner, n int) (Result, error) {
	job := gendurable.Job[noArgs]{Name: "tick", Queue: "bench", Perform: func(*gendurable.Ctx, noArgs) error { return nil }}
	var mu sync.Mutex
	var lags []time.Duration
	var warm time.Time // fires before it are the first round's, of fire times missed while the schedules were set
	fires := 0
	hook := func(ev gendurable.Event) {
		if ev.Name == gendurable.EventScheduleFired {
			mu.Lock()
			if ev.At.After(warm) {
				lags = append(lags, ev.Duration)
			}
			fires += ev.Count
			mu.Unlock()
		}
	}
	cl, err := gendurable.NewClient(r.pool, &gendurable.Config{Name: "cron", Schema: r.opts.Schema, Logger: r.opts.Logger,
		Machines: []gendurable.Machine{job}, Hooks: []func(gendurable.Event){hook}})
	if err != nil {
		return Result{}, err
	}
	for i := range n {
		if err := cl.SetSchedule(ctx, gendurable.Schedule{Name: fmt.Sprintf("s%05d", i), Input: job.With(noArgs{}),
			Every: time.Second, Overlap: gendurable.OverlapAllow}); err != nil {
			return Result{}, err
		}
	}
	active := func() (float64, error) {
		var ms float64
		err := r.pool.QueryRow(ctx, `SELECT coalesce(active_time, 0) FROM pg_stat_database WHERE datname = current_database()`).Scan(&ms)
		return ms, err
	}
	// The statistics are flushed by each backend when it goes idle (at most once a second).
	time.Sleep(1500 * time.Millisecond)
	before, err := active()
	if err != nil {
		return Result{}, err
	}
	mu.Lock()
	warm = time.Now().Add(time.Second)
	mu.Unlock()
	if err := cl.Start(ctx); err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	run := cronDuration
	if r.opts.durationSet {
		run = r.opts.Duration
	}
	time.Sleep(run)
	if err := stop(cl); err != nil {
		return Result{}, err
	}
	d := time.Since(t0)
	time.Sleep(1500 * time.Millisecond)
	after, err := active()
	if err != nil {
		return Result{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	if fires == 0 {
		return Result{}, fmt.Errorf("no schedule fired in %v", d)
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	perFire := round((after - before) / float64(fires))
	return Result{Seconds: round(d.Seconds()), WorkPerS: rate(fires, d), P50ms: pct(lags, 0.50), P95ms: pct(lags, 0.95),
		P99ms: pct(lags, 0.99), DBmsPerFire: &perFire}, nil
}
