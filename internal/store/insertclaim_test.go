package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An Insert claimed by its own client is claimed exactly as a pick claims a row, and only when no
// due row of its queue is as urgent or more; otherwise it goes in available, to wait its turn.
func TestInsertClaimTakesTheRowOnlyWhenNothingIsAheadOfIt(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	row := func(queue string, prio int) *InsertRow {
		return &InsertRow{Machine: "m", Step: "s", State: `{"b": 1, "a": [2]}`, Queue: queue, Priority: prio, MaxAttempts: 3}
	}
	type claimRow struct {
		Status, LockedBy string
		Attempt          int
		LeaseLeft        time.Duration
		ConcurrencyShard *int16
	}
	read := func(id int64) claimRow {
		var r claimRow
		var ms float64
		require.NoError(t, pool.QueryRow(ctx, `SELECT status::text, coalesce(locked_by, ''), attempt,
			coalesce(extract(epoch FROM locked_until - now()) * 1000, 0), concurrency_shard
			FROM `+schema+`.instances WHERE id = $1`, id).Scan(&r.Status, &r.LockedBy, &r.Attempt, &ms, &r.ConcurrencyShard))
		r.LeaseLeft = time.Duration(ms) * time.Millisecond
		return r
	}

	// An empty queue: claimed, with the row's stored state handed back.
	id, c, err := s.InsertClaim(ctx, pool, row("q", 5), "w#1", time.Minute)
	require.NoError(t, err)
	require.NotNil(t, c)
	require.Equal(t, id, c.ID)
	require.Equal(t, 1, c.Attempt)
	require.Equal(t, "w#1", c.Owner)
	require.JSONEq(t, `{"a": [2], "b": 1}`, string(c.State))
	got := read(id)
	require.Equal(t, "executing", got.Status)
	require.Equal(t, "w#1", got.LockedBy)
	require.Equal(t, 1, got.Attempt)
	require.Greater(t, got.LeaseLeft, 50*time.Second)
	require.Nil(t, got.ConcurrencyShard)

	// A due row of the queue, less urgent than the new one, is not ahead of it.
	_, err = s.InsertMany(ctx, pool, []InsertRow{*row("r", 9)})
	require.NoError(t, err)
	// A row scheduled for later is not due.
	later := time.Now().Add(time.Hour)
	future := row("r", 1)
	future.ScheduledAt = &later
	_, err = s.InsertMany(ctx, pool, []InsertRow{*future})
	require.NoError(t, err)
	id, c, err = s.InsertClaim(ctx, pool, row("r", 5), "w#2", time.Minute)
	require.NoError(t, err)
	require.NotNil(t, c, "a less urgent or not yet due row is not ahead")
	require.Equal(t, "executing", read(id).Status)

	// A due row of the same urgency is ahead: the new row waits its turn, available.
	_, err = s.InsertMany(ctx, pool, []InsertRow{*row("r", 5)})
	require.NoError(t, err)
	id, c, err = s.InsertClaim(ctx, pool, row("r", 5), "w#3", time.Minute)
	require.NoError(t, err)
	require.Nil(t, c)
	require.Equal(t, claimRow{Status: "available"}, read(id))
	// So is a more urgent one, for a less urgent new row; another queue's rows never are.
	id, c, err = s.InsertClaim(ctx, pool, row("r", 7), "w#4", time.Minute)
	require.NoError(t, err)
	require.Nil(t, c)
	require.Equal(t, "available", read(id).Status)
	_, c, err = s.InsertClaim(ctx, pool, row("elsewhere", 7), "w#5", time.Minute)
	require.NoError(t, err)
	require.NotNil(t, c)

	// Rows with keys, limits or a schedule are never claimed as they are inserted.
	for _, r := range []*InsertRow{
		{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, CorrelationKey: "k"},
		{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, ConcurrencyKey: "k"},
		{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, RateLimit: "api:k"},
		{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1, Delay: time.Second},
	} {
		require.False(t, r.Runnable())
		_, _, err := s.InsertClaim(ctx, pool, r, "w#6", time.Minute)
		require.Error(t, err)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.instances WHERE locked_by = 'w#6'`).Scan(&n))
	require.Zero(t, n)
}
