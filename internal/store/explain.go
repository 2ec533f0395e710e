package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// ExplainRow is what Explain reads of an instance (explain_row).
type ExplainRow struct {
	Status                    durabletype.Status
	Queue, Machine, Step      string
	Priority                  int16
	ScheduledAt               time.Time
	Attempt                   int32
	LastError                 *string
	LastErrorAttempt          int32
	AwaitNames                []string
	AwaitDeadline             *time.Time
	PendingChildren           int32
	SpawnWave                 *int32
	LockedBy                  string
	LockedUntil               *time.Time
	UpdatedAt                 time.Time
	PausedAt                  *time.Time
	ConcurrencyKey, RateLimit *string
	Weight                    int32
	MachineVersion            int32
	Now                       time.Time
	// The pauses of its queue and its machine: reason and time (nil time: not paused).
	QueuePauseReason, MachinePauseReason *string
	QueuePauseAt, MachinePauseAt         *time.Time
	ChildrenLeft                         int64
	Children                             []int64
	GateHeld, GateCapacity, GateN        int64
	GateHolders                          []int64
	Bucket                               *[3]float64 // tokens now, rate, burst; nil: no bucket row
	Ahead, AheadOtherKeys                int64
	FairKey                              *string
}

// TxBeginner begins transactions with options (a pool).
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Explain reads, in one snapshot, what tells why instance id is not running: the row, its pauses,
// and as its status calls for, its children, its concurrency key, its bucket, the rows ahead of
// it. ErrNotFound if there is no such instance.
func (s *Store) Explain(ctx context.Context, db TxBeginner, id int64) (*ExplainRow, error) {
	var r ExplainRow
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, s.sql("explain_row"), pgx.NamedArgs{"id": id}).Scan(&status, &r.Queue, &r.Machine, &r.Step,
			&r.Priority, &r.ScheduledAt, &r.Attempt, &r.LastError, &r.LastErrorAttempt, &r.AwaitNames, &r.AwaitDeadline,
			&r.PendingChildren, &r.SpawnWave, &r.LockedBy, &r.LockedUntil, &r.UpdatedAt, &r.PausedAt, &r.ConcurrencyKey,
			&r.RateLimit, &r.Weight, &r.MachineVersion, &r.FairKey, &r.Now, &r.QueuePauseReason, &r.QueuePauseAt,
			&r.MachinePauseReason, &r.MachinePauseAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: id %d", durabletype.ErrNotFound, id)
		}
		if err != nil {
			return err
		}
		r.Status = durabletype.Status(status)
		if r.LastError != nil {
			o := opener{s: s}
			o.text(r.LastError) // unopened, it stays as stored
		}
		if r.Status == durabletype.StatusJoining && r.SpawnWave != nil {
			if err := tx.QueryRow(ctx, s.sql("explain_children"), pgx.NamedArgs{"id": id, "wave": *r.SpawnWave}).
				Scan(&r.ChildrenLeft, &r.Children); err != nil {
				return err
			}
		}
		if r.Status != durabletype.StatusAvailable {
			return nil
		}
		if r.ConcurrencyKey != nil {
			if err := tx.QueryRow(ctx, s.sql("explain_gate"), pgx.NamedArgs{"key": *r.ConcurrencyKey}).
				Scan(&r.GateHeld, &r.GateCapacity, &r.GateN, &r.GateHolders); err != nil {
				return err
			}
		}
		if r.RateLimit != nil {
			var b [3]float64
			err := tx.QueryRow(ctx, s.sql("explain_bucket"), pgx.NamedArgs{"key": *r.RateLimit}).Scan(&b[0], &b[1], &b[2])
			if err == nil {
				r.Bucket = &b
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return tx.QueryRow(ctx, s.sql("explain_ahead"), pgx.NamedArgs{"id": id}).Scan(&r.Ahead, &r.AheadOtherKeys)
	})
	if err != nil {
		return nil, err
	}
	return &r, nil
}
