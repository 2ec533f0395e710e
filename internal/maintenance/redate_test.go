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

// After the database's clock steps back, the reaper makes due now the runnable rows that were
// due when written ahead of the new clock, as overdue as they were then; the others are left as
// they are (a row not yet due at its write, a parked row's deadline: a time the caller may have
// named, which must not come early). The step is played on the rows: written 10 minutes ahead of
// the clock (what a clock that ran 10 minutes ahead leaves once time sync has corrected it), and
// a reaper whose last reading of the clock was 10 minutes ahead. Written 200,000 ids apart, they
// check that the walk reads the table range by range down to its first id; a row written ahead
// after the walk (a transaction begun before the step that commits late) is made due by the
// second walk, a minute after the step.
func TestReaperRedatesRowsWrittenAheadOfTheClock(t *testing.T) {
	e := newGCEnv(t)
	ctx := context.Background()
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, await_names, await_deadline,
		locked_by, locked_until)
		VALUES ('m', 'due', 'q1', 'available', 1, '{}', NULL, NULL, NULL, NULL),
		       ('m', 'overdue', 'q1', 'available', 1, '{}', NULL, NULL, NULL, NULL),
		       ('m', 'later', 'q2', 'available', 1, '{}', NULL, NULL, NULL, NULL),
		       ('m', 'deadline', 'q2', 'awaiting', 1, '{}', '{go}', now() + interval '5 minutes', NULL, NULL),
		       ('m', 'running', 'q3', 'executing', 1, '{}', NULL, NULL, 'w#1', now() + interval '30 seconds')`)
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = scheduled_at + interval '30 minutes' WHERE step = 'later'`)
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = scheduled_at - interval '5 minutes' WHERE step = 'overdue'`)
	// 200,000 ids further on: a row written ahead, and one written by the clock as it is now.
	e.exec(t, `SELECT setval(pg_get_serial_sequence('{schema}.instances', 'id'), 200000)`)
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state)
		VALUES ('m', 'due-far', 'q4', 'available', 1, '{}'), ('m', 'current', 'q5', 'available', 1, '{}')`)
	ahead := `UPDATE {schema}.instances
		SET updated_at = updated_at + interval '10 minutes', scheduled_at = scheduled_at + interval '10 minutes',
		    await_deadline = await_deadline + interval '10 minutes', locked_until = locked_until + interval '10 minutes'
		WHERE step = ANY($1)`
	e.exec(t, ahead, []string{"due", "overdue", "later", "deadline", "running", "due-far"})
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
	require.Equal(t, 3, redated, "the runnable rows due when written ahead are re-dated")
	for _, s := range []string{"due", "due-far"} {
		require.InDelta(t, 0, after[s].Sched.Sub(now).Seconds(), 10, "%s was due at its write: it is due now", s)
	}
	require.InDelta(t, -(5 * time.Minute).Seconds(), after["overdue"].Sched.Sub(now).Seconds(), 10,
		"a row overdue at its write stays as overdue")
	for _, s := range []string{"due", "due-far", "overdue"} {
		require.False(t, after[s].Updated.After(now), "%s is dated by the clock", s)
	}
	for _, s := range []string{"later", "deadline", "running", "current"} {
		require.Equal(t, before[s], after[s], "%s is left as it is", s)
	}
	slices.Sort(woken)
	require.Equal(t, []string{"q1", "q4"}, slices.Compact(woken), "the queues of the rows made due are woken")

	// A row written ahead after the walk: the second walk, a minute after the step, makes it due.
	e.exec(t, `INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state)
		VALUES ('m', 'late', 'q6', 'available', 1, '{}')`)
	e.exec(t, ahead, []string{"late"})
	_, err = r.Sweep(ctx)
	require.NoError(t, err)
	late, _ := read()
	require.True(t, late["late"].Updated.After(now), "the second walk waits a minute after the step")
	r.stepped = time.Now().Add(-2 * stepBack)
	n, err := r.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the second walk re-dates the late row")
	late, now = read()
	require.False(t, late["late"].Sched.After(now), "the late row is due")
	require.False(t, r.rewalk, "no third walk")
}
