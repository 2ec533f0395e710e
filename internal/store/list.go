package store

import (
	"context"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// ListFilter selects instances for List; zero fields do not filter.
type ListFilter struct {
	Queue    string
	Machine  string
	Statuses []durabletype.Status
	Key      string
	Since    time.Time
	Paused   bool  // only paused instances
	Before   int64 // keyset cursor: ids below it
	Limit    int
}

// List reads a page of instance summaries, newest first.
func (s *Store) List(ctx context.Context, db DB, f ListFilter) ([]durabletype.InstanceSummary, error) {
	sql, args := s.listQuery(f)
	rows, err := db.Query(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []durabletype.InstanceSummary
	for rows.Next() {
		var in durabletype.InstanceSummary
		var status string
		var lastErr *string
		var attempt, maxAttempts int32
		if err := rows.Scan(&in.ID, &in.Machine, &in.Step, &in.Queue, &status, &attempt, &maxAttempts, &in.CorrelationKey,
			&in.ScheduledAt, &in.InsertedAt, &in.UpdatedAt, &in.ParentID, &lastErr); err != nil {
			return nil, err
		}
		in.Status, in.Attempt, in.MaxAttempts = durabletype.Status(status), int(attempt), int(maxAttempts)
		if lastErr != nil {
			in.LastError = *lastErr
			o := opener{s: s}
			o.text(&in.LastError) // unopened, it stays as stored
		}
		out = append(out, in)
	}
	return out, rows.Err()
}

// listQuery assembles List's statement for the filters given.
func (s *Store) listQuery(f ListFilter) (string, pgx.NamedArgs) {
	var b strings.Builder
	args := pgx.NamedArgs{"limit": f.Limit}
	b.WriteString(s.frag("list_base"))
	add := func(frag string, name string, v any) {
		b.WriteString("\n")
		b.WriteString(s.frag(frag))
		args[name] = v
	}
	if f.Queue != "" {
		add("list_queue", "queue", f.Queue)
	}
	if f.Machine != "" {
		add("list_machine", "machine", f.Machine)
	}
	if len(f.Statuses) > 0 {
		st := make([]string, len(f.Statuses))
		for i, x := range f.Statuses {
			st[i] = string(x)
		}
		add("list_status", "statuses", st)
	}
	if f.Key != "" {
		add("list_key", "key", f.Key)
	}
	if !f.Since.IsZero() {
		add("list_since", "since", f.Since)
	}
	if f.Paused {
		b.WriteString("\n")
		b.WriteString(s.frag("list_paused"))
	}
	if f.Before > 0 {
		add("list_before", "before", f.Before)
	}
	b.WriteString("\n")
	b.WriteString(s.frag("list_order"))
	return b.String(), args
}
