package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/bridge"
	"github.com/stretchr/testify/require"
)

// An instance inserted in the caller's transaction starts once the transaction commits, on the
// client that works its queue, with the default transport (which cannot send with a commit) and
// its runner idle for seconds more: the client looks for the row until it sees it committed,
// here 300ms after the insert. A rolled-back insert never starts.
func TestInsertTxStartsAtItsCommitWithoutWaitingForAPoll(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	started := make(chan int, 10)
	job := gendurable.Job[counter]{Name: "outbox", Perform: func(_ *gendurable.Ctx, c counter) error {
		started <- c.N
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, PollInterval: time.Hour,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 2}}})
	start(t, cl)
	eng, _ := bridge.Engine(cl)
	// The idle runner backs off from 10ms, doubling: once its next pick is 10s away, nothing but a
	// wake makes it pick sooner, and the steps below (well under a second, several on a loaded
	// machine) end long before that pick.
	eventually(t, time.Minute, "an idle gap of ten seconds", func() bool { return eng.QuietFor("default") >= 10*time.Second })

	rolledBack, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = cl.InsertTx(ctx, rolledBack, job.With(counter{N: 1}), nil)
	require.NoError(t, err)
	require.NoError(t, rolledBack.Rollback(ctx))

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := cl.InsertTx(ctx, tx, job.With(counter{N: 2}), nil)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the caller's transaction goes on a while
	require.NoError(t, tx.Commit(ctx))
	quiet := eng.QuietFor("default")
	require.Greater(t, quiet, time.Second, "the runner was woken before the commit")
	select {
	case n := <-started:
		require.Equal(t, 2, n, "the rolled-back instance ran")
	case <-time.After(quiet - 500*time.Millisecond):
		t.Fatalf("the instance did not start within %v of its transaction's commit (the runner's next poll)", quiet)
	}
	eventually(t, 10*time.Second, "done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, res.ID) == 1
	})
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances`), "only the committed instance exists")
}
