package maintenance

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/stretchr/testify/require"
)

// After the database's clock steps back, the reaper re-dates the runnable and parked rows that
// were written ahead of the new clock: each keeps the delay its last write gave it, counted from
// now; the others are left as they are. The step is played on the rows: written 10 minutes ahead
// of the clock (what a clock that ran 10 minutes ahead leaves once time sync has corrected it),
// and a reaper whose last reading of the clock was 10 minutes ahead. Written more than 200,000
// ids apart, they check that the walk reads the table range by range down to its first id.
func TestReaperRedatesRowsWrittenAheadOfTheClock(t *testing.T) {
	e := newGCEnv(t)
	ctx := context.Background()
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, await_names, await_deadline,
		locked_by, locked_until)
		VALUES ('m', 'due', 'q1', 'available', 1, '{}', NULL, NULL, NULL, NULL),
		       ('m', 'later', 'q1', 'available', 1, '{}', NULL, NULL, NULL, NULL),
		       ('m', 'deadline', 'q2', 'awaiting', 1, '{}', '{go}', now() + interval '5 minutes', NULL, NULL),
		       ('m', 'parked', 'q2', 'awaiting', 1, '{}', '{go}', NULL, NULL, NULL),
		       ('m', 'running', 'q3', 'executing', 1, '{}', NULL, NULL, 'w#1', now() + interval '30 seconds')`)
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = scheduled_at + interval '30 minutes' WHERE step = 'later'`)
	// 200,000 ids further on: rows written ahead, and one written by the clock as it is now.
	e.exec(t, `SELECT setval(pg_get_serial_sequence('{schema}.instances', 'id'), 200000)`)
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state)
		VALUES ('m', 'due-far', 'q4', 'available', 1, '{}'), ('m', 'current', 'q5', 'available', 1, '{}')`)
	e.exec(t, `UPDATE {schema}.instances
		SET updated_at = updated_at + interval '10 minutes', scheduled_at = scheduled_at + interval '10 minutes',
		    await_deadline = await_deadline + interval '10 minutes', locked_until = locked_until + interval '10 minutes'
		WHERE step <> 'current'`)
	type row struct {
		Sched, Updated   time.Time
		Deadline, Locked *time.Time
	}
	// read returns every row's times, and the database's clock.
	read := func() (map[string]row, time.Time) {
		rows, err := e.pool.Query(ctx, e.q(`SELECT step, scheduled_at, updated_at, await_deadline, locked_until, now()
			FROM {schema}.instances`))
		require.NoError(t, err)
		out := map[string]row{}
		var now time.Time
		for rows.Next() {
			var step string
			var r row
			require.NoError(t, rows.Scan(&step, &r.Sched, &r.Updated, &r.Deadline, &r.Locked, &now))
			out[step] = r
		}
		require.NoError(t, rows.Err())
		return out, now
	}
	before, now := read()
	require.Greater(t, before["due"].Sched.Sub(now), 9*time.Minute, "the rows are written ahead")

	var mu sync.Mutex
	var woken []string
	r := &Reaper{Store: e.st, DB: e.pool, Interval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Emit: func(durabletype.Event) {}, Wake: func(q string) { mu.Lock(); woken = append(woken, q); mu.Unlock() },
		MaxRecoveries: 1}
	// The first sweep has no earlier reading: it notices nothing.
	_, err := r.Sweep(ctx)
	require.NoError(t, err)
	unchanged, _ := read()
	require.Equal(t, before, unchanged, "a sweep with no earlier reading of the clock changed rows")
	// The reaper's last reading 10 minutes ahead of now: the clock has stepped back since.
	r.dbNow = r.dbNow.Add(10 * time.Minute)
	redated := 0
	for sweeps := 0; ; sweeps++ {
		require.Less(t, sweeps, 30, "the walk did not end")
		n, err := r.Sweep(ctx)
		require.NoError(t, err)
		redated += n
		if r.redateHi == 0 {
			break
		}
	}
	after, now := read()
	require.Equal(t, 5, redated, "the runnable and parked rows written ahead are re-dated")
	require.False(t, after["due"].Sched.After(now), "a row due at its write is due now")
	require.False(t, after["due-far"].Sched.After(now), "a row due at its write is due now")
	require.InDelta(t, (30 * time.Minute).Seconds(), after["later"].Sched.Sub(now).Seconds(), 10, "a delayed row keeps its delay")
	require.InDelta(t, (5 * time.Minute).Seconds(), after["deadline"].Deadline.Sub(now).Seconds(), 10, "a parked row keeps its deadline")
	require.Nil(t, after["parked"].Deadline, "a parked row without a deadline gets none")
	for _, s := range []string{"due", "due-far", "later", "deadline", "parked"} {
		require.False(t, after[s].Updated.After(now), "%s is dated by the clock", s)
	}
	require.Equal(t, before["running"], after["running"], "an executing row is its heartbeat's to date")
	require.Equal(t, before["current"], after["current"], "a row written by the clock as it is is left as it is")
	slices.Sort(woken)
	require.Equal(t, []string{"q1", "q4"}, slices.Compact(woken), "the queues of the rows made due are woken")
}
