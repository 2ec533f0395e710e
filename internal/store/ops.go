package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// OpRow is an instance as an operator action found it (locked).
type OpRow struct {
	Status  durabletype.Status
	Machine string
	Step    string
	Queue   string
	Key     *string
	Shard   *int16
	Parent  *int64
	// ParentStatus is the parent's status ("" without a parent, or if it is gone).
	ParentStatus durabletype.Status
}

// Cancelled is what a cancel changed.
type Cancelled struct {
	Was OpRow
	// Woke is the queue of a parent the cancel made runnable ("" if none).
	Woke string
}

// lockOp locks the instance and reads it; ErrNotFound if there is none.
func (s *Store) lockOp(ctx context.Context, tx pgx.Tx, id int64) (OpRow, error) {
	var r OpRow
	var status string
	var parent *string
	err := tx.QueryRow(ctx, s.sql("op_lock"), id).Scan(&status, &r.Machine, &r.Step, &r.Queue, &r.Key, &r.Shard,
		&r.Parent, &parent)
	if parent != nil {
		r.ParentStatus = durabletype.Status(*parent)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: id %d", durabletype.ErrNotFound, id)
	}
	r.Status = durabletype.Status(status)
	return r, err
}

// Cancel makes a live instance terminal (cancelled), in tx: its claim, gate slot and inbox go,
// and a parent waiting on it settles. A finished instance is left alone: ErrWrongStatus.
func (s *Store) Cancel(ctx context.Context, tx pgx.Tx, id int64, reason string) (Cancelled, error) {
	row, err := s.lockOp(ctx, tx, id)
	if err != nil {
		return Cancelled{}, err
	}
	out := Cancelled{Was: row}
	if row.Status.Terminal() {
		return out, fmt.Errorf("%w: instance %d is already %s", durabletype.ErrWrongStatus, id, row.Status)
	}
	if _, err := tx.Exec(ctx, s.sql("op_cancel"), id, storableText(reason)); err != nil {
		return out, err
	}
	if row.Status == durabletype.StatusExecuting && row.Shard != nil {
		if _, err := tx.Exec(ctx, s.sql("op_credit"), *row.Key, *row.Shard); err != nil {
			return out, err
		}
	}
	if row.Parent != nil {
		var queue string
		var woke bool
		err := tx.QueryRow(ctx, s.sql("op_settle"), *row.Parent).Scan(&queue, &woke)
		switch {
		case errors.Is(err, pgx.ErrNoRows): // the parent is not joining: nobody to settle
		case err != nil:
			return out, err
		case woke:
			out.Woke = queue
		}
	}
	if _, err := tx.Exec(ctx, s.sql("op_purge_inbox"), id); err != nil {
		return out, err
	}
	return out, nil
}

// Retry makes a failed or cancelled instance runnable again at step (keeping its state and
// history), in tx; step "" keeps the step it stopped at. check, if given, vets the row first.
func (s *Store) Retry(ctx context.Context, tx pgx.Tx, id int64, step string, check func(OpRow) error) (OpRow, error) {
	row, err := s.lockOp(ctx, tx, id)
	if err != nil {
		return row, err
	}
	if row.Status != durabletype.StatusFailed && row.Status != durabletype.StatusCancelled {
		return row, fmt.Errorf("%w: instance %d is %s; only failed or cancelled instances can be retried",
			durabletype.ErrWrongStatus, id, row.Status)
	}
	if check != nil {
		if err := check(row); err != nil {
			return row, err
		}
	}
	if step == "" {
		step = row.Step
	}
	var live int64
	if err := tx.QueryRow(ctx, s.sql("op_live_children"), id).Scan(&live); err != nil {
		return row, err
	}
	if live > 0 {
		return row, fmt.Errorf("%w: instance %d has %d children still live, which its join would read unfinished; retry it once they have finished, or cancel them first",
			durabletype.ErrWrongStatus, id, live)
	}
	var holder int64
	err = tx.QueryRow(ctx, s.sql("op_key_holder"), id).Scan(&holder)
	switch {
	case err == nil:
		return row, fmt.Errorf("%w: instance %d's correlation key is held by the live instance %d (inserted after it finished)",
			durabletype.ErrWrongStatus, id, holder)
	case !errors.Is(err, pgx.ErrNoRows):
		return row, err
	}
	if _, err := tx.Exec(ctx, s.sql("op_retry"), id, step); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "instances_correlation_live" {
			// A live instance took the key after the check above.
			return row, fmt.Errorf("%w: instance %d's correlation key is held by a live instance", durabletype.ErrWrongStatus, id)
		}
		return row, err
	}
	row.Step = step
	return row, nil
}
