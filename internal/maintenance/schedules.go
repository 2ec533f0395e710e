package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/schedule"
	"github.com/gendurable/gendurable/internal/spell"
	"github.com/gendurable/gendurable/internal/store"
)

const (
	// fireBatch is how many due schedules one transaction fires.
	fireBatch = 100
	// maxFires bounds the fire times one schedule fires in one round (a long catch-up window);
	// the rest stay due for the next round.
	maxFires = 100
	// fireRetry is how long a schedule that failed to fire waits before it is tried again.
	fireRetry = 5 * time.Second
	// fireWait bounds the firing loop's sleep: schedules added or changed by other nodes are
	// seen within it.
	fireWait = time.Second
	// fireBusy is the loop's sleep when due schedules are held by another node's round.
	fireBusy = 20 * time.Millisecond
)

// Firer fires due schedules: every node that runs it claims due schedule rows with SKIP LOCKED,
// inserts one instance per fire time (keyed by schedule and fire time) and advances the row in
// the same transaction. No leader: two nodes never fire one fire time, and a node that dies
// mid-round leaves its rows due for the next.
type Firer struct {
	Store  *store.Store
	DB     store.DB
	Logger *slog.Logger
	Emit   func(durabletype.Event)
	// Poke announces runnable rows in queues (local schedulers and other nodes).
	Poke func(queues ...string)
	// Cancelled reports, after the commit, an instance an overlap policy of cancel cancelled:
	// the same follow-up as an operator's cancel (its running step stopped, its event, its
	// parent's queue poked).
	Cancelled func(id int64, c store.Cancelled)
	// Timeout bounds one transaction (default 30s).
	Timeout time.Duration
	kick    chan struct{}
	specs   map[specKey]*schedule.Spec
	// failing keeps the log of rounds failing one after another short.
	failing spell.Log
}

type specKey struct {
	cron  string
	every time.Duration
	tz    string
}

// NewFirer returns a firer; set its fields before Run.
func NewFirer() *Firer {
	return &Firer{kick: make(chan struct{}, 1), specs: map[specKey]*schedule.Spec{}}
}

// Kick makes the loop look for due schedules now (a schedule was added or changed here).
func (f *Firer) Kick() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Run fires due schedules until stop is closed, sleeping until the next one is due (at most a
// second, so that schedules changed by other nodes are seen).
func (f *Firer) Run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	for {
		wait := f.round(ctx)
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-f.kick:
			t.Stop()
		case <-t.C:
		}
	}
}

// round fires what is due and returns how long to sleep. It reads the next due time first (one
// index read), so that a node with nothing due spends one round trip per round.
func (f *Firer) round(ctx context.Context) time.Duration {
	tctx, cancel := context.WithTimeout(ctx, f.timeout())
	next, now, err := f.Store.NextScheduleDue(tctx, f.DB)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			f.failing.Failed(f.Logger, "gendurable: reading the next schedule due failed", "error", err)
		}
		return fireWait
	}
	if next == nil || next.After(now) {
		f.failing.Succeeded(f.Logger, "gendurable: schedules are read and fired again")
		if next == nil {
			return fireWait
		}
		return min(next.Sub(now), fireWait)
	}
	claimed, err := f.FireDue(ctx)
	if err != nil {
		if ctx.Err() == nil {
			f.failing.Failed(f.Logger, "gendurable: firing schedules failed", "error", err)
		}
		return fireWait
	}
	f.failing.Succeeded(f.Logger, "gendurable: schedules are read and fired again")
	if claimed == 0 {
		return fireBusy // due, but held by another node's round
	}
	return 0 // look again at once: firing takes time, and more may be due by now
}

func (f *Firer) timeout() time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return 30 * time.Second
}

// FireDue fires every schedule due now, a batch per transaction, and returns how many
// schedules it claimed.
func (f *Firer) FireDue(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := f.fireBatch(ctx, "")
		total += n
		if err != nil || n < fireBatch {
			return total, err
		}
	}
}

