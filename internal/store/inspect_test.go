package store

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The inspection statements read the rows they are about through their partial indexes, never
// the whole table; the finished counts are read from the table the triggers keep. The table is shaped like a
// busy one (mostly finished rows, a backlog, a few rate-limited, executing and parked rows), and
// sequential and bitmap scans are discouraged so that its small size does not make them the
// cheapest plan: the plans are the ones a table of millions of rows gets (an index-only scan
// shows that the index covers what the statement reads).
func TestInspectionStatementsUseTheirIndexes(t *testing.T) {
	t.Parallel()
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, ident.Expand(`
		INSERT INTO {schema}.instances (machine, step, queue, status, state, max_attempts, finalized_at,
		                                rate_limit, locked_by, locked_until, await_names, await_deadline,
		                                parent_id, parent_wave)
		SELECT 'm', 's', 'q' || g % 3,
		       CASE WHEN g % 100 < 85 THEN 'done' WHEN g % 100 < 97 THEN 'available'
		            WHEN g % 100 < 98 THEN 'executing' ELSE 'awaiting' END::{schema}.status,
		       '{}', 1,
		       CASE WHEN g % 100 < 85 THEN now() END,
		       CASE WHEN g % 100 = 96 AND g % 1000 < 100 THEN 'api:' || g END,
		       CASE WHEN g % 100 = 97 THEN 'w#' || g END,
		       CASE WHEN g % 100 = 97 THEN now() + interval '1 minute' END,
		       CASE WHEN g % 100 >= 98 THEN '{go}'::text[] END,
		       CASE WHEN g % 100 = 98 THEN now() + interval '1 minute' END,
		       CASE WHEN g % 10 = 0 THEN g / 1000 END,
		       CASE WHEN g % 10 = 0 THEN 1 END
		FROM generate_series(1, 20000) AS g;
		INSERT INTO {schema}.signals (instance_id, name) SELECT g % 100 + 1, 'n' FROM generate_series(1, 2000) AS g;`,
		schema))
	require.NoError(t, err)
	for _, table := range []string{"instances", "signals"} {
		_, err = pool.Exec(ctx, ident.Expand("VACUUM (ANALYZE) {schema}."+table, schema))
		require.NoError(t, err)
	}

	explain := func(stmt string, args ...any) string {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SET LOCAL enable_bitmapscan = off")
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN (COSTS OFF) "+s.sql(stmt), args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	for _, c := range []struct {
		stmt  string
		args  []any
		index []string
	}{
		// The runnable rows: through their two indexes, untagged and tagged.
		{"queue_stats_available", nil, []string{"Index Only Scan using instances_ready_untagged",
			"Index Only Scan using instances_ready_tagged"}},
		{"runnable_queues", []any{0}, []string{"instances_ready_untagged", "instances_ready_tagged"}},
		{"queue_has_rows", []any{pgx.NamedArgs{"queue": "q1"}}, []string{"instances_ready_untagged",
			"instances_ready_tagged", "finished_counts"}},
		// Every live row, through the partial index of its status (a list of statuses would
		// read the whole table).
		{"live_groups", nil, []string{"instances_ready_untagged", "instances_ready_tagged", "instances_parked"}},
		{"machine_live", []any{pgx.NamedArgs{"machine": "m"}}, []string{"instances_ready_untagged",
			"instances_ready_tagged", "instances_executing", "instances_parked"}},
		{"machine_edges", []any{pgx.NamedArgs{"machine": "m", "sample": 100}}, []string{"instances_ready_untagged",
			"instances_ready_tagged", "instances_executing", "instances_parked"}},
		{"queue_stats_executing", nil, []string{"instances_executing"}},
		{"queue_stats_parked", []any{pgx.NamedArgs{"statuses": []string{"awaiting", "joining"}}}, []string{"instances_parked"}},
		{"queue_stats_finished", []any{pgx.NamedArgs{"statuses": []string{"done"}}}, []string{"finished_counts"}},
		{"stuck_unknown_rate_limits", []any{pgx.NamedArgs{"r_names": []string{"api"}}}, []string{"instances_rate_waiting"}},
		{"stuck_unknown_machines", []any{pgx.NamedArgs{"machines": []string{"m"}, "steps": []string{"s"},
			"queues": []string{"q"}}}, []string{"instances_ready_untagged", "instances_ready_tagged"}},
		{"stuck_overdue_awaits", nil, []string{"instances_await_deadline"}},
		{"throughput", []any{pgx.NamedArgs{"window_ms": 60000}}, []string{"instances_finalized"}},
		{"inspect_instance", []any{pgx.NamedArgs{"id": 1, "inbox_after": 0, "inbox_limit": 10,
			"children_after": 0, "children_limit": 10}},
			[]string{"instances_pkey", "signals_instance", "instances_parent"}},
	} {
		plan := explain(c.stmt, c.args...)
		for _, line := range strings.Split(plan, "\n") {
			if strings.Contains(line, "Seq Scan") {
				// finished_counts is a few rows per queue and status (GC folds it).
				require.Contains(t, line, "Seq Scan on finished_counts", "%s reads a whole table:\n%s", c.stmt, plan)
			}
		}
		for _, ix := range c.index {
			// "a|b": either index.
			require.True(t, slices.ContainsFunc(strings.Split(ix, "|"), func(a string) bool { return strings.Contains(plan, a) }),
				"%s does not read %s:\n%s", c.stmt, ix, plan)
		}
	}
}
