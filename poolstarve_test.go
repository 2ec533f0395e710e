package gendurable_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Steps that hold every connection of a small pool (pgxpool's default is four on a machine of
// up to four cores), each in its own transaction for longer than the lease, starved the
// heartbeat, which went through the same pool: after a lease without a beat the client presumed
// its claims lost and cancelled every running step, again at each round, and each try cost an
// attempt. The heartbeat has a connection of its own: the steps wait their turn for a connection
// and finish, each run once.
func TestStepsHoldingThePoolKeepTheirLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool := durabledbtest.Pool(t, 4)
	var runs, cancelled, lost atomic.Int32
	job := gendurable.Job[int]{Name: "holder", Perform: func(ctx *gendurable.Ctx, _ int) error {
		runs.Add(1)
		tx, err := ctx.Tx()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		select {
		case <-time.After(2500 * time.Millisecond): // longer than the lease, the connection held
		case <-ctx.Done():
			cancelled.Add(1)
			return ctx.Err()
		}
		return nil
	}}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{job},
		Lease: 2 * time.Second, Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 8}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventHeartbeatLost {
				lost.Add(int32(ev.Count))
			}
		}}})
	require.NoError(t, err)
	start(t, cl)
	ids := make([]int64, 8)
	for i := range ids {
		r, err := cl.Insert(ctx, job.With(i), nil)
		require.NoError(t, err)
		ids[i] = r.ID
	}
	for _, id := range ids {
		res, err := cl.Await(ctx, id, 2*time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, res.Status)
		in, err := cl.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, in.Attempt, "instance %d", id)
		require.Empty(t, in.Errors, "instance %d", id)
	}
	require.Zero(t, lost.Load(), "no claim presumed lost")
	require.Zero(t, cancelled.Load(), "no step cancelled")
	require.Equal(t, int32(8), runs.Load(), "each step ran once")
}

// The heartbeat's own connection is opened as the pool opens its connections, its
// AfterConnect hook included: here the login role has no privilege on the schema and the hook
// takes on the role that has (SET ROLE), as applications that separate the two do. Opened from
// the configuration alone, its beats were refused, and the claims presumed lost. A pool that
// sets its sessions up at each acquire instead (PrepareConn), which a connection of the
// heartbeat's own cannot follow, has the beats sent through the pool after the first refusal.
func TestHeartbeatConnectionRunsThePoolsHooks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		onEach  bool // SET ROLE in PrepareConn (each acquire), not in AfterConnect
		ownConn int  // the heartbeat connections left open
	}{
		{"after connect", false, 1},
		{"at each acquire", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			_, runtime := runtimeRole(t, e)
			login := "gd_login_" + randHex(6)
			quoted := pgx.Identifier{login}.Sanitize()
			_, err := e.pool.Exec(ctx, "CREATE ROLE "+quoted+" LOGIN NOINHERIT IN ROLE "+pgx.Identifier{runtime}.Sanitize())
			require.NoError(t, err)
			t.Cleanup(func() {
				_, err := e.pool.Exec(context.Background(), "DROP ROLE "+quoted)
				require.NoError(t, err)
			})
			setRole := "SET ROLE " + pgx.Identifier{runtime}.Sanitize()
			pool := durabledbtest.Pool(t, 8, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.User = login
				if tc.onEach {
					cfg.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
						_, err := conn.Exec(ctx, setRole)
						return err == nil, err
					}
				} else {
					cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
						_, err := conn.Exec(ctx, setRole)
						return err
					}
				}
			})
			sink := &logSink{}
			var lost atomic.Int32
			job := gendurable.Job[int]{Name: "long", Perform: func(ctx *gendurable.Ctx, _ int) error {
				select {
				case <-time.After(1500 * time.Millisecond): // beats are needed: longer than the lease
				case <-ctx.Done():
					return ctx.Err()
				}
				return nil
			}}
			cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{job},
				Name: "hooked", Logger: slog.New(slog.NewTextHandler(sink, nil)),
				Lease: time.Second, Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 2}},
				Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
					if ev.Name == gendurable.EventHeartbeatLost {
						lost.Add(int32(ev.Count))
					}
				}}})
			require.NoError(t, err)
			start(t, cl)
			r, err := cl.Insert(ctx, job.With(0), nil)
			require.NoError(t, err)
			res, err := cl.Await(ctx, r.ID, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
			require.NoError(t, err)
			require.Equal(t, gendurable.AwaitDone, res.Status)
			in, err := cl.Get(ctx, r.ID)
			require.NoError(t, err)
			require.Equal(t, 1, in.Attempt)
			require.Empty(t, in.Errors)
			require.Zero(t, lost.Load(), "every beat went through")
			require.NotContains(t, sink.logs(), "heartbeat failed")
			if tc.onEach {
				require.Contains(t, sink.logs(), "beating through the pool")
			} else {
				require.NotContains(t, sink.logs(), "beating through the pool")
			}
			var own int
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = 'gendurable heartbeat hooked' AND usename = $1`, login).Scan(&own))
			require.Equal(t, tc.ownConn, own)
		})
	}
}
