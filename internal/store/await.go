package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// Probe is one answer of the await probe: the row of a settled instance, or Missing.
type Probe struct {
	ID       int64
	Missing  bool
	Instance *durabletype.Instance
}

// AwaitProbe reads, in one statement, the instances among ids that have settled (terminal, or
// parked when parked[i] says that counts for ids[i]) or that whole[i] wants whatever their
// status; ids that do not exist come back Missing.
func (s *Store) AwaitProbe(ctx context.Context, db DB, ids []int64, parked, whole []bool) ([]Probe, error) {
	rows, err := db.Query(ctx, s.sql("await_probe"), ids, parked, whole)
	if err != nil {
		return nil, err
	}
	return s.scanProbes(rows)
}

// scanProbes reads await_probe's rows and closes them.
func (s *Store) scanProbes(rows pgx.Rows) ([]Probe, error) {
	defer rows.Close()
	var out []Probe
	for rows.Next() {
		var want int64
		in, err := scanInstance(rows, []any{&want})
		if err != nil {
			return nil, err
		}
		if in == nil {
			out = append(out, Probe{ID: want, Missing: true})
			continue
		}
		s.openInstance(in)
		out = append(out, Probe{ID: want, Instance: in})
	}
	return out, rows.Err()
}

// scanInstance scans the instance columns every inspection statement selects in the same order
// (see get_instance), between the destinations lead and trail of the statement's other columns.
// A NULL row (an outer join's miss) returns a nil instance.
func scanInstance(row pgx.Row, lead []any, trail ...any) (*durabletype.Instance, error) {
	var in durabletype.Instance
	var id *int64
	var machine, step, queue, status, lockedBy, key *string
	var priority *int16
	var attempt, maxAttempts, recoveries *int32
	var errs, upgrades []byte
	var version *int32
	var scheduled, inserted, updated *time.Time
	dest := append(lead, &id, &machine, &step, &queue, &status, &priority, &attempt, &maxAttempts, &recoveries, &scheduled,
		&lockedBy, &in.LockedUntil, &in.State, &in.Result, &errs, &key, &in.AwaitNames, &in.AwaitDeadline,
		&in.ParentID, &inserted, &updated, &in.FinalizedAt, &in.Path, &version, &upgrades)
	dest = append(dest, trail...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	if id == nil {
		return nil, nil
	}
	in.ID, in.Machine, in.Step, in.Queue = *id, *machine, *step, *queue
	in.Status, in.Priority = durabletype.Status(*status), int(*priority)
	in.Attempt, in.MaxAttempts, in.Recoveries = int(*attempt), int(*maxAttempts), int(*recoveries)
	in.LockedBy, in.CorrelationKey = *lockedBy, *key
	in.ScheduledAt, in.InsertedAt, in.UpdatedAt = *scheduled, *inserted, *updated
	in.MachineVersion = int(*version)
	if len(errs) > 0 {
		if err := json.Unmarshal(errs, &in.Errors); err != nil {
			return nil, fmt.Errorf("decode error history of %d: %w", in.ID, err)
		}
	}
	if len(upgrades) > 0 {
		if err := json.Unmarshal(upgrades, &in.Upgrades); err != nil {
			return nil, fmt.Errorf("decode upgrade history of %d: %w", in.ID, err)
		}
	}
	return &in, nil
}
