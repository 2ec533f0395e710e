package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/spell"
	"github.com/gendurable/gendurable/internal/store"
)

// bucketBatch is how many buckets one gc_buckets statement deletes at most (see maintenance.sql).
const bucketBatch = 1000

// bucketFullFor is how long a rate-limit bucket must have been full before GC prunes it: far
// longer than the gap between a pick's transaction start and its snapshot, so that no pick can
// find a bucket pruned that was not yet full at its start (see gc_buckets in maintenance.sql).
const bucketFullFor = time.Minute

// GC collects what no longer carries information: finished instances past their retention (with
// their inboxes), rate-limit buckets that have been full for a minute (bucketFullFor), gate counters
// that disagree with the executing rows or the configuration (reconciled, or removed), and the
// finished counts' rows (folded, one per queue and status). At least
// one node of a cluster runs it; duplicates are safe (every statement claims its rows with
// ordered FOR UPDATE SKIP LOCKED).
type GC struct {
	Store *store.Store
	DB    store.DB
	// Interval is the time between sweeps.
	Interval time.Duration
	// Retention is how long a finished instance is kept after finalized_at, unless its machine
	// declares its own (the retention table, written by the clients that register it).
	Retention time.Duration
	// Batch is how many instances one statement deletes at most. A statement the server cancels
	// (a statement_timeout on the role) halves it for the rest of the GC's life (see machine).
	Batch int
	// Budget bounds one sweep's instance deletion: past it the sweep stops after the batch in
	// hand, and the next sweep carries on. Zero: Interval.
	Budget time.Duration
	Logger *slog.Logger
	Emit   func(durabletype.Event)
	// Gates is the concurrency-gate configuration the reconciler checks counters against (nil:
	// none configured; counters of gates no longer configured are still cleaned up).
	Gates *store.Gates
	// Rates is the rate-limit configuration buckets are judged full against, beside the rate
	// and burst each was written with (nil: none; then by those alone).
	Rates *store.Rates

	// beforeBatch and afterBatch, when set, see every instance batch (tests): the cursor it
	// starts from; the rows it deleted and the statement's duration.
	beforeBatch func(machine string, from store.GCCursor)
	afterBatch  func(machine string, deleted int, took time.Duration)
	// next is the machine the next sweep starts with: a sweep that runs out of budget carries on
	// there next time, so that one machine's backlog never starves the others.
	next string
	// batch is the batch in use: Batch, or less once statements were cancelled.
	batch shrinking
	// failing keeps the log of sweeps failing one after another short.
	failing spell.Log
}

// GCResult is what one sweep did.
type GCResult struct {
	// Instances is how many finished instances it deleted, in Batches statements.
	Instances int
	Batches   int
	// Buckets is how many rate-limit buckets it pruned.
	Buckets int
	// Gates is how many gate counters it repaired or removed.
	Gates    int
	Duration time.Duration
}

// Run sweeps every Interval until stop is closed. Closing stop also cancels a sweep in progress.
func (g *GC) Run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-watched }()
	t := time.NewTicker(g.Interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			// The budget bounds the deletion; the rest of a sweep is a few bounded statements.
			sctx, scancel := context.WithTimeout(ctx, g.budget()+30*time.Second)
			// A sweep is idempotent: one whose connection was lost (a restarted database's
			// stale pool connections) runs again at once on another.
			began := time.Now()
			err := store.RetryConnLost(sctx, func() error { _, err := g.Sweep(sctx); return err })
			switch {
			case err == nil:
				g.failing.Succeeded(g.Logger, "gendurable: GC sweeps succeed again")
			case ctx.Err() == nil:
				g.failing.Failed(g.Logger, "gendurable: GC sweep failed", "error", err)
				g.Emit(durabletype.Event{Name: durabletype.EventGCFailed, Duration: time.Since(began), Err: err})
			}
			scancel()
		}
	}
}

func (g *GC) budget() time.Duration {
	if g.Budget > 0 {
		return g.Budget
	}
	return g.Interval
}

