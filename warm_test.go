package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/stretchr/testify/require"
)

// Start warms the pool: it opens the connections the node's loops use together (9 here, while
// less than half of the pool's 16 is in use) and runs the plain pick, the plain outcome and the
// insert of no rows on each, so that no step's pickup waits on a connection's first statements.
// Nothing in the test runs InsertMany, so a connection that has its statement prepared was warmed.
// The warm-up writes nothing: a due row of the node's queue, paused so that no real pick takes it,
// is still unclaimed afterwards. Checked from each connection's own pg_prepared_statements.
func TestStartWarmsThePoolWithoutWritingARow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "wj", Queue: "wq", Perform: func(*gendurable.Ctx, int) error { return nil }}
	op := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	require.NoError(t, op.Pause(ctx, gendurable.PauseTarget{Queue: "wq"}, "warm test"))
	res, err := op.Insert(ctx, job.With(1), nil)
	require.NoError(t, err)

	start(t, e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{"wq": {Concurrency: 4}}}))

	// Up to 8 (half the pool); the client's own first statements may hold one or two meanwhile.
	const want = 6
	st, err := store.New(e.schema)
	require.NoError(t, err)
	insertMany := st.Statement("insert_many")
	warm := 0
	deadline := time.Now().Add(30 * time.Second)
	for warm < want {
		require.True(t, time.Now().Before(deadline), "only %d of the pool's connections were warmed, want %d", warm, want)
		time.Sleep(20 * time.Millisecond)
		warm = 0
		for _, c := range e.pool.AcquireAllIdle(ctx) {
			var pick, outcome, insert bool
			err := c.QueryRow(ctx, `SELECT
				coalesce(bool_or(statement LIKE '%candidates AS MATERIALIZED%'), false),
				coalesce(bool_or(statement ~ '^UPDATE .*instances AS i.*unnest\('), false),
				coalesce(bool_or(statement = $1), false)
				FROM pg_prepared_statements`, insertMany).Scan(&pick, &outcome, &insert)
			c.Release()
			require.NoError(t, err)
			if pick && outcome && insert {
				warm++
			}
		}
	}
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND attempt = 0 AND status = 'available' AND locked_by IS NULL`, res.ID),
		"the warm-up claimed or changed a row")
}
