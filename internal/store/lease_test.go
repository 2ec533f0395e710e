package store

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// leaseFixture is a queue with rows of a leased key, rows with no key, a K = 1 key and another
// gated key, under gates g (1000 slots over 2 shards).
type leaseFixture struct {
	s      *Store
	db     DB
	schema string
	gates  *Gates
}

func newLeaseFixture(t *testing.T) *leaseFixture {
	t.Helper()
	s, pool, schema := newTestStore(t, 3)
	f := &leaseFixture{s: s, db: pool, schema: schema,
		gates: &Gates{Names: []string{"g"}, Limits: []int32{1000}, Shards: []int32{2}}}
	var rows []InsertRow
	for _, k := range []string{"g:a", "", "g:a", "solo", "g:b", "", "g:a"} {
		rows = append(rows, InsertRow{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5, MaxAttempts: 1,
			ConcurrencyKey: k, Weight: 1})
	}
	_, err := s.InsertMany(context.Background(), pool, rows)
	require.NoError(t, err)
	return f
}

// counters returns every gate counter as "key/shard=held" and the leases as "key/shard/owner=slots".
func (f *leaseFixture) counters(t *testing.T) (gates, leases []string) {
	t.Helper()
	strs := func(query string) []string {
		t.Helper()
		rows, err := f.db.Query(context.Background(), fmt.Sprintf(query, f.schema))
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	return strs(`SELECT key || '/' || shard || '=' || held FROM %q.gates ORDER BY 1`),
		strs(`SELECT key || '/' || shard || '/' || owner || '=' || slots FROM %q.gate_leases ORDER BY 1`)
}

func (f *leaseFixture) exec(t *testing.T, sql string) {
	t.Helper()
	_, err := f.db.Exec(context.Background(), fmt.Sprintf(sql, f.schema))
	require.NoError(t, err)
}

// claimedKeys returns each claimed row's key and shard ("key/shard", "-" for none), sorted.
func claimedKeys(rows []Claimed) []string {
	var got []string
	for _, c := range rows {
		k, sh := "-", "-"
		if c.ConcurrencyKey != nil {
			k = *c.ConcurrencyKey
		}
		if c.ConcurrencyShard != nil {
			sh = fmt.Sprint(*c.ConcurrencyShard)
		}
		got = append(got, k+"/"+sh)
	}
	sort.Strings(got)
	return got
}

// A lease debits its slots from the emptiest roomy shard at once; a pick under it claims the
// leased key's rows into that shard without touching the counter, claims the rows with no key,
// and leaves the rows of other keys (a K = 1 key, another gated key) for an admission pick.
func TestPickUnderALeaseClaimsIntoItAndLeavesOtherKeys(t *testing.T) {
	f := newLeaseFixture(t)
	ctx := context.Background()
	// Shard 0 is busier: the lease goes to shard 1.
	f.exec(t, `INSERT INTO %q.gates (key, shard, held, capacity) VALUES ('g:a', 0, 100, 500)`)
	// A shard must have want × roomy free slots: 400 × 2 > 500 refuses.
	_, ok, err := f.s.LeaseGate(ctx, f.db, "g:a", 1000, 2, "r1", 400, 2, time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a lease that would leave its shard less than roomy")
	shard, ok, err := f.s.LeaseGate(ctx, f.db, "g:a", 1000, 2, "r1", 10, 4, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int16(1), shard, "the emptiest shard")
	gates, leases := f.counters(t)
	require.Equal(t, []string{"g:a/0=100", "g:a/1=10"}, gates, "the lease's slots are debited")
	require.Equal(t, []string{"g:a/1/r1=10"}, leases)

	l := &Lease{Key: "g:a", Shard: 1, Owner: "r1"}
	res, err := f.s.Pick(ctx, f.db, "q", 7, "o#1", PickOpts{Lease: time.Minute, Gates: f.gates, Lane: Lane{Gate: l}})
	require.NoError(t, err)
	require.Equal(t, []string{"-/-", "-/-", "g:a/1", "g:a/1", "g:a/1"}, claimedKeys(res.Rows))
	require.Equal(t, 7, res.Considered, "the K = 1 and other gated rows were admissible: in the window, left")
	gates, _ = f.counters(t)
	require.Equal(t, []string{"g:a/0=100", "g:a/1=10"}, gates, "no counter written by the pick under the lease")

	// The rows left are an admission pick's.
	res, err = f.s.Pick(ctx, f.db, "q", 7, "o#2", PickOpts{Lease: time.Minute, Gates: f.gates})
	require.NoError(t, err)
	require.Equal(t, []string{"g:b/0", "solo/-"}, claimedKeys(res.Rows))
}

// A pick under a lease that is gone, expired or another runner's claims no row of its key.
func TestPickUnderALostLeaseClaimsNothingOfItsKey(t *testing.T) {
	for name, damage := range map[string]string{
		"gone":    `DELETE FROM %q.gate_leases`,
		"expired": `UPDATE %q.gate_leases SET expires_at = now() - interval '1 millisecond'`,
		"foreign": `UPDATE %q.gate_leases SET owner = 'r2'`,
	} {
		t.Run(name, func(t *testing.T) {
			f := newLeaseFixture(t)
			ctx := context.Background()
			shard, ok, err := f.s.LeaseGate(ctx, f.db, "g:a", 1000, 2, "r1", 10, 4, time.Minute)
			require.NoError(t, err)
			require.True(t, ok)
			f.exec(t, damage)
			res, err := f.s.Pick(ctx, f.db, "q", 7, "o#1", PickOpts{Lease: time.Minute, Gates: f.gates, Lane: Lane{Gate: &Lease{Key: "g:a", Shard: shard, Owner: "r1"}}})
			require.NoError(t, err)
			require.Equal(t, []string{"-/-", "-/-"}, claimedKeys(res.Rows))
		})
	}
}

// A lease grows only while it is there, unexpired, and its shard stays roomy; it is released once,
// and its unused slots go back only if the reconciler had not removed it first.
func TestLeaseGrowsAndReleasesOnlyWhileItLives(t *testing.T) {
	f := newLeaseFixture(t)
	ctx := context.Background()
	shard, ok, err := f.s.LeaseGate(ctx, f.db, "g:a", 1000, 2, "r1", 10, 4, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	l := Lease{Key: "g:a", Shard: shard, Owner: "r1"}
	ok, err = f.s.GrowLease(ctx, f.db, l, 10, 4)
	require.NoError(t, err)
	require.True(t, ok)
	gates, leases := f.counters(t)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d=20", shard)}, gates)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d/r1=20", shard)}, leases)
	ok, err = f.s.GrowLease(ctx, f.db, l, 100, 5)
	require.NoError(t, err)
	require.False(t, ok, "480 free slots are not 5 × 100")
	ok, err = f.s.GrowLease(ctx, f.db, Lease{Key: "g:a", Shard: shard, Owner: "r2"}, 10, 1)
	require.NoError(t, err)
	require.False(t, ok, "a lease that does not exist does not grow into one")
	gates, leases = f.counters(t)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d=20", shard)}, gates)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d/r1=20", shard)}, leases)

	// Two of its slots are in use (their claims credit the counter themselves): 18 go back.
	require.NoError(t, f.s.ReleaseLease(ctx, f.db, l, 18))
	gates, leases = f.counters(t)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d=2", shard)}, gates)
	require.Empty(t, leases)
	require.NoError(t, f.s.ReleaseLease(ctx, f.db, l, 18))
	gates, _ = f.counters(t)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d=2", shard)}, gates, "a second release gives nothing back")

	// Renewal names the leases that are still there.
	_, ok, err = f.s.LeaseGate(ctx, f.db, "g:a", 1000, 2, "r1", 10, 4, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	renewed, err := f.s.RenewLeases(ctx, f.db, []Lease{{Key: "g:a", Shard: 0, Owner: "r1"}, {Key: "g:a", Shard: 1, Owner: "r1"},
		{Key: "g:b", Shard: 0, Owner: "r1"}}, time.Minute)
	require.NoError(t, err)
	require.Len(t, renewed, 1)
}

