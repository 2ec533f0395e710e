package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Retryable reports whether err is worth retrying as is: the connection failed or was closed,
// the server is shutting down or out of resources, the statement was cancelled (a
// statement_timeout, an operator) or gave up waiting for a lock (a lock_timeout on the role:
// another transaction held a row it writes), the server accepts no writes right now (a standby,
// or a primary being demoted, during a failover), or the transaction lost a serialization or
// deadlock conflict. A connection the server refused to open (a login revoked during a password
// rotation, a database not accepting connections) says nothing about the statement it was for,
// whatever its code. A statement the server rejected for its content (a constraint, a type, a
// syntax error) fails the same way every time.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	if _, dial := errors.AsType[*pgconn.ConnectError](err); dial {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgLockNotAvailable, pgReadOnlyTransaction:
			return true
		}
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57", "58":
			return true
		}
		return false
	}
	// Not a server error: a network or protocol failure.
	return true
}

// Misconfigured reports whether err is a connection the server refused for who or where it is
// (invalid_authorization_specification, invalid_password: class 28; a database that does not
// exist, 3D000): Retryable, since a login revoked during a rotation comes back, but at a
// client's Start it is most likely the configuration, and reported at once.
func Misconfigured(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code[:2] == "28" || pgErr.Code == "3D000")
}

// IdleInTransaction reports whether the server ended the session because it sat idle in a
// transaction longer than idle_in_transaction_session_timeout (which rolls the transaction back).
func IdleInTransaction(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgIdleInTransaction
}

// QueryCanceled reports whether the server cancelled the statement (query_canceled): its
// statement_timeout ran out, or an operator cancelled it.
func QueryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgQueryCanceled
}

// SQLSTATEs that Retryable and QueryCanceled single out of their classes.
const (
	pgLockNotAvailable    = "55P03" // lock_not_available: a lock_timeout ran out
	pgReadOnlyTransaction = "25006" // read_only_sql_transaction: the server accepts no writes now
	pgQueryCanceled       = "57014" // query_canceled: a statement_timeout, pg_cancel_backend
	pgIdleInTransaction   = "25P03" // idle_in_transaction_session_timeout
)

// ConnLost reports whether err is the loss of the connection a statement ran on (closed,
// reset, terminated by a restarting server, or ended by idle_session_timeout), not a failure of
// the statement itself or of time. After a database restart, a pool hands out the connections it held before one by one,
// each failing this way once; a maintenance loop retries at once on another connection
// (RetryConnLost) instead of waiting for its next tick.
func ConnLost(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || pgconn.Timeout(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code[:2] == "08" || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03" ||
			pgErr.Code == "57P05" // idle_session_timeout ended an idle session
	}
	return true
}

// connRetries is how many times RetryConnLost runs an idempotent statement again at once after
// ConnLost: enough to go through every idle connection of a pool of the usual sizes (each stale
// one fails at once, and is dropped).
const connRetries = 32

// RetryConnLost runs fn, an idempotent statement, and runs it again at once while it fails with
// ConnLost and ctx is live (up to 32 more times): after a database restart the pool hands out its
// stale connections one by one, and a maintenance loop that waited for its next tick after each
// would lose a tick per stale connection.
func RetryConnLost(ctx context.Context, fn func() error) error {
	err := fn()
	for try := 0; try < connRetries && ConnLost(err) && ctx.Err() == nil; try++ {
		err = fn()
	}
	return err
}

// ValueTooLarge reports whether a statement built a value past one of Postgres's size limits
// (program_limit_exceeded: a jsonb value over 256 MB, say).
func ValueTooLarge(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "54000"
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
