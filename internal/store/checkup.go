package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// CheckupFacts is what the checkup's statements read (checkup.sql); the caller judges them.
type CheckupFacts struct {
	Tables  []TableVacuum
	Horizon []HorizonHolder
	// Prepared are this database's old prepared transactions; Slots the server's idle
	// replication slots that keep too much WAL or hold the horizon.
	Prepared []PreparedXact
	Slots    []IdleSlot
	Invalid  []InvalidIndex
	Waits    []LockWait
	// Connections are the server's client connections in use, of Accepted.
	Connections, Accepted int
	// NotifyQueue is the share of the server's NOTIFY queue in use.
	NotifyQueue float64
	// Role and Database are the checkup's, each with its connections in use and its CONNECTION
	// LIMIT (-1: none); a Superuser is held to neither.
	Role, Database                     string
	Superuser                          bool
	RoleLimit, RoleConnections         int
	DatabaseLimit, DatabaseConnections int
	// Rows is nil when the instances table stayed locked for the checkup's lock timeout.
	Rows *CheckupRows
}

// TableVacuum is one churning table's vacuum state.
type TableVacuum struct {
	Table                             string
	ServerAutovacuum, TableAutovacuum bool
	Live, Dead                        int64
	SinceVacuum                       *time.Duration // since a vacuum last ended; nil: never since the statistics were reset
}

// HorizonHolder is a session that holds the database's xmin horizon back.
type HorizonHolder struct {
	PID        int32
	App, State string
	Age        time.Duration // since its transaction began
}

// PreparedXact is a prepared transaction nothing has committed or rolled back.
type PreparedXact struct {
	GID, Owner string
	Age        time.Duration // since it was prepared
	Locked     []string      // the schema's tables it holds a lock on
}

// IdleSlot is a replication slot nothing is connected to, the WAL it keeps and the horizon it
// holds.
type IdleSlot struct {
	Name, Type, Database string // Database is empty for a physical slot
	Kept                 int64  // bytes of WAL from its restart_lsn on
	OverWAL              bool   // Kept passes the checkup's limit
	HoldsXmin            bool   // it holds the xmin horizon back
	XminAge              int64  // how many transactions old its xmin is
}

// CheckupLimits are the thresholds of the facts Checkup reads: horizon holders and prepared
// transactions older than Old, lock waits longer than Wait, leases and await deadlines more
// than Grace past, nodes seen within Live, idle slots keeping more than SlotWAL bytes.
type CheckupLimits struct {
	Old, Wait, Grace, Live time.Duration
	SlotWAL                int64
}

// InvalidIndex is an index that a failed concurrent build left invalid.
type InvalidIndex struct{ Index, Table string }

// LockWait is a session waiting for a lock on one of the schema's tables, or on a row of one
// (Row).
type LockWait struct {
	PID              int32
	App, Table, Mode string
	Row              bool
	Waited           time.Duration
	BlockedBy        []int32
}

// CheckupRows is what the checkup read from the instances and nodes tables.
type CheckupRows struct {
	// ExpiredLeases and OverdueAwaits are the rows past their lease or await deadline by more
	// than the grace, each counted up to CheckupCap.
	ExpiredLeases, OverdueAwaits int64
	// DueQueues have rows due now; WorkedQueues are worked by a live node.
	DueQueues, WorkedQueues []string
}

// CheckupCap is where the checkup stops counting expired leases and overdue awaits.
const CheckupCap = 10_000

// checkupLockTimeout bounds the checkup's wait for the instances table.
const checkupLockTimeout = "1s"

// Checkup reads the facts the checkup judges, within lim, in two round trips: the statistics and
// catalog reads as one batch, then checkup_rows in a transaction of its own with a lock_timeout.
func (s *Store) Checkup(ctx context.Context, db DB, lim CheckupLimits) (CheckupFacts, error) {
	var f CheckupFacts
	b := &pgx.Batch{}
	// rowsOf queues statement name, whose rows collect reads, wrapping its error in what.
	rowsOf := func(what, name string, collect func(pgx.Rows) error, args ...any) {
		b.Queue(s.sql(name), args...).Query(func(rows pgx.Rows) error {
			if err := collect(rows); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		})
	}
	rowsOf("vacuum", "checkup_vacuum", func(rows pgx.Rows) (err error) {
		f.Tables, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TableVacuum, error) {
			var t TableVacuum
			var since *float64
			err := r.Scan(&t.Table, &t.ServerAutovacuum, &t.TableAutovacuum, &t.Live, &t.Dead, &since)
			if since != nil {
				d := seconds(*since)
				t.SinceVacuum = &d
			}
			return t, err
		})
		return err
	}, s.Schema)
	rowsOf("horizon", "checkup_horizon", func(rows pgx.Rows) (err error) {
		f.Horizon, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (HorizonHolder, error) {
			var h HorizonHolder
			var age float64
			err := r.Scan(&h.PID, &h.App, &h.State, &age)
			h.Age = seconds(age)
			return h, err
		})
		return err
	}, lim.Old.Seconds())
	rowsOf("prepared transactions", "checkup_prepared", func(rows pgx.Rows) (err error) {
		f.Prepared, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (PreparedXact, error) {
			var p PreparedXact
			var age float64
			err := r.Scan(&p.GID, &p.Owner, &age, &p.Locked)
			p.Age = seconds(age)
			return p, err
		})
		return err
	}, s.Schema, lim.Old.Seconds())
	rowsOf("replication slots", "checkup_slots", func(rows pgx.Rows) (err error) {
		f.Slots, err = pgx.CollectRows(rows, pgx.RowToStructByPos[IdleSlot])
		return err
	}, lim.SlotWAL)
	b.Queue(s.sql("checkup_connections")).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&f.Connections, &f.Accepted, &f.NotifyQueue, &f.Role, &f.Superuser, &f.RoleLimit,
			&f.RoleConnections, &f.Database, &f.DatabaseLimit, &f.DatabaseConnections); err != nil {
			return fmt.Errorf("connections: %w", err)
		}
		return nil
	})
	rowsOf("indexes", "checkup_invalid_indexes", func(rows pgx.Rows) (err error) {
		f.Invalid, err = pgx.CollectRows(rows, pgx.RowToStructByPos[InvalidIndex])
		return err
	}, s.Schema)
	rowsOf("lock waits", "checkup_lock_waits", func(rows pgx.Rows) (err error) {
		f.Waits, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LockWait, error) {
			var w LockWait
			var waited float64
			err := r.Scan(&w.PID, &w.App, &w.Table, &w.Mode, &w.Row, &waited, &w.BlockedBy)
			w.Waited = seconds(waited)
			return w, err
		})
		return err
	}, s.Schema, lim.Wait.Seconds())
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return f, err
	}
	var cr CheckupRows
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_catalog.set_config('lock_timeout', $1, true)", checkupLockTimeout); err != nil {
			return err
		}
		return tx.QueryRow(ctx, s.sql("checkup_rows"), lim.Grace.Seconds(), lim.Live.Seconds(), CheckupCap).
			Scan(&cr.ExpiredLeases, &cr.OverdueAwaits, &cr.DueQueues, &cr.WorkedQueues)
	})
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgLockNotAvailable {
		return f, nil // the table is locked: the lock waits say by whom
	}
	if err != nil {
		return f, fmt.Errorf("rows: %w", err)
	}
	f.Rows = &cr
	return f, nil
}

// seconds is a count of seconds the database computed, as a Duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
