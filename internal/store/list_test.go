package store

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// On a table of 300,000 rows, the list statement uses the sparse filters' indexes, and a deep
// keyset page neither scans the table nor sorts: the plans of the statement List sends.
func TestListPlansOnALargeTable(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]q.instances (machine, step, queue, status, max_attempts, state, correlation_key)
		SELECT 'm' || (i %% 3), 's', 'q' || (i %% 2),
		       (CASE WHEN i %% 10000 = 0 THEN 'failed' WHEN i %% 20000 = 1 THEN 'awaiting' ELSE 'done' END)::%[1]q.status,
		       3, '{}', CASE WHEN i %% 10 = 0 THEN 'k' || i END
		FROM generate_series(1, 300000) AS i`, schema))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`ANALYZE %q.instances`, schema))
	require.NoError(t, err)

	plan := func(f ListFilter) string {
		f.Limit = 50
		sql, args := s.listQuery(f)
		rows, err := pool.Query(ctx, "EXPLAIN (COSTS OFF) "+sql, args)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	failed := plan(ListFilter{Statuses: []durabletype.Status{durabletype.StatusFailed}})
	require.Contains(t, failed, "instances_problems", failed)
	parked := plan(ListFilter{Statuses: []durabletype.Status{durabletype.StatusAwaiting}, Queue: "q1"})
	require.Contains(t, parked, "instances_parked", parked)
	keyed := plan(ListFilter{Machine: "m1", Key: "k100"})
	require.Contains(t, keyed, "instances_correlation", keyed)
	for _, f := range []ListFilter{{Queue: "q1", Before: 10}, {Machine: "m2", Before: 150000}, {}} {
		p := plan(f)
		require.NotContains(t, p, "Seq Scan", p)
		require.NotContains(t, p, "Sort", p, "keyset paging must not sort")
	}
}