// fired is one schedule's part of a round, reported after the commit.
type fired struct {
	due      *store.DueSchedule
	rows     []int // indexes into the round's inserts
	lastFire time.Time
	skipped  map[string]int
}

// fireBatch fires a batch of due schedules in one transaction (only the one named only, when
// only is not "").
func (f *Firer) fireBatch(ctx context.Context, only string) (int, error) {
	tctx, cancel := context.WithTimeout(ctx, f.timeout())
	defer cancel()
	tx, err := f.DB.Begin(tctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(tctx) }()
	now, due, err := f.Store.ClaimSchedules(tctx, tx, fireBatch, only)
	if err != nil || len(due) == 0 {
		return 0, err
	}
	var rows []store.InsertRow
	var cancels []int64
	plans := make([]fired, 0, len(due))
	adv := make([]store.ScheduleAdvance, 0, len(due))
	var broken []error
	var brokenAt []int
	for i := range due {
		d := &due[i]
		spec, err := f.spec(d)
		if err != nil {
			// Left as it is, and marked failed after the commit: its fire times stay due.
			broken, brokenAt = append(broken, err), append(brokenAt, i)
			continue
		}
		plans = append(plans, fired{due: d})
		p := &plans[len(plans)-1]
		adv = append(adv, store.ScheduleAdvance{Name: d.Name})
		i := len(adv) - 1
		c := spec.Due(d.NextFireAt, now, d.CatchUp, maxFires)
		adv[i].Next = c.Next
		p.skipped = map[string]int{}
		if c.Skipped > 0 {
			p.skipped["catch-up"] = c.Skipped
			report, _ := json.Marshal(map[string]any{"reason": "catch-up", "count": c.Skipped, "capped": c.Capped,
				"first": c.FirstSkipped, "last": c.LastSkipped, "at": now})
			adv[i].SkipReport = report
		}
		fire := c.Fire
		live := d.LastStatus != "" && !durabletype.Status(d.LastStatus).Terminal()
		switch d.Overlap {
		case "skip":
			// At most one live instance: the first fire when the last one has finished.
			if live {
				fire = nil
			} else if len(fire) > 1 {
				fire = fire[:1]
			}
		case "cancel":
			// The newest fire time only; the live instance before it is cancelled.
			if len(fire) > 0 {
				fire = fire[len(fire)-1:]
				if live && d.LastInstanceID > 0 {
					cancels = append(cancels, d.LastInstanceID)
				}
			}
		}
		if n := len(c.Fire) - len(fire); n > 0 {
			p.skipped["overlap"] = n
			report, _ := json.Marshal(map[string]any{"reason": "overlap", "count": n, "first": c.Fire[0],
				"last": c.Fire[len(c.Fire)-1], "at": now})
			adv[i].SkipReport = report
		}
		adv[i].Skipped = len(c.Fire) - len(fire) + c.Skipped
		for _, at := range fire {
			run := at.Add(schedule.Jitter(d.Name, at, d.Jitter))
			r := d.Input.Row(d.Machine, &run)
			r.CorrelationKey = FireKey(d.Name, at)
			r.ScopeMask = 7 // finished instances too: one instance per fire time
			p.rows = append(p.rows, len(rows))
			rows = append(rows, r)
			p.lastFire = at
		}
	}
	cancelled := make(map[int64]store.Cancelled, len(cancels))
	for _, id := range cancels {
		c, err := f.Store.Cancel(tctx, tx, id, "superseded by a newer fire of its schedule")
		switch {
		case err == nil:
			cancelled[id] = c
		case !errors.Is(err, durabletype.ErrWrongStatus):
			return 0, fmt.Errorf("cancel instance %d of a schedule: %w", id, err)
		}
	}
	var ids []store.Inserted
	if len(rows) > 0 {
		if ids, err = f.Store.InsertMany(tctx, tx, rows); err != nil {
			_ = tx.Rollback(tctx)
			return f.isolate(ctx, due, only, fmt.Errorf("insert the fired instances: %w", err))
		}
	}
	for i := range plans { // plans and adv are parallel
		p := &plans[i]
		adv[i].Fired = len(p.rows)
		if len(p.rows) > 0 {
			last := ids[p.rows[len(p.rows)-1]].ID
			at := p.lastFire
			adv[i].LastFire, adv[i].LastID = &at, &last
		}
	}
	if len(adv) > 0 {
		if err := f.Store.AdvanceSchedules(tctx, tx, adv); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(tctx); err != nil {
		return 0, err
	}
	f.report(plans, rows, ids, now)
	if f.Cancelled != nil {
		for id, c := range cancelled {
			f.Cancelled(id, c)
		}
	}
	for j, i := range brokenAt {
		f.failed(ctx, &due[i], broken[j])
	}
	return len(due), nil
}

// isolate handles a batch whose insert failed (its transaction rolled back: nothing of it was
// committed): each schedule is fired again in a transaction of its own, and one that fails alone
// is marked failed, so that one bad schedule never holds back the others.
func (f *Firer) isolate(ctx context.Context, due []store.DueSchedule, only string, cause error) (int, error) {
	if only != "" {
		f.failed(ctx, &due[0], cause)
		return 1, nil
	}
	for i := range due {
		if _, err := f.fireBatch(ctx, due[i].Name); err != nil {
			return len(due), err
		}
	}
	return len(due), nil
}

func (f *Firer) failed(ctx context.Context, d *store.DueSchedule, cause error) {
	f.Logger.Warn("gendurable: a schedule failed to fire", "schedule", d.Name, "error", cause)
	f.Emit(durabletype.Event{Name: durabletype.EventScheduleFailed, Schedule: d.Name, Machine: d.Machine, Err: cause})
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout())
	defer cancel()
	if err := f.Store.ScheduleFailed(fctx, f.DB, d.Name, cause, fireRetry); err != nil {
		f.Logger.Warn("gendurable: recording a schedule's failure failed", "schedule", d.Name, "error", err)
	}
}

