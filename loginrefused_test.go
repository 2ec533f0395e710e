package gendurable_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A server that refuses new connections for a while (the role's login revoked during a password
// rotation, a pg_hba.conf reload gone wrong) answers the pool's next dial with an error of its own
// (28000 here). That says nothing about the outcome the connection was for: the committer keeps
// the outcomes and retries them until logins are back, and each instance moves on with its step
// run once, neither failed ("rejected") nor dropped and left to the reaper.
func TestOutcomesWaitOutRefusedLogins(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool, role := runtimeRole(t, e)
	quoted := pgx.Identifier{role}.Sanitize()

	const n = 3
	var runs atomic.Int32
	started, release := make(chan int64, n), make(chan struct{})
	m := gendurable.FSM[int]{Name: "refused", Start: "a", Steps: map[string]gendurable.StepFunc[int]{
		"a": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
			runs.Add(1)
			started <- ctx.ID
			<-release
			return gendurable.Done(s), nil
		},
	}}
	refused := make(chan error, 3)
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: n}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			var pgErr *pgconn.PgError
			if ev.Name == gendurable.EventCommitFailed && errors.As(ev.Err, &pgErr) && pgErr.Code == "28000" {
				select {
				case refused <- ev.Err:
				default:
				}
			}
		}}})
	require.NoError(t, err)
	start(t, cl)
	ids := make([]int64, n)
	for i := range ids {
		r, err := cl.Insert(ctx, m.With(i), nil)
		require.NoError(t, err)
		ids[i] = r.ID
	}
	for range n {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the steps did not start")
		}
	}

	// Logins are refused from now on, and every session the pool holds is ended: its next
	// statement dials, and the server refuses the dial.
	_, err = e.pool.Exec(ctx, "ALTER ROLE "+quoted+" NOLOGIN")
	require.NoError(t, err)
	loginBack := false
	restore := func() {
		if !loginBack {
			loginBack = true
			_, err := e.pool.Exec(ctx, "ALTER ROLE "+quoted+" LOGIN")
			require.NoError(t, err)
		}
	}
	defer restore()
	_, err = e.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
	require.NoError(t, err)
	close(release)
	// Three refused tries: the outcomes are kept through more than one.
	for range 3 {
		select {
		case err := <-refused:
			require.ErrorContains(t, err, "not permitted to log in")
		case <-time.After(30 * time.Second):
			t.Fatal("the outcome commits did not meet the refused login three times")
		}
	}
	restore()

	for _, id := range ids {
		res, err := cl.Await(ctx, id, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, res.Status, "instance %d", id)
		in, err := cl.Get(ctx, id)
		require.NoError(t, err)
		require.Empty(t, in.Errors, "instance %d: no error recorded, neither a rejection nor a lost lease", id)
	}
	require.Equal(t, int32(n), runs.Load(), "each step ran once")
}
