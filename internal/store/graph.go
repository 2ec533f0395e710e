package store

import (
	"context"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// FinishedByMinute counts the instances finished per queue and minute over the complete
// minutes before the current one, and returns the current minute's start.
func (s *Store) FinishedByMinute(ctx context.Context, db DB, minutes int) ([]durabletype.MinuteCount, time.Time, error) {
	var cur int64
	if err := db.QueryRow(ctx, s.sql("current_minute")).Scan(&cur); err != nil {
		return nil, time.Time{}, err
	}
	rows, err := db.Query(ctx, s.sql("finished_by_minute"), pgx.NamedArgs{"minutes": minutes})
	if err != nil {
		return nil, time.Time{}, err
	}
	type key struct {
		q string
		m int64
	}
	byKey := map[key]*durabletype.MinuteCount{}
	var order []key
	var q, status string
	var m, n int64
	_, err = pgx.ForEachRow(rows, []any{&q, &m, &status, &n}, func() error {
		k := key{q, m}
		c := byKey[k]
		if c == nil {
			c = &durabletype.MinuteCount{Queue: q, Minute: time.Unix(m*60, 0).UTC()}
			byKey[k] = c
			order = append(order, k)
		}
		switch durabletype.Status(status) {
		case durabletype.StatusDone:
			c.Done += n
		case durabletype.StatusFailed:
			c.Failed += n
		case durabletype.StatusCancelled:
			c.Cancelled += n
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]durabletype.MinuteCount, len(order))
	for i, k := range order {
		out[i] = *byKey[k]
	}
	return out, time.Unix(cur*60, 0).UTC(), nil
}

// MachineLive counts a machine's live instances by step and status.
func (s *Store) MachineLive(ctx context.Context, db DB, machine string) (map[string]map[durabletype.Status]int64, error) {
	rows, err := db.Query(ctx, s.sql("machine_live"), pgx.NamedArgs{"machine": machine})
	if err != nil {
		return nil, err
	}
	out := map[string]map[durabletype.Status]int64{}
	var step, status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&step, &status, &n}, func() error {
		if out[step] == nil {
			out[step] = map[durabletype.Status]int64{}
		}
		out[step][durabletype.Status(status)] = n
		return nil
	})
	return out, err
}

// MachineEdges returns a machine's transitions in the paths of its live instances and of its
// sample most recently finished ones; an edge from "" counts the paths that began at its step.
func (s *Store) MachineEdges(ctx context.Context, db DB, machine string, sample int) ([]durabletype.GraphEdge, error) {
	rows, err := db.Query(ctx, s.sql("machine_edges"), pgx.NamedArgs{"machine": machine, "sample": sample})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (durabletype.GraphEdge, error) {
		var e durabletype.GraphEdge
		err := r.Scan(&e.From, &e.To, &e.Count)
		return e, err
	})
}
