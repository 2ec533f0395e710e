package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// UnsafeSearchPath lists the schemas on the session's search_path in which PUBLIC, or a role
// other than the current one that is not a superuser, can create objects (see session.sql).
func (s *Store) UnsafeSearchPath(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, s.sql("unsafe_search_path"))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// DefaultIsolation returns the session's default_transaction_isolation ("read committed",
// "repeatable read" or "serializable"; see session.sql).
func (s *Store) DefaultIsolation(ctx context.Context, db DB) (string, error) {
	var iso string
	err := db.QueryRow(ctx, s.sql("default_isolation")).Scan(&iso)
	return iso, err
}
