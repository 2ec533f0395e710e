package store

import (
	"context"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// BulkFilter selects the instances of a bulk action; zero fields do not filter, and Statuses
// must be set (the action's statuses, narrowed by the caller's).
type BulkFilter struct {
	Statuses                    []durabletype.Status
	Queue, Machine, Step, Error string
	Since, Until                time.Time
	KeyPrefix                   string
}

func (s *Store) bulkQuery(f *BulkFilter, after int64, limit int) (string, pgx.NamedArgs) {
	st := make([]string, len(f.Statuses))
	for i, x := range f.Statuses {
		st[i] = string(x)
	}
	args := pgx.NamedArgs{"statuses": st, "after": after, "limit": limit}
	var b strings.Builder
	b.WriteString(s.frag("bulk_base"))
	add := func(frag, name string, v any) {
		b.WriteString("\n")
		b.WriteString(s.frag(frag))
		args[name] = v
	}
	for _, p := range []struct {
		frag, name, v string
	}{{"bulk_queue", "queue", f.Queue}, {"bulk_machine", "machine", f.Machine}, {"bulk_step", "step", f.Step},
		{"bulk_error", "error", f.Error}, {"bulk_key_prefix", "key_prefix", f.KeyPrefix}} {
		if p.v != "" {
			add(p.frag, p.name, p.v)
		}
	}
	if !f.Since.IsZero() {
		add("bulk_since", "since", f.Since)
	}
	if !f.Until.IsZero() {
		add("bulk_until", "until", f.Until)
	}
	b.WriteString("\n")
	b.WriteString(s.frag("bulk_order"))
	return b.String(), args
}

// BulkCount counts the instances f matches (the dry run), up to limit.
func (s *Store) BulkCount(ctx context.Context, db DB, f *BulkFilter, limit int) (int64, error) {
	q, args := s.bulkQuery(f, 0, limit)
	var n int64
	err := db.QueryRow(ctx, "SELECT count(*) FROM ("+q+") AS matched", args).Scan(&n)
	return n, err
}

// BulkBatch returns the ids of up to limit instances f matches with ids above after, in id order.
func (s *Store) BulkBatch(ctx context.Context, db DB, f *BulkFilter, after int64, limit int) ([]int64, error) {
	q, args := s.bulkQuery(f, after, limit)
	rows, err := db.Query(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// BulkDelete deletes those of ids that are finished and whose parent, if any, is too; it returns
// the ids it deleted.
func (s *Store) BulkDelete(ctx context.Context, db DB, ids []int64) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql("bulk_delete"), pgx.NamedArgs{"ids": ids})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}
