package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// explainPick runs a pick under EXPLAIN ANALYZE in a transaction that is rolled back.
func explainPick(t *testing.T, s *Store, db DB, stmt string, args pgx.NamedArgs) string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+s.sql(stmt), args)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// Rows without a rate limit pay nothing for the rate-limit machinery: with no limits configured
// the pick has none of it, and with limits configured its bucket reads never run for them.
func TestRateLimitCostsNothingWhenUnused(t *testing.T) {
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	s, err := New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	rows := make([]InsertRow, 200)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1}
	}
	_, err = s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	base := pgx.NamedArgs{"queue": "q", "limit": 50, "owner": "o#1", "lease": time.Minute.Milliseconds(), "horizon": int64(0)}

	plain := explainPick(t, s, pool, "pick", base)
	require.NotContains(t, plain, "buckets", "the plain pick reads no bucket")

	base["g_names"], base["g_limits"], base["g_shards"] = []string{}, []int32{}, []int32{}
	base["r_names"], base["r_rates"], base["r_bursts"] = []string{"api"}, []float64{1}, []float64{1}
	admitted := explainPick(t, s, pool, "pick_admitted", base)
	for _, line := range strings.Split(admitted, "\n") {
		switch {
		case strings.Contains(line, "Scan") && strings.Contains(line, "on buckets"):
			require.Contains(t, line, "never executed", "a bucket was read for rows with no limit:\n%s", admitted)
		case strings.Contains(line, "Insert on buckets"):
			require.Contains(t, line, "rows=0", "a bucket was written for rows with no limit:\n%s", admitted)
		}
	}
	require.Contains(t, admitted, "rows=50", "the pick still claimed its batch")
}
