// Package maintenance holds the sweepers every cluster needs at least one node to run: the
// reaper (expired leases, await deadlines, rows written ahead of a clock that stepped back) and
// GC (finished instances, idle rate-limit buckets, gate reconciliation). Duplicates are safe:
// every sweep claims its rows with ordered SKIP LOCKED, so concurrent sweepers never wait on,
// deadlock with or double-process each other.
//
// The split follows what each needs from its cadence. The reaper's work is latency: a crashed
// worker's rows, and timed awaits, wait for it (default every 5s). GC's work is housekeeping
// whose delay costs space, not progress: a finished row kept a minute longer, a refilled bucket
// (a missing bucket is a full one), a gate counter that drifted (the reaper and every outcome
// credit slots themselves; the reconciler is the safety net, and a drift errs on the strict
// side). Moving gate reconciliation and bucket pruning into GC keeps the reaper's sweep short
// and its guarantees unchanged.
package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/spell"
	"github.com/gendurable/gendurable/internal/store"
)

// reapBatch is how many expired claims one statement releases.
const reapBatch = 1000

const (
	// stepBack is how far the database's clock must fall behind its last reading, plus the time
	// passed since, for the reaper to take it for a step back: two readings a sweep apart
	// disagree by a round trip's jitter, never by this.
	stepBack = time.Minute
	// redateSpan is how many instance ids one re-dating statement reads, and redateBudget how
	// long a sweep spends re-dating before it leaves the rest of the walk to the next sweep.
	redateSpan   = 10000
	redateBudget = 2 * time.Second
)

// Reaper releases claims whose lease has expired: their worker died, hung or lost the database.
// A released row is available again (the lost try counts as an attempt) or, with no attempts
// left, failed.
type Reaper struct {
	Store    *store.Store
	DB       store.DB
	Interval time.Duration
	// Timeout bounds one sweep (default 30s): a sweep stuck on a hung connection gives up and
	// the next one starts on a fresh connection.
	Timeout time.Duration
	Logger  *slog.Logger
	Emit    func(durabletype.Event)
	// Wake nudges the local scheduler of a queue that has rows runnable again.
	Wake func(queue string)
	// Rates is the rate-limit configuration of this node, for the report of rows stalled on
	// limits it does not configure; ReportStalls says whether to make it (a node that runs
	// queues: the stall is its own picks').
	Rates        *store.Rates
	ReportStalls bool
	// MaxRecoveries is how many lost claims of one step a release forgives before it fails the
	// instance (ReaperConfig.MaxRecoveries, resolved: at least 1).
	MaxRecoveries int

	// batch and deadlines are the batches of the release and of the await-deadline sweep:
	// reapBatch, or less once the server cancelled one.
	batch, deadlines shrinking
	// failing keeps the log of sweeps failing one after another short.
	failing spell.Log
	// dbNow is the database's clock at the last sweep, and read when this process read it (for
	// time.Since): a later reading far behind their sum is the clock stepping back.
	dbNow, read time.Time
	// redateHi is where the re-dating walk after a step back goes on, down from the highest id
	// (the newest rows, those most likely written ahead of the clock, first); 0: no walk. rewalk:
	// the second walk, due stepBack after stepped (when this process saw the step), is to come;
	// span: the ids a re-dating statement reads.
	redateHi int64
	rewalk   bool
	stepped  time.Time
	span     shrinking
}

// Run sweeps every Interval until stop is closed.
func (r *Reaper) Run(stop <-chan struct{}) {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			timeout := r.Timeout
			if timeout <= 0 {
				timeout = 30 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			began := time.Now()
			// A sweep is idempotent: one whose connection was lost (a restarted database's
			// stale pool connections) runs again at once on another.
			n := 0
			err := store.RetryConnLost(ctx, func() error {
				m, err := r.Sweep(ctx)
				n += m
				return err
			})
			if err != nil {
				r.failing.Failed(r.Logger, "gendurable: reaper sweep failed", "error", err)
				r.Emit(durabletype.Event{Name: durabletype.EventReaperFailed, Duration: time.Since(began), Err: err})
			} else {
				r.failing.Succeeded(r.Logger, "gendurable: reaper sweeps succeed again")
				r.Emit(durabletype.Event{Name: durabletype.EventReaperSwept, Count: n, Duration: time.Since(began)})
			}
			cancel()
		}
	}
}

// Sweep releases every expired claim and fires every due await deadline, a batch per
// statement, reports rows stalled on unknown rate limits, re-dates rows after a step back of the
// database's clock (redate), and returns how many rows it changed.
func (r *Reaper) Sweep(ctx context.Context) (int, error) {
	n, err := r.releaseExpired(ctx)
	if err != nil {
		return n, err
	}
	fired, err := fireAwaitDeadlines(ctx, r.Store, r.DB, 0, r.Emit, r.Wake, &r.deadlines, r.Logger)
	n += fired
	if err != nil {
		return n, err
	}
	if r.ReportStalls {
		rates := r.Rates
		if rates == nil {
			rates = &store.Rates{}
		}
		unknown, err := r.Store.RateUnknown(ctx, r.DB, rates)
		if err != nil {
			return n, err
		}
		for name, count := range unknown {
			r.Logger.Warn("gendurable: runnable rows name a rate limit this node does not configure; they stall",
				"limit", name, "rows", count)
			r.Emit(durabletype.Event{Name: durabletype.EventRateLimitUnknown, Key: name, Count: count})
		}
	}
	redated, err := r.redate(ctx)
	return n + redated, err
}

