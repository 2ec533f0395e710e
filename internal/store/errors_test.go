package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestConnLostTellsTheConnectionFromTheStatement(t *testing.T) {
	for _, tc := range []struct {
		err  error
		lost bool
	}{
		{nil, false},
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("heartbeat: %w", io.EOF), true},
		{&pgconn.PgError{Code: "57P01"}, true}, // terminating connection due to administrator command
		{&pgconn.PgError{Code: "08006"}, true}, // connection failure
		{&pgconn.PgError{Code: "57P05"}, true}, // idle_session_timeout ended the session
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "40P01"}, false},
		{&pgconn.PgError{Code: "57014"}, false}, // query cancelled: a timeout, not the connection
		{context.DeadlineExceeded, false},
		{fmt.Errorf("sweep: %w", context.Canceled), false},
		{errors.New("read: connection reset by peer"), true},
	} {
		require.Equal(t, tc.lost, ConnLost(tc.err), "%v", tc.err)
	}
}

func TestRetryableTellsTransientFailuresFromRefusals(t *testing.T) {
	for _, tc := range []struct {
		err   error
		retry bool
	}{
		{nil, false},
		{io.ErrUnexpectedEOF, true},
		{&pgconn.PgError{Code: "08006"}, true}, // connection failure
		{&pgconn.PgError{Code: "40001"}, true}, // serialization failure
		{&pgconn.PgError{Code: "40P01"}, true}, // deadlock detected
		{&pgconn.PgError{Code: "53300"}, true}, // too many connections
		{&pgconn.PgError{Code: "57014"}, true}, // query cancelled: statement_timeout, pg_cancel_backend
		{&pgconn.PgError{Code: "57P01"}, true}, // terminating connection due to administrator command
		{&pgconn.PgError{Code: "55P03"}, true}, // lock_not_available: a lock_timeout ran out
		{&pgconn.PgError{Code: "25006"}, true}, // read-only transaction: a standby, a failover
		{&pgconn.PgError{Code: "55000"}, false},
		{&pgconn.PgError{Code: "25001"}, false},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation
		{&pgconn.PgError{Code: "23514"}, false}, // check violation
		{&pgconn.PgError{Code: "22P02"}, false}, // invalid text representation
		{&pgconn.PgError{Code: "42501"}, false}, // insufficient privilege
		{fmt.Errorf("commit: %w", context.DeadlineExceeded), true},
	} {
		require.Equal(t, tc.retry, Retryable(tc.err), "%v", tc.err)
	}
}

func TestQueryCanceledIsTheServersCancellation(t *testing.T) {
	require.True(t, QueryCanceled(fmt.Errorf("gc: %w", &pgconn.PgError{Code: "57014"})))
	require.False(t, QueryCanceled(&pgconn.PgError{Code: "57P01"}))
	require.False(t, QueryCanceled(context.Canceled))
	require.False(t, QueryCanceled(nil))
}
