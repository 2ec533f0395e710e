package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// parkedRows inserts n rows of machine m in queue q at priority prio and parks them on "go".
func parkedRows(t *testing.T, s *Store, pool *pgxpool.Pool, schema, q string, prio, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	rows := make([]InsertRow, n)
	for i := range rows {
		rows[i] = InsertRow{Machine: "m", Step: "s", State: `{"k": 1}`, Queue: q, Priority: prio, MaxAttempts: 3}
	}
	ins, err := s.InsertMany(ctx, pool, rows)
	require.NoError(t, err)
	ids := make([]int64, n)
	for i, r := range ins {
		ids[i] = r.ID
	}
	_, err = pool.Exec(ctx, `UPDATE `+schema+`.instances SET status = 'awaiting', await_names = '{go}', step = 'woke'
		WHERE id = ANY($1)`, ids)
	require.NoError(t, err)
	return ids
}

func wakeSlots() *WakeSlots {
	return &WakeSlots{Queues: []string{"q", "other"}, Owners: []string{"w#1", "w#2"},
		Machines: []string{"m"}, Versions: []int32{1}, Lease: time.Minute}
}

// A signal that wakes its target on a client with a slot in the target's queue claims it in the
// same statement, exactly as a pick would (executing, the slot's token, attempt + 1, a lease), and
// returns the inbox as the step must see it: the signals already there, then this one.
func TestSignalClaimsTheInstanceItWakes(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	id := parkedRows(t, s, pool, schema, "q", 5, 1)[0]
	early := `{"n": 1}`
	d, c, found, err := s.DeliverSignalClaim(ctx, pool, id, "", "", "other-name", &early, wakeSlots())
	require.NoError(t, err)
	require.True(t, found)
	require.Nil(t, c, "a name the instance does not await wakes nothing")
	require.False(t, d.Woke)
	payload := `{"n":2,"a":1}`
	d, c, found, err = s.DeliverSignalClaim(ctx, pool, id, "", "", "go", &payload, wakeSlots())
	require.NoError(t, err)
	require.True(t, found)
	require.NotNil(t, c)
	require.False(t, d.Woke, "claimed, not made available")
	require.Equal(t, id, c.ID)
	require.Equal(t, "w#1", c.Owner, "the token of the slot in the row's queue")
	require.Equal(t, "q", c.Queue)
	require.Equal(t, "woke", c.Step)
	require.Equal(t, 1, c.Attempt)
	require.Equal(t, []string{"go"}, c.AwaitNames)
	require.True(t, c.Signalled)
	require.JSONEq(t, `{"k": 1}`, string(c.State))
	require.Len(t, c.Inbox, 2)
	require.Equal(t, "other-name", c.Inbox[0].Name)
	require.JSONEq(t, early, string(c.Inbox[0].Payload))
	require.Equal(t, "go", c.Inbox[1].Name)
	require.Equal(t, d.SignalID, c.Inbox[1].ID)
	require.Equal(t, `{"a": 1, "n": 2}`, string(c.Inbox[1].Payload), "the payload as stored, as a pick returns it")
	require.Equal(t, time.Local, c.Inbox[0].At.Location())
	require.Equal(t, time.Local, c.Inbox[1].At.Location())
	require.False(t, c.HasMore())

	var status, owner string
	var attempt int
	var lease float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT status::text, locked_by, attempt, extract(epoch FROM locked_until - now())
		FROM `+schema+`.instances WHERE id = $1`, id).Scan(&status, &owner, &attempt, &lease))
	require.Equal(t, "executing", status)
	require.Equal(t, "w#1", owner)
	require.Equal(t, 1, attempt)
	require.Greater(t, lease, 50.0)

	// A signal to the executing row is stored and claims nothing.
	d, c, found, err = s.DeliverSignalClaim(ctx, pool, id, "", "", "go", nil, wakeSlots())
	require.NoError(t, err)
	require.True(t, found)
	require.Nil(t, c)
	require.False(t, d.Woke)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.signals WHERE instance_id = $1`, id).Scan(&n))
	require.Equal(t, 3, n)
}

