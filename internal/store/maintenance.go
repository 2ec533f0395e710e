package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Released is a row the reaper or a startup reclaim released.
type Released struct {
	ID      int64
	Queue   string
	Machine string
	Step    string
	Attempt int
	Status  durabletype.Status
}

// ReleaseExpired releases up to limit claims: with prefix empty (the reaper), every claim whose
// lease has run out; otherwise (startup reclaim) only claims of that worker-id prefix, whose
// lease ends before now() + slack. A released claim gives its attempt back and counts a recovery;
// an instance whose step already had maxRecoveries fails.
func (s *Store) ReleaseExpired(ctx context.Context, db DB, limit int, prefix string, slack time.Duration, maxRecoveries int) ([]Released, []Woken, error) {
	var p *string
	if prefix != "" {
		p = &prefix
	}
	// One transaction: the instances it fails and the clearing of their inboxes (which needs a
	// snapshot taken after the release) commit together.
	tx, err := s.BeginOwn(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, s.sql("release_expired"), limit, p, slack.Milliseconds(), int32(maxRecoveries))
	if err != nil {
		return nil, nil, err
	}
	var out []Released
	var woken []Woken
	var failed []int64
	var woke bool
	var r Released
	var attempt int32
	var status string
	if _, err := pgx.ForEachRow(rows, []any{&woke, &r.ID, &r.Queue, &r.Machine, &r.Step, &attempt, &status}, func() error {
		if woke { // a parent whose last child failed here
			woken = append(woken, Woken{ID: r.ID, Queue: r.Queue})
			return nil
		}
		r.Attempt, r.Status = int(attempt), durabletype.Status(status)
		out = append(out, r)
		if r.Status.Terminal() {
			failed = append(failed, r.ID)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if fault.Enabled {
		// The claims are released, their row locks held, nothing committed yet.
		if err := fault.PointFor(fault.ReaperBetweenSelectUpdate, prefix); err != nil {
			return nil, nil, err
		}
	}
	if len(failed) > 0 {
		// Instances that failed here are finished: clear their inboxes, with a fresh snapshot
		// (see purge_terminal_inboxes).
		if _, err := tx.Exec(ctx, s.sql("purge_terminal_inboxes"), failed); err != nil {
			return nil, nil, fmt.Errorf("clear the inboxes of failed instances: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, err
	}
	return out, woken, nil
}

// Fired is an instance whose await deadline woke it.
type Fired struct {
	ID      int64
	Queue   string
	Machine string
	Step    string
}

// FireAwaitDeadlines wakes up to limit parked instances whose deadline is within horizon.
func (s *Store) FireAwaitDeadlines(ctx context.Context, db DB, limit int, horizon time.Duration) ([]Fired, error) {
	rows, err := db.Query(ctx, s.sql("fire_await_deadlines"), limit, horizon.Milliseconds())
	if err != nil {
		return nil, err
	}
	var out []Fired
	var f Fired
	_, err = pgx.ForEachRow(rows, []any{&f.ID, &f.Queue, &f.Machine, &f.Step}, func() error {
		out = append(out, f)
		return nil
	})
	return out, err
}

// DefaultOwnTxIdleTimeout is the Store's OwnTxIdleTimeout when it is not set.
const DefaultOwnTxIdleTimeout = 10 * time.Second

// OwnTxs begins BeginOwn's transactions on DB, for pgx.BeginFunc.
type OwnTxs struct {
	Store *Store
	DB    DB
}

// Begin begins a transaction of the library's own (BeginOwn).
func (o OwnTxs) Begin(ctx context.Context) (pgx.Tx, error) { return o.Store.BeginOwn(ctx, o.DB) }

// BeginOwn begins a transaction of the library's own of several statements (no caller's code runs
// inside it), whose session the server ends if the client stops for longer than OwnTxIdleTimeout
// between two of them (own_tx_settings): the locks it took must not outlive a paused process.
func (s *Store) BeginOwn(ctx context.Context, db DB) (pgx.Tx, error) {
	idle := s.OwnTxIdleTimeout
	if idle <= 0 {
		idle = DefaultOwnTxIdleTimeout
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, s.sql("own_tx_settings"), strconv.FormatInt(idle.Milliseconds(), 10)+"ms"); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// ReconcileGates sets the gate counters that disagree with the executing rows, their leases or
// the configuration right, and removes expired leases (see maintenance.sql), in one transaction; it
// returns how many counters it repaired and removed.
func (s *Store) ReconcileGates(ctx context.Context, db DB, g *Gates) (repaired, removed int, err error) {
	tx, err := s.BeginOwn(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	cfg := pgx.NamedArgs{"g_names": g.Names, "g_limits": g.Limits, "g_shards": g.Shards}
	rows, err := tx.Query(ctx, s.sql("reconcile_gates_lock"), cfg)
	if err != nil {
		return 0, 0, err
	}
	var keys []string
	var shards []int16
	var key string
	var shard int16
	if _, err := pgx.ForEachRow(rows, []any{&key, &shard}, func() error {
		keys, shards = append(keys, key), append(shards, shard)
		return nil
	}); err != nil {
		return 0, 0, err
	}
	if len(keys) == 0 {
		return 0, 0, tx.Commit(ctx)
	}
	cfg["keys"], cfg["shards"] = keys, shards
	rows, err = tx.Query(ctx, s.sql("reconcile_gates_leases"), cfg)
	if err != nil {
		return 0, 0, err
	}
	var xKeys, xOwners []string
	var xShards []int16
	var owner string
	if _, err := pgx.ForEachRow(rows, []any{&key, &shard, &owner}, func() error {
		xKeys, xShards, xOwners = append(xKeys, key), append(xShards, shard), append(xOwners, owner)
		return nil
	}); err != nil {
		return 0, 0, err
	}
	cfg["x_keys"], cfg["x_shards"], cfg["x_owners"] = xKeys, xShards, xOwners
	if fault.Enabled {
		// The counters that look wrong and their expired leases are locked; the repair has not
		// read the truth yet.
		if err := fault.Point(fault.GCBetweenSelectDelete); err != nil {
			return 0, 0, err
		}
	}
	var rep, rem int64
	if err := tx.QueryRow(ctx, s.sql("reconcile_gates_fix"), cfg).Scan(&rep, &rem); err != nil {
		return 0, 0, err
	}
	return int(rep), int(rem), tx.Commit(ctx)
}

// GCBuckets deletes up to 1,000 buckets that have been full for fullFor, by their own rate and
// burst and by r's where r configures their limit.
func (s *Store) GCBuckets(ctx context.Context, db DB, r *Rates, fullFor time.Duration) (int, error) {
	tag, err := db.Exec(ctx, s.sql("gc_buckets"), pgx.NamedArgs{"r_names": r.Names, "r_rates": r.Rates, "r_bursts": r.Bursts,
		"full_ms": fullFor.Milliseconds()})
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// FoldFinishedCounts folds the finished counts into one row per queue and status, and returns how
// many rows it folded.
func (s *Store) FoldFinishedCounts(ctx context.Context, db DB) (int, error) {
	var n int
	err := db.QueryRow(ctx, s.sql("fold_finished_counts")).Scan(&n)
	return n, err
}

// RateUnknown counts the runnable rows stalled on each limit the configuration does not name.
func (s *Store) RateUnknown(ctx context.Context, db DB, r *Rates) (map[string]int, error) {
	rows, err := db.Query(ctx, s.sql("rate_unknown"), pgx.NamedArgs{"r_names": r.Names})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
		out[name] = int(n)
		return nil
	})
	return out, err
}

// GCCursor is where a GC sweep's next batch starts: after the (finalized_at, id) of the last row
// the previous batch deleted. The zero value starts at the beginning.
type GCCursor struct {
	At time.Time
	ID int64
}

// GCInstances deletes up to batch finished instances of machine whose finalized_at is older than
// retention, after cur in (finalized_at, id) order, with their inboxes (see maintenance.sql). It
// returns how many it deleted and the cursor for the next batch.
func (s *Store) GCInstances(ctx context.Context, db DB, machine string, retention time.Duration, batch int, cur GCCursor) (int, GCCursor, error) {
	args := s.GCInstancesArgs(machine, retention, batch, cur)
	var n int64
	var at *time.Time
	var id *int64
	if err := db.QueryRow(ctx, s.sql("gc_instances"), args).Scan(&n, &at, &id); err != nil {
		return 0, cur, err
	}
	if at != nil && id != nil {
		cur = GCCursor{At: *at, ID: *id}
	}
	return int(n), cur, nil
}

// GCInstancesArgs are the arguments of one GC batch (GCInstances; tests EXPLAIN the statement
// with them).
func (s *Store) GCInstancesArgs(machine string, retention time.Duration, batch int, cur GCCursor) pgx.NamedArgs {
	args := pgx.NamedArgs{"machine": machine, "retention_ms": retention.Milliseconds(), "batch": batch,
		"after_at": pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, "after_id": int64(0)}
	if !cur.At.IsZero() {
		args["after_at"], args["after_id"] = cur.At, cur.ID
	}
	return args
}

// GCMachines lists the machines that have finished instances (gc_machines).
func (s *Store) GCMachines(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, s.sql("gc_machines"))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Retentions returns the retention each machine declares (retention_list); a machine not in it
// keeps the GC's default.
func (s *Store) Retentions(ctx context.Context, db DB) (map[string]time.Duration, error) {
	rows, err := db.Query(ctx, s.sql("retention_list"))
	if err != nil {
		return nil, err
	}
	out := map[string]time.Duration{}
	var m string
	var ms int64
	_, err = pgx.ForEachRow(rows, []any{&m, &ms}, func() error {
		out[m] = time.Duration(ms) * time.Millisecond
		return nil
	})
	return out, err
}

// SetRetentions records the retentions of a client's machines (retention_set): a machine with a
// positive retention declares it, one with zero keeps the default (its row goes). by names the
// client.
func (s *Store) SetRetentions(ctx context.Context, db DB, retentions map[string]time.Duration, by string) error {
	set, ms, unset := []string{}, []int64{}, []string{}
	for m, r := range retentions {
		if r > 0 {
			set, ms = append(set, m), append(ms, r.Milliseconds())
		} else {
			unset = append(unset, m)
		}
	}
	_, err := db.Exec(ctx, s.sql("retention_set"), pgx.NamedArgs{"set": set, "ms": ms, "unset": unset, "by": by})
	return err
}

// ReaperClock returns the database's clock and the highest instance id (reaper_clock).
func (s *Store) ReaperClock(ctx context.Context, db DB) (now time.Time, maxID int64, err error) {
	err = db.QueryRow(ctx, s.sql("reaper_clock")).Scan(&now, &maxID)
	return now, maxID, err
}

// RedateFuture makes due now the runnable rows with ids in (after, upto] that were due when
// last written and were written more than a minute ahead of the database's clock, which has
// stepped back since (redate_future). It returns how many it re-dated and their queues.
func (s *Store) RedateFuture(ctx context.Context, db DB, after, upto int64) (int, []string, error) {
	rows, err := db.Query(ctx, s.sql("redate_future"), pgx.NamedArgs{"after": after, "upto": upto})
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var queues []string
	var queue string
	_, err = pgx.ForEachRow(rows, []any{&queue}, func() error {
		n++
		if !slices.Contains(queues, queue) {
			queues = append(queues, queue)
		}
		return nil
	})
	return n, queues, err
}
