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