// The wake claims only what a pick of this client would claim at once; otherwise it is the plain
// wake (available, due now), for the queue's picks.
func TestSignalClaimsOnlyWhatAPickWouldTake(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	ctx := context.Background()
	set := func(id int64, assignments string) {
		_, err := pool.Exec(ctx, `UPDATE `+schema+`.instances SET `+assignments+` WHERE id = $1`, id)
		require.NoError(t, err)
	}
	wake := func(id int64, slots *WakeSlots) (claimed bool) {
		t.Helper()
		d, c, found, err := s.DeliverSignalClaim(ctx, pool, id, "", "", "go", nil, slots)
		require.NoError(t, err)
		require.True(t, found)
		require.True(t, d.Woke || c != nil, "the signal wakes the instance either way")
		var status string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status::text FROM `+schema+`.instances WHERE id = $1`, id).Scan(&status))
		if c != nil {
			require.Equal(t, "executing", status)
			return true
		}
		require.True(t, d.Woke)
		require.Equal(t, "available", status)
		return false
	}
	ids := parkedRows(t, s, pool, schema, "q", 5, 9)
	free := parkedRows(t, s, pool, schema, "elsewhere", 5, 1)

	require.False(t, wake(free[0], wakeSlots()), "a queue the client has no slot in")
	set(ids[0], `concurrency_key = 'k'`)
	require.False(t, wake(ids[0], wakeSlots()), "a concurrency key is for the picks to admit")
	set(ids[1], `rate_limit = 'api'`)
	require.False(t, wake(ids[1], wakeSlots()), "a rate limit is for the picks to admit")
	set(ids[2], `fair_key = 'tenant'`)
	require.False(t, wake(ids[2], wakeSlots()), "a fairness key is for the fair picks to order")
	set(ids[3], `paused_at = now()`)
	require.False(t, wake(ids[3], wakeSlots()), "a paused instance")
	paused := wakeSlots()
	paused.Paused = []string{"m"}
	require.False(t, wake(ids[4], paused), "a paused machine")
	set(ids[5], `machine_version = 2`)
	require.False(t, wake(ids[5], wakeSlots()), "a version newer than the client's")
	unknown := wakeSlots()
	unknown.Machines, unknown.Versions = []string{"n"}, []int32{1}
	require.False(t, wake(ids[6], unknown), "a machine the client does not run")
	// ids[4] is available at priority 5 now (and ids[0..3], [5], [6]): a due row of the same
	// priority is not ahead of a wake.
	require.True(t, wake(ids[7], wakeSlots()), "due rows of its own priority do not hold a wake back")
	// A due row more urgent than the woken one is ahead of it.
	urgent, err := s.InsertMany(ctx, pool, []InsertRow{{Machine: "m", Step: "s", State: `{}`, Queue: "q", Priority: 2, MaxAttempts: 1}})
	require.NoError(t, err)
	require.False(t, wake(ids[8], wakeSlots()), "a more urgent due row goes first")
	// Once it is scheduled for later, it is not due: nothing is ahead.
	set(urgent[0].ID, `scheduled_at = now() + interval '1 hour'`)
	more := parkedRows(t, s, pool, schema, "q", 5, 1)
	require.True(t, wake(more[0], wakeSlots()))
}

// A wake whose row changed while the statement waited for its lock (here, an outcome that parks
// it anew, committed in between) is a plain wake: the inbox the statement could return is its
// snapshot's, which may still hold signals that outcome consumed.
func TestSignalClaimSkipsARowChangedWhileItWaited(t *testing.T) {
	s, pool, schema := newTestStore(t, 3)
	s.WakeLockTimeout = time.Minute // the test's own wait below is what it waits for
	ctx := context.Background()
	id := parkedRows(t, s, pool, schema, "q", 5, 1)[0]
	old := `{"old": true}`
	_, _, err := s.DeliverSignal(ctx, pool, id, "", "", "unawaited", &old)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// The "outcome": consumes the signal and parks the row again, holding its lock.
	_, err = tx.Exec(ctx, `DELETE FROM `+schema+`.signals WHERE instance_id = $1`, id)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE `+schema+`.instances SET updated_at = now() WHERE id = $1`, id)
	require.NoError(t, err)

	type result struct {
		d     Delivered
		c     *Claimed
		found bool
		err   error
	}
	conn, pid := backendConn(t, pool)
	done := make(chan result, 1)
	go func() {
		var r result
		r.d, r.c, r.found, r.err = s.DeliverSignalClaim(ctx, conn, id, "", "", "go", nil, wakeSlots())
		done <- r
	}()
	waitForLock(t, pool, pid) // the delivery has its snapshot once it waits for the row's lock
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.True(t, r.found)
	require.Nil(t, r.c, "the row changed after the snapshot: no claim")
	require.True(t, r.d.Woke)
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status::text FROM `+schema+`.instances WHERE id = $1`, id).Scan(&status))
	require.Equal(t, "available", status)
}

// An inbox longer than a claim returns comes back marked for LoadRest, without the new signal
// (LoadRest reads it, in id order, with the rest).
func TestSignalClaimLeavesALongInboxToLoadRest(t *testing.T) {
	s, pool, schema := newTestStore(t, 2)
	s.ClaimRows = 2
	ctx := context.Background()
	id := parkedRows(t, s, pool, schema, "q", 5, 1)[0]
	for range 3 {
		_, _, err := s.DeliverSignal(ctx, pool, id, "", "", "unawaited", nil)
		require.NoError(t, err)
	}
	d, c, _, err := s.DeliverSignalClaim(ctx, pool, id, "", "", "go", nil, wakeSlots())
	require.NoError(t, err)
	require.NotNil(t, c)
	require.Len(t, c.Inbox, 2)
	require.True(t, c.HasMore())
	require.NoError(t, s.LoadRest(ctx, pool, c))
	require.Len(t, c.Inbox, 4)
	require.Equal(t, d.SignalID, c.Inbox[3].ID)
	for i := 1; i < 4; i++ {
		require.Less(t, c.Inbox[i-1].ID, c.Inbox[i].ID)
	}
}

// A target whose row another transaction holds past the claim's lock timeout gets nothing from
// DeliverSignalClaim (ErrDeliverPlainly: the caller's reserved slots do not wait on it); the
// plain delivery then waits for the row as it always has.
func TestSignalClaimGivesUpALockedRow(t *testing.T) {
	s, pool, schema := newTestStore(t, 3)
	ctx := context.Background()
	id := parkedRows(t, s, pool, schema, "q", 5, 1)[0]
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+schema+`.instances WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	_, c, _, err := s.DeliverSignalClaim(ctx, pool, id, "", "", "go", nil, wakeSlots())
	require.ErrorIs(t, err, ErrDeliverPlainly)
	require.Nil(t, c)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.signals`).Scan(&n))
	require.Zero(t, n, "nothing stored")
	require.NoError(t, tx.Rollback(ctx))
	d, found, err := s.DeliverSignal(ctx, pool, id, "", "", "go", nil)
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, d.Woke)
}
