package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// Pause kinds: what a row of the pauses table pauses.
const (
	PauseQueue   = "queue"
	PauseMachine = "machine"
)

// PauseRow is a paused queue or machine.
type PauseRow struct {
	Kind, Name, Reason, By string
	At                     time.Time
}

// SetPause pauses a queue or a machine (kind PauseQueue or PauseMachine); it reports whether
// this call paused it (false: it was paused already).
func (s *Store) SetPause(ctx context.Context, db DB, kind, name, reason, by string) (bool, error) {
	var fresh bool
	err := db.QueryRow(ctx, s.sql("pause_set"), pgx.NamedArgs{"kind": kind, "name": name, "reason": reason, "by": by}).Scan(&fresh)
	return fresh, err
}

// ClearPause resumes a queue or a machine; it reports whether it was paused.
func (s *Store) ClearPause(ctx context.Context, db DB, kind, name string) (bool, error) {
	var got string
	err := db.QueryRow(ctx, s.sql("pause_clear"), pgx.NamedArgs{"kind": kind, "name": name}).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Pauses lists the paused queues and machines, by kind and name.
func (s *Store) Pauses(ctx context.Context, db DB) ([]PauseRow, error) {
	rows, err := db.Query(ctx, s.sql("pauses_list"))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PauseRow, error) {
		var p PauseRow
		err := r.Scan(&p.Kind, &p.Name, &p.Reason, &p.By, &p.At)
		return p, err
	})
}

// InstancePaused is what pausing or resuming an instance found.
type InstancePaused struct {
	Status durabletype.Status
	Queue  string
	// Was says the instance was paused before the call.
	Was bool
}

// PauseInstance pauses a live instance (paused is true) or resumes an instance (false).
// ErrNotFound if there is no such instance; pausing a finished one is ErrWrongStatus.
func (s *Store) PauseInstance(ctx context.Context, db DB, id int64, paused bool) (InstancePaused, error) {
	stmt := "instance_resume"
	if paused {
		stmt = "instance_pause"
	}
	var out InstancePaused
	var status string
	err := db.QueryRow(ctx, s.sql(stmt), pgx.NamedArgs{"id": id}).Scan(&status, &out.Queue, &out.Was)
	if errors.Is(err, pgx.ErrNoRows) {
		err = db.QueryRow(ctx, s.sql("instance_status"), pgx.NamedArgs{"id": id}).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return out, fmt.Errorf("%w: id %d", durabletype.ErrNotFound, id)
		}
		if err != nil {
			return out, err
		}
		return out, fmt.Errorf("%w: instance %d is %s; only a live instance can be paused", durabletype.ErrWrongStatus, id, status)
	}
	out.Status = durabletype.Status(status)
	return out, err
}

// RegisteredNames returns the queues and machines that some node registered, live or not.
func (s *Store) RegisteredNames(ctx context.Context, db DB) (queues, machines []string, err error) {
	err = db.QueryRow(ctx, s.sql("registered_names")).Scan(&queues, &machines)
	return queues, machines, err
}

// QueueHasRows reports whether a queue holds available rows or ever finished one.
func (s *Store) QueueHasRows(ctx context.Context, db DB, queue string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, s.sql("queue_has_rows"), pgx.NamedArgs{"queue": queue}).Scan(&ok)
	return ok, err
}