// report emits a committed round's events and pokes the queues of its runnable instances; now is
// the round's database clock.
func (f *Firer) report(plans []fired, rows []store.InsertRow, ids []store.Inserted, now store.DBTime) {
	var queues []string
	seen := map[string]bool{}
	for i := range plans {
		p := &plans[i]
		for reason, n := range p.skipped {
			f.Emit(durabletype.Event{Name: durabletype.EventScheduleSkipped, Schedule: p.due.Name, Machine: p.due.Machine,
				Reason: reason, Count: n})
		}
		if len(p.rows) == 0 {
			continue
		}
		last := p.rows[len(p.rows)-1]
		f.Emit(durabletype.Event{Name: durabletype.EventScheduleFired, Schedule: p.due.Name, Machine: p.due.Machine,
			Queue: rows[last].Queue, InstanceID: ids[last].ID, Count: len(p.rows), Duration: time.Since(p.lastFire)})
		for _, j := range p.rows {
			if q := rows[j].Queue; !seen[q] && !rows[j].ScheduledAt.After(now) {
				seen[q] = true
				queues = append(queues, q)
			}
		}
	}
	if len(queues) > 0 && f.Poke != nil {
		f.Poke(queues...)
	}
}

func (f *Firer) spec(d *store.DueSchedule) (*schedule.Spec, error) {
	k := specKey{d.Cron, d.Every, d.TimeZone}
	if s, ok := f.specs[k]; ok {
		return s, nil
	}
	s, err := schedule.Parse(d.Cron, d.Every, d.TimeZone)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", d.Name, err)
	}
	if len(f.specs) > 10_000 {
		clear(f.specs)
	}
	f.specs[k] = s
	return s, nil
}

// FireKey is the correlation key of the instance a schedule fires at a fire time.
func FireKey(name string, at store.DBTime) string {
	return "schedule/" + name + "/" + at.UTC().Format(time.RFC3339Nano)
}
