package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An outcome batch reads its rows by key whatever the planner knows of the table: batches of 300
// outcomes on a table of 30,000 rows and an inbox table of 30,000 signals, never analyzed (a new
// installation, or a bench schema), where the plans Postgres prefers for arrays of 300 ids hash
// the whole table and the whole inbox table. Three batches: done outcomes, half of them clearing
// an inbox; parks, half of them on a signal already in their inbox (the re-check wakes them); and
// spawns of two children each (the children's insert and the recount; matching 600 children to
// 300 spawns pair by pair took 53 ms of the batch's 60). The plans are the ones each batch really
// ran, as auto_explain reports them.
func TestOutcomeBatchesReadRowsByKey(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	const finished, batch = 30000, 300
	rows := make([]InsertRow, finished+3*batch)
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
	// Half of the done batch and half of the parks have a signal in their inbox.
	for _, id := range slices.Concat(ids[finished:finished+batch/2], ids[finished+batch:finished+batch+batch/2]) {
		_, ok, err := s.DeliverSignal(ctx, pool, id, "", "", "go", nil)
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
	for _, set := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_level = notice", "SET auto_explain.log_format = text"} {
		_, err = conn.Exec(ctx, set)
		require.NoError(t, err, set)
	}
	// apply claims the next batch, applies outcome to each row, and returns the plans of the
	// statements the batch ran.
	apply := func(name string, outcome func(i int, o *Outcome)) []string {
		t.Helper()
		owner := "o#" + name
		res, err := s.Pick(ctx, conn, "q", batch, owner, PickOpts{Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, res.Rows, batch)
		outs := make([]Outcome, batch)
		for i := range res.Rows {
			res.Rows[i].Owner = owner
			outcome(i, &outs[i])
			outs[i].Fence(&res.Rows[i], nil)
		}
		mu.Lock()
		plans = nil
		mu.Unlock()
		_, err = conn.Exec(ctx, "SET auto_explain.log_min_duration = 0")
		require.NoError(t, err)
		applied, _, err := s.ApplyOutcomes(ctx, conn, outs)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SET auto_explain.log_min_duration = -1")
		require.NoError(t, err)
		require.Len(t, applied, batch, name)
		mu.Lock()
		defer mu.Unlock()
		var ran []string
		for _, p := range plans {
			if !strings.Contains(p, "set_config") && !strings.Contains(p, "auto_explain") {
				ran = append(ran, p)
			}
		}
		for _, p := range ran {
			assert.NotContains(t, p, "Seq Scan", "%s:\n%s", name, p)
			if !strings.Contains(p, "WITH upd AS") {
				// A plain batch joins nothing but by key; a statement that joins its own sets
				// (a spawn's children to the applied outcomes) may hash them.
				assert.NotContains(t, p, "Hash", "%s:\n%s", name, p)
				assert.NotContains(t, p, "Merge", "%s:\n%s", name, p)
			}
			if strings.Contains(p, "Function Scan on u ") { // the outcome statement
				assert.Regexp(t, `Nested Loop[^\n]*\n\s*->  Function Scan on u[^\n]*\n\s*->  Index Scan using instances_pkey on instances i`, p,
					"%s: the outcomes' rows looked up by primary key:\n%s", name, p)
			}
			t.Logf("%s: %s", name, strings.SplitN(p, "\n", 2)[0])
		}
		return ran
	}
	has := func(plans []string, node string) string {
		t.Helper()
		for _, p := range plans {
			if strings.Contains(p, node) {
				return p
			}
		}
		require.Failf(t, "a plan missing", "no %q among:\n%s", node, strings.Join(plans, "\n---\n"))
		return ""
	}

	done := apply("done", func(_ int, o *Outcome) { *o = Outcome{Kind: KindDone, Result: []byte("{}")} })
	has(done, "Update on instances")
	assert.Contains(t, has(done, "Delete on signals"), "signals_instance")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".signals WHERE instance_id = ANY($1)`,
		ids[finished:finished+batch]).Scan(&left))
	require.Zero(t, left, fmt.Sprintf("the done batch's inboxes are cleared: %d signals left", left))

	parks := apply("park", func(_ int, o *Outcome) {
		*o = Outcome{Kind: KindAwait, Step: "s2", AwaitNames: []string{"go"}}
	})
	has(parks, "Update on instances")
	require.Equal(t, batch/2, countStatus(t, pool, schema, ids[finished+batch:finished+2*batch], "available"),
		"the parks with the signal already in their inbox are woken by the re-check")

	spawns := apply("spawn", func(i int, o *Outcome) {
		*o = Outcome{Kind: KindSpawn, Step: "join", Children: []InsertRow{
			{Machine: "m", Step: "s", State: "{}", Queue: "kids", Priority: 5, MaxAttempts: 3, Weight: 1},
			{Machine: "m", Step: "s", State: "{}", Queue: "kids", Priority: 5, MaxAttempts: 3, Weight: 1}}}
	})
	assert.NotContains(t, has(spawns, "Insert on instances"), "Join Filter: (c.parent",
		"the children matched to the applied spawns by a nested loop: a test of every pair")
	require.Equal(t, batch, countStatus(t, pool, schema, ids[finished+2*batch:], "joining"), "every spawner joins its children")
}

// countStatus counts the rows of ids in status.
func countStatus(t *testing.T, pool *pgxpool.Pool, schema string, ids []int64, status string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".instances
		WHERE id = ANY($1) AND status::text = $2`, ids, status).Scan(&n))
	return n
}
