package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Retryable reports whether err is worth retrying as is: the connection failed or was closed,
// the server is shutting down or out of resources, or the transaction lost a serialization or
// deadlock conflict. A statement the server rejected for its content (a constraint, a type, a
// syntax error) fails the same way every time.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57", "58":
			return true
		}
		return false
	}
	// Not a server error: a network or protocol failure.
	return true
}

// GateContention reports whether err is a pick losing a race for a concurrency key or the last
// slot of a gate, or waiting on another transaction past its lock timeout (it is retried).
func GateContention(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return (pgErr.Code == "23505" && pgErr.ConstraintName == "instances_concurrency_active") ||
		(pgErr.Code == "23514" && pgErr.ConstraintName == "gates_held") ||
		pgErr.Code == "55P03" // lock_timeout: the pick waited on another transaction too long
}
