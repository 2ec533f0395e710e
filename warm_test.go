package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// Start warms the pool: it opens the connections the node's loops use together (here 9, capped
// at half of the pool's 16) and runs the pick, the outcome and the insert on each, so that no
// step's pickup waits on a connection's first statements. The warm-up writes nothing: a due row
// of the node's queue, paused so that no real pick takes it, is still unclaimed afterwards.
// Checked from each connection's own pg_prepared_statements.
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

	const want = 8 // min(2 + a pick + 2 committers + pauses + reaper + schedules + GC, 16/2)
	warm := 0
	deadline := time.Now().Add(30 * time.Second)
	for warm < want {
		require.True(t, time.Now().Before(deadline), "only %d of the pool's connections were warmed, want %d", warm, want)
		time.Sleep(20 * time.Millisecond)
		warm = 0
		for _, c := range e.pool.AcquireAllIdle(ctx) {
			var pick, outcome, insert bool
			err := c.QueryRow(ctx, `SELECT
				bool_or(statement LIKE '%candidates AS MATERIALIZED%'),
				bool_or(statement ~ '^UPDATE .*instances AS i.*unnest\('),
				bool_or(statement ~ '^WITH input AS \(.*unnest\(.*INSERT INTO')
				FROM pg_prepared_statements`).Scan(&pick, &outcome, &insert)
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