// The reconciler leaves a counter alone while it lies between its executions and its executions
// plus its live leases' slots, brings it into that range otherwise, and removes an expired lease
// with its slots, unless a pick is admitting against it right now (it holds the lease FOR KEY
// SHARE until it commits): then the lease counts as live until the next sweep.
func TestReconcilerCountsLiveLeasesAndRemovesExpiredOnes(t *testing.T) {
	f := newLeaseFixture(t)
	ctx := context.Background()
	shard, ok, err := f.s.LeaseGate(ctx, f.db, "g:a", 1000, 2, "r1", 10, 4, 2*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	l := &Lease{Key: "g:a", Shard: shard, Owner: "r1"}
	res, err := f.s.Pick(ctx, f.db, "q", 7, "o#1", PickOpts{Lease: time.Minute, Gates: f.gates, Lane: Lane{Gate: l}})
	require.NoError(t, err)
	require.Len(t, res.Rows, 5) // three of g:a, executing in the lease's shard
	held := func() string {
		gates, _ := f.counters(t)
		return fmt.Sprint(gates)
	}
	reconcile := func() (int, int) {
		t.Helper()
		rep, rem, err := f.s.ReconcileGates(ctx, f.db, f.gates)
		require.NoError(t, err)
		return rep, rem
	}
	want := func(n int) string { return fmt.Sprintf("[g:a/%d=%d]", shard, n) }

	rep, _ := reconcile()
	require.Zero(t, rep, "10 held, 3 executing, a live lease of 10: within range")
	require.Equal(t, want(10), held())
	f.exec(t, `UPDATE %q.gates SET held = 20`)
	reconcile()
	require.Equal(t, want(13), held(), "a leak above the executions plus the leases is repaired to that")
	f.exec(t, `UPDATE %q.gates SET held = 1`)
	reconcile()
	require.Equal(t, want(3), held(), "a counter below its executions is raised to them")
	f.exec(t, `UPDATE %q.gates SET held = 10`)

	// A pick admits a row against the lease in a transaction that stays open past the lease's
	// expiry. (The lease is read, and locked, only for a row of its key.)
	_, err = f.s.InsertMany(ctx, f.db, []InsertRow{{Machine: "m", Step: "s", State: "{}", Queue: "q", Priority: 5,
		MaxAttempts: 1, ConcurrencyKey: "g:a", Weight: 1}})
	require.NoError(t, err)
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err = f.s.Pick(ctx, tx, "q", 7, "o#2", PickOpts{Lease: time.Minute, Gates: f.gates, Lane: Lane{Gate: l}})
	require.NoError(t, err)
	require.Equal(t, []string{fmt.Sprintf("g:a/%d", shard)}, claimedKeys(res.Rows))
	time.Sleep(2100 * time.Millisecond)
	reconcile()
	_, leases := f.counters(t)
	require.Len(t, leases, 1, "a lease a pick holds is not removed under it")
	require.Equal(t, want(10), held())
	require.NoError(t, tx.Commit(ctx))

	rep, _ = reconcile()
	require.Equal(t, 2, rep, "the expired lease removed, and its counter repaired")
	_, leases = f.counters(t)
	require.Empty(t, leases)
	require.Equal(t, want(4), held(), "the expired lease's unused slots went with it")
}

// A transaction of the library's own whose client stops between two statements (a paused process) is
// ended by the server after OwnTxIdleTimeout: the locks it took do not hold up the other
// nodes for as long as the process is stopped.
func TestOwnTxOfAStoppedWorkerEnds(t *testing.T) {
	s, pool, schema := newTestStore(t, 3)
	s.OwnTxIdleTimeout = 300 * time.Millisecond
	ctx := context.Background()
	ins, err := s.InsertMany(ctx, pool, []InsertRow{{Machine: "m", Step: "s", State: `{}`, Queue: "q", Priority: 5, MaxAttempts: 1}})
	require.NoError(t, err)
	id := ins[0].ID
	tx, err := s.BeginOwn(ctx, pool)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE `+schema+`.instances SET priority = 9 WHERE id = $1`, id)
	require.NoError(t, err)
	// The worker stops here. Another node's statement waits for the row; it gets it once the
	// server has ended the stopped transaction's session (its lock timeout is far longer).
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `SET LOCAL lock_timeout = '60s'`)
	require.NoError(t, err)
	_, err = other.Exec(ctx, `UPDATE `+schema+`.instances SET priority = 3 WHERE id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, other.Commit(ctx))
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the stopped transaction's session was ended")
	var prio int
	require.NoError(t, pool.QueryRow(ctx, `SELECT priority FROM `+schema+`.instances WHERE id = $1`, id).Scan(&prio))
	require.Equal(t, 3, prio, "the stopped transaction rolled back; the other's update stands")
}

// The bound of BeginOwn never lengthens a shorter one the session already has (a role's guard),
// and applies where the session has none.
func TestOwnTxKeepsAShorterIdleBound(t *testing.T) {
	s, pool, _ := newTestStore(t, 3)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	bound := func(session string) string {
		_, err := conn.Exec(ctx, `SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', $1, false)`, session)
		require.NoError(t, err)
		tx, err := s.BeginOwn(ctx, conn)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var got string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&got))
		return got
	}
	require.Equal(t, "2s", bound("2s"))
	require.Equal(t, "10s", bound("0"))
	require.Equal(t, "10s", bound("1min"))
	_, err = conn.Exec(ctx, `RESET idle_in_transaction_session_timeout`)
	require.NoError(t, err)
}