// Sweep deletes finished instances past retention, a batch per statement until a short batch
// (or the budget runs out), then prunes buckets, reconciles gate counters and folds the finished
// counts (which its deletions have just added to). It emits gc.swept
// with what it did.
func (g *GC) Sweep(ctx context.Context) (GCResult, error) {
	began := time.Now()
	var res GCResult
	err := g.instances(ctx, began, &res)
	if err == nil {
		err = g.buckets(ctx, &res)
	}
	if err == nil {
		err = g.gates(ctx, &res)
	}
	if err == nil {
		if _, ferr := g.Store.FoldFinishedCounts(ctx, g.DB); ferr != nil {
			err = fmt.Errorf("GC: fold the finished counts: %w", ferr)
		}
	}
	res.Duration = time.Since(began)
	if res.Instances+res.Buckets+res.Gates > 0 {
		g.Logger.Info("gendurable: GC swept", "instances", res.Instances, "buckets", res.Buckets,
			"gates", res.Gates, "duration", res.Duration)
	}
	// Every sweep that ran reports, even one that found nothing: the event is also the sign
	// that some node collects.
	g.Emit(durabletype.Event{Name: durabletype.EventGCSwept, Count: res.Instances, Buckets: res.Buckets,
		Gates: res.Gates, Duration: res.Duration})
	return res, err
}

// instances sweeps the machines that have finished rows one after the other, each under its own
// retention, starting where the last sweep ran out of budget.
func (g *GC) instances(ctx context.Context, began time.Time, res *GCResult) error {
	machines, err := g.Store.GCMachines(ctx, g.DB)
	if err != nil {
		return fmt.Errorf("GC of finished instances: list their machines: %w", err)
	}
	if len(machines) == 0 {
		return nil
	}
	retentions, err := g.Store.Retentions(ctx, g.DB)
	if err != nil {
		return fmt.Errorf("GC of finished instances: read the machines' retentions: %w", err)
	}
	first, _ := slices.BinarySearch(machines, g.next)
	for k := range machines {
		m := machines[(first+k)%len(machines)]
		retention := g.Retention
		if r, ok := retentions[m]; ok {
			retention = r
		}
		done, err := g.machine(ctx, m, retention, began, res)
		if err != nil {
			return err
		}
		if !done {
			g.next = m // out of budget: this machine first, next time
			return nil
		}
	}
	g.next = ""
	return nil
}

// machine deletes machine's finished rows past retention, a batch per statement, until a short
// batch (done) or the sweep's budget runs out.
//
// A batch the server cancels (query_canceled: a statement_timeout on the role, which a
// thousand rows and their inboxes can outlast) is tried again at once at half the size, and the
// GC keeps the smaller size until full batches run fast again (shrinking): under a timeout it
// cannot change, it would otherwise fail every sweep and leave the table to grow. It gives up
// (the sweep's error) only below one row.
func (g *GC) machine(ctx context.Context, machine string, retention time.Duration, began time.Time, res *GCResult) (done bool, err error) {
	budget := g.budget()
	var cur store.GCCursor
	for {
		if g.beforeBatch != nil {
			g.beforeBatch(machine, cur)
		}
		t0 := time.Now()
		batch := g.batch.size(g.Batch)
		n, next, err := g.Store.GCInstances(ctx, g.DB, machine, retention, batch, cur)
		if g.batch.shrunk(ctx, err, g.Logger, "GC of finished instances", "machine", machine) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("GC of finished instances of %q: %w", machine, err)
		}
		g.batch.ran(n, g.Logger, "GC of finished instances")
		if g.afterBatch != nil {
			g.afterBatch(machine, n, time.Since(t0))
		}
		res.Instances += n
		res.Batches++
		cur = next
		if n < batch {
			return true, nil
		}
		if time.Since(began) >= budget {
			return false, nil
		}
	}
}

func (g *GC) buckets(ctx context.Context, res *GCResult) error {
	rates := g.Rates
	if rates == nil {
		rates = &store.Rates{}
	}
	for {
		n, err := g.Store.GCBuckets(ctx, g.DB, rates, bucketFullFor)
		if err != nil {
			return fmt.Errorf("GC of rate-limit buckets: %w", err)
		}
		res.Buckets += n
		if n < bucketBatch {
			return nil
		}
	}
}

func (g *GC) gates(ctx context.Context, res *GCResult) error {
	gates := g.Gates
	if gates == nil {
		gates = &store.Gates{}
	}
	repaired, removed, err := g.Store.ReconcileGates(ctx, g.DB, gates)
	if err != nil {
		return fmt.Errorf("reconcile gate counters: %w", err)
	}
	res.Gates += repaired + removed
	return nil
}
