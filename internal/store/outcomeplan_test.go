package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An outcome batch reads its rows by key whatever the planner knows of the table: 300 outcomes
// (half of them finishing with signals in their inbox, so the batch also clears inboxes) on a
// table of 30,000 rows never analyzed (a new installation, or a bench schema), where the plans
// Postgres prefers for arrays of 300 ids hash the whole table and the whole inbox table. The plans
// are the ones the batch really ran, as auto_explain reports them.
func TestOutcomeBatchesReadRowsByKey(t *testing.T) {
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	s, err := New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	const finished, batch = 30000, 300
	rows := make([]InsertRow, finished+batch)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: `{"n": 1}`, Queue: "q", Priority: 5, MaxAttempts: 3, Weight: 1}
	}
	ins, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	ids := make([]int64, len(ins))
	for i := range ins {
		ids[i] = ins[i].ID
	}
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".instances SET status = 'done', finalized_at = now() WHERE id = ANY($1)`,
		ids[:finished])
	require.NoError(t, err)
	// Inboxes of instances that finished while signals arrived: GC takes them with their rows.
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".signals (instance_id, name, payload)
		SELECT id, 'late', '{}' FROM unnest($1::bigint[]) AS u(id)`, ids[:finished])
	require.NoError(t, err)
	for _, id := range ids[finished : finished+batch/2] {
		_, ok, err := s.DeliverSignal(ctx, pool, id, "", "", "late", nil)
		require.NoError(t, err)
		require.True(t, ok)
	}

	var mu sync.Mutex
	var plans []string
	cfg := pool.Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	res, err := s.Pick(ctx, conn, "q", batch, "o#1", PickOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Rows, batch)
	outs := make([]Outcome, batch)
	signalled := 0
	for i := range res.Rows {
		res.Rows[i].Owner = "o#1"
		outs[i] = Outcome{Kind: KindDone, Result: []byte("{}")}
		outs[i].Fence(&res.Rows[i])
		if outs[i].Signalled {
			signalled++
		}
	}
	require.Equal(t, batch/2, signalled, "the claims that carry an inbox")
	for _, set := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_level = notice", "SET auto_explain.log_format = text"} {
		_, err = conn.Exec(ctx, set)
		require.NoError(t, err, set)
	}
	applied, _, err := s.ApplyOutcomes(ctx, conn, outs)
	require.NoError(t, err)
	require.Len(t, applied, batch)

	mu.Lock()
	defer mu.Unlock()
	var update, purge string
	for _, p := range plans {
		switch {
		case strings.Contains(p, "Update on instances"):
			update = p
		case strings.Contains(p, "Delete on signals"):
			purge = p
		}
	}
	require.NotEmpty(t, update, "no plan of the outcome statement among:\n%s", strings.Join(plans, "\n---\n"))
	require.NotEmpty(t, purge, "no plan of the inbox purge among:\n%s", strings.Join(plans, "\n---\n"))
	t.Logf("outcome statement: %s; inbox purge: %s", strings.SplitN(update, "\n", 2)[0], strings.SplitN(purge, "\n", 2)[0])
	for _, plan := range []string{update, purge} {
		assert.NotContains(t, plan, "Seq Scan", plan)
		assert.NotContains(t, plan, "Hash", plan)
		assert.NotContains(t, plan, "Merge", plan)
	}
	assert.Contains(t, update, "Index Scan using instances_pkey on instances i", update)
	assert.Contains(t, purge, "signals_instance", purge)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".signals WHERE instance_id = ANY($1)`,
		ids[finished:]).Scan(&left))
	require.Zero(t, left, fmt.Sprintf("the batch's inboxes are cleared: %d signals left", left))
}
