package gendurable_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A heartbeat that finds a running step's claim gone cancels the step only once its server has
// committed a transaction that the server's synchronous standbys acknowledged. A beat that holds
// none of its claims writes nothing, so its commit waits for no standby: on an old primary
// restarted read-write after a failover, before it is demoted, its "lost" would cancel steps whose
// claims the new primary still holds. On a cluster of the test's own, the server is set to wait
// for a standby that never comes, and the test takes the step's claim away in a transaction that
// does not wait for it. The beat's confirmation is seen waiting for the standby while the step
// runs on; once the server stops waiting for standbys, the step is cancelled for its lost claim.
// (The client's lease is long: no beat gives up for lack of time, which would cancel the step on
// the client's own clock.)
func TestHeartbeatCancelsAStepOnlyAfterAnAcknowledgedCommit(t *testing.T) {
	t.Parallel()
	e, cluster := privateEnv(t, nil)
	ctx := context.Background()
	started := make(chan int64, 1)
	cause := make(chan error, 1)
	job := gendurable.Job[int]{Name: "hb", Queue: "hbq", MaxAttempts: 1, Perform: func(c *gendurable.Ctx, _ int) error {
		started <- c.ID
		<-c.Done()
		cause <- context.Cause(c)
		return c.Err()
	}}
	var lost atomic.Int64
	hook := func(ev gendurable.Event) {
		if ev.Name == gendurable.EventHeartbeatLost {
			lost.Add(1)
		}
	}
	w := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, Heartbeat: 50 * time.Millisecond, Lease: 10 * time.Minute,
		Queues: map[string]gendurable.QueueConfig{"hbq": {Concurrency: 1}}, Hooks: []func(gendurable.Event){hook}})
	start(t, w)
	_, err := w.Insert(ctx, job.With(1), nil)
	require.NoError(t, err)
	var id int64
	select {
	case id = <-started:
	case <-time.After(time.Minute):
		t.Fatal("the step did not start")
	}

	probe, err := pgx.Connect(ctx, cluster.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = probe.Close(context.Background()) })
	_, err = probe.Exec(ctx, `CREATE TABLE gendurable_test_probe (id bigserial PRIMARY KEY)`)
	require.NoError(t, err)
	probePID := probe.PgConn().PID()

	// The claim is taken away in a transaction that holds the row until the server waits for
	// standbys: meanwhile beats skip the locked row (they neither extend it nor call it lost).
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = local`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, expand(`UPDATE {schema}.instances SET locked_by = 'another worker' WHERE id = $1`, e.schema), id)
	require.NoError(t, err)
	e.exec(t, `ALTER SYSTEM SET synchronous_standby_names = 'gendurable_test_absent'`)
	e.exec(t, `SELECT pg_reload_conf()`)
	t.Cleanup(func() {
		e.exec(t, `ALTER SYSTEM RESET synchronous_standby_names`)
		e.exec(t, `SELECT pg_reload_conf()`)
	})
	// The setting is in force once a write waits for the standby: the probe writes, on its own
	// connection, until one of its writes is seen waiting (a write that is merely slow is not).
	probeCtx, stopProbe := context.WithCancel(ctx)
	probing := make(chan struct{})
	go func() {
		defer close(probing)
		for probeCtx.Err() == nil {
			if _, err := probe.Exec(probeCtx, `INSERT INTO gendurable_test_probe DEFAULT VALUES`); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { stopProbe(); <-probing })
	deadline := time.Now().Add(time.Minute)
	for e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'`, probePID) == 0 {
		require.True(t, time.Now().Before(deadline), "the server never began to wait for the standby")
		time.Sleep(10 * time.Millisecond)
	}
	stopProbe() // (its connection closes; its backend waits on, as the standby never comes)
	<-probing
	require.NoError(t, tx.Commit(ctx))

	// The confirmation waits for the standby itself, or for the row lock of a registry refresh of
	// the same client's row that committed since the setting and waits for the standby in turn (a
	// transaction keeps its locks until the standbys acknowledge its commit).
	deadline = time.Now().Add(time.Minute)
	for e.count(t, `SELECT count(*) FROM pg_stat_activity AS a
			WHERE a.query LIKE '%SET seen_at = now() WHERE id =%' AND (a.wait_event = 'SyncRep' OR EXISTS (
				SELECT FROM pg_stat_activity AS b WHERE b.pid = ANY (pg_blocking_pids(a.pid)) AND b.wait_event = 'SyncRep'))`) == 0 {
		require.True(t, time.Now().Before(deadline), "no heartbeat waited for the standby to confirm the lost claim")
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case c := <-cause:
		t.Fatalf("the step was cancelled (%v) before the server acknowledged the lost claim", c)
	default:
	}
	require.Zero(t, lost.Load(), "heartbeat.lost before the server acknowledged the lost claim")

	e.exec(t, `ALTER SYSTEM RESET synchronous_standby_names`)
	e.exec(t, `SELECT pg_reload_conf()`)
	select {
	case c := <-cause:
		require.ErrorIs(t, c, gendurable.ErrLeaseLost)
	case <-time.After(time.Minute):
		t.Fatal("the step was not cancelled once the server acknowledged the lost claim")
	}
	// (The event follows the cancellation, which the step may see first.)
	eventually(t, time.Minute, "a heartbeat.lost event", func() bool { return lost.Load() > 0 })
}
