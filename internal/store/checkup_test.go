package store

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The checkup's read of the rows costs the queues and the rows in flight, never the backlog: a
// queue of 100,000 rows scheduled a day ahead (their pages fill the pick index) is passed over
// in a few descents, and the due rows of the other queues are found all the same.
func TestCheckupReadsNoBacklog(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".instances (machine, step, queue, priority, state, max_attempts, scheduled_at)
		SELECT 'm', 's', 'a', 1 + g % 9, '{}', 1, now() + interval '1 day' FROM generate_series(1, 100000) AS g`)
	require.NoError(t, err)
	for _, q := range []string{"b", "c", "d"} {
		_, err := s.InsertMany(ctx, pool, []InsertRow{{Machine: "m", Step: "s", State: "{}", Queue: q, Priority: 5, MaxAttempts: 1}})
		require.NoError(t, err)
	}
	indexPages := readyIndexPages(t, pool, schema)
	require.Greater(t, indexPages, 200, "the delayed rows fill the pick index")

	f, err := s.Checkup(ctx, pool, CheckupLimits{Old: time.Hour, Wait: time.Hour, Grace: time.Minute, Live: time.Minute, SlotWAL: 1 << 30})
	require.NoError(t, err)
	require.NotNil(t, f.Rows)
	require.Equal(t, []string{"b", "c", "d"}, f.Rows.DueQueues)

	plan := explainAnalyze(t, pool, "ANALYZE, BUFFERS, COSTS OFF", s.sql("checkup_rows"), 60.0, 30.0, CheckupCap)
	// The first Buffers line is the whole statement's.
	m := regexp.MustCompile(`Buffers: shared (?:hit=(\d+))?\s*(?:read=(\d+))?`).FindStringSubmatch(plan)
	require.NotNil(t, m, plan)
	hit, _ := strconv.Atoi(m[1])
	read, _ := strconv.Atoi(m[2])
	t.Logf("the checkup read %d pages; the pick index has %d", hit+read, indexPages)
	require.Less(t, hit+read, indexPages/4, "the checkup read the delayed rows' pages:\n%s", plan)
}