// redate reads the database's clock and, once it has stepped back by more than stepBack since
// the last sweep (time sync correcting a clock that ran ahead), walks the instances table to make
// due now the runnable rows that were due when written ahead of the new clock
// (Store.RedateFuture): without it, a row that was due at once would wait for as long as the
// clock went back. The walk spends at most redateBudget a sweep and goes on at the next; it runs
// once more stepBack after the step, for the rows of transactions that began before the step
// and committed after the walk had passed them. A node that starts after the step has no
// earlier reading and does not notice it.
func (r *Reaper) redate(ctx context.Context) (int, error) {
	now, maxID, err := r.Store.ReaperClock(ctx, r.DB)
	if err != nil {
		return 0, err
	}
	if !r.dbNow.IsZero() {
		if back := r.dbNow.Add(time.Since(r.read)).Sub(now); back > stepBack {
			r.Logger.Warn("gendurable: the database's clock stepped back; making due the runnable rows written ahead of it",
				"by", back.Round(time.Second), "instances_up_to", maxID)
			r.redateHi, r.rewalk, r.stepped = maxID, true, time.Now()
		}
	}
	r.dbNow, r.read = now, time.Now()
	if r.redateHi == 0 && r.rewalk && time.Since(r.stepped) > stepBack {
		r.redateHi, r.rewalk = maxID, false
	}
	n := 0
	for began := time.Now(); r.redateHi > 0 && time.Since(began) < redateBudget; {
		span := int64(r.span.size(redateSpan))
		lo := max(r.redateHi-span, 0)
		m, queues, err := r.Store.RedateFuture(ctx, r.DB, lo, r.redateHi)
		if r.span.shrunk(ctx, err, r.Logger, "re-dating after a clock step") {
			continue
		}
		if err != nil {
			return n, err
		}
		r.span.ran(int(span), r.Logger, "re-dating after a clock step")
		n += m
		for _, q := range queues {
			r.Wake(q)
		}
		r.redateHi = lo
	}
	return n, nil
}

// FireAwaitDeadlines wakes every parked instance whose await deadline is within horizon of now
// (0: due now), emits await.timeout, and wakes the local schedulers of their queues.
func FireAwaitDeadlines(ctx context.Context, st *store.Store, db store.DB, horizon time.Duration,
	emit func(durabletype.Event), wake func(string)) (int, error) {
	return fireAwaitDeadlines(ctx, st, db, horizon, emit, wake, &shrinking{}, slog.New(slog.DiscardHandler))
}

// fireAwaitDeadlines is FireAwaitDeadlines in batches of batch's size (see shrinking), logging
// to log.
func fireAwaitDeadlines(ctx context.Context, st *store.Store, db store.DB, horizon time.Duration,
	emit func(durabletype.Event), wake func(string), batch *shrinking, log *slog.Logger) (int, error) {
	total := 0
	for {
		size := batch.size(reapBatch)
		rows, err := st.FireAwaitDeadlines(ctx, db, size, horizon)
		if batch.shrunk(ctx, err, log, "firing of await deadlines") {
			continue
		}
		if err != nil {
			return total, err
		}
		batch.ran(len(rows), log, "firing of await deadlines")
		total += len(rows)
		if len(rows) > 0 {
			emit(durabletype.Event{Name: durabletype.EventAwaitTimeout, Count: len(rows)})
			queues := map[string]bool{}
			for _, row := range rows {
				queues[row.Queue] = true
			}
			for q := range queues {
				wake(q)
			}
		}
		if len(rows) < size {
			return total, nil
		}
	}
}

func (r *Reaper) releaseExpired(ctx context.Context) (int, error) {
	total := 0
	for {
		batch := r.batch.size(reapBatch)
		rows, woken, err := r.Store.ReleaseExpired(ctx, r.DB, batch, "", 0, r.MaxRecoveries)
		if r.batch.shrunk(ctx, err, r.Logger, "release of expired claims") {
			continue
		}
		if err != nil {
			return total, err
		}
		r.batch.ran(len(rows), r.Logger, "release of expired claims")
		for _, w := range woken {
			r.Wake(w.Queue)
		}
		total += len(rows)
		if len(rows) > 0 {
			failed := 0
			queues := map[string]bool{}
			for _, row := range rows {
				if row.Status == durabletype.StatusFailed {
					failed++
				} else {
					queues[row.Queue] = true
				}
			}
			r.Logger.Info("gendurable: reaper released expired claims", "rows", len(rows), "failed", failed)
			r.Emit(durabletype.Event{Name: durabletype.EventReaperReclaimed, Count: len(rows), Failed: failed})
			for q := range queues {
				r.Wake(q)
			}
		}
		if len(rows) < batch {
			return total, nil
		}
	}
}
