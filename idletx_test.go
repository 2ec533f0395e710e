package gendurable_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A role's idle_in_transaction_session_timeout (a common guard) ends the session of a step that
// writes through Ctx.Tx and then makes a slow call before returning: the server rolls the
// transaction back and closes the connection. That is the step's failure, not a lost session:
// it is counted as a try, recorded with its kind "tx", and handed to Handle as
// ErrTxIdleTimeout, so the instance fails once its tries are spent. Handed back untouched, as a
// session lost to a restart is, the step ran again at once, for ever, with no error recorded.
func TestStepTxIdlePastTheTimeoutIsTheStepsFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool := durabledbtest.Pool(t, 8, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "200ms"
	})
	_, err := e.pool.Exec(ctx, expand(`CREATE TABLE {schema}.idle_effects (id bigint)`, e.schema))
	require.NoError(t, err)

	var runs, handled atomic.Int32
	m := gendurable.FSM[int]{Name: "idler", Start: "a", MaxAttempts: 2,
		Steps: map[string]gendurable.StepFunc[int]{
			"a": func(ctx *gendurable.Ctx, s int) (gendurable.Outcome, error) {
				runs.Add(1)
				tx, err := ctx.Tx()
				if err != nil {
					return gendurable.Outcome{}, err
				}
				if _, err := tx.Exec(ctx, expand(`INSERT INTO {schema}.idle_effects VALUES ($1)`, e.schema), ctx.ID); err != nil {
					return gendurable.Outcome{}, err
				}
				time.Sleep(time.Second) // a slow call, the transaction idle meanwhile
				return gendurable.Done(s), nil
			},
		},
		Handle: func(ctx *gendurable.Ctx, _ int, err error) gendurable.Outcome {
			if errors.Is(err, gendurable.ErrTxIdleTimeout) {
				handled.Add(1)
			}
			if ctx.Attempt >= ctx.MaxAttempts {
				return gendurable.Stop(err)
			}
			return gendurable.Retry(10 * time.Millisecond)
		},
	}
	// A job gets the same, through its retry policy: one try, then failed.
	job := gendurable.Job[int]{Name: "idlejob", MaxAttempts: 1, Perform: func(ctx *gendurable.Ctx, _ int) error {
		runs.Add(1)
		tx, err := ctx.Tx()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, expand(`INSERT INTO {schema}.idle_effects VALUES ($1)`, e.schema), ctx.ID); err != nil {
			return err
		}
		time.Sleep(time.Second)
		return nil
	}}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{m, job},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 2}}})
	require.NoError(t, err)
	start(t, cl)
	r, err := cl.Insert(ctx, m.With(0), nil)
	require.NoError(t, err)
	rj, err := cl.Insert(ctx, job.With(0), nil)
	require.NoError(t, err)

	res, err := cl.Await(ctx, r.ID, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitFailed, res.Status)
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Len(t, in.Errors, 2, "one error per try")
	for i, er := range in.Errors {
		require.Equal(t, "tx", er.Kind, "try %d", i+1)
		require.Equal(t, i+1, er.Attempt)
		require.Contains(t, er.Error, "idle_in_transaction_session_timeout")
	}
	res, err = cl.Await(ctx, rj.ID, time.Minute, &gendurable.AwaitOpts{UntilTerminal: true})
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitFailed, res.Status)
	in, err = cl.Get(ctx, rj.ID)
	require.NoError(t, err)
	require.Len(t, in.Errors, 1)
	require.Equal(t, "tx", in.Errors[0].Kind)
	require.ErrorContains(t, res.Err(), "idle_in_transaction_session_timeout", "Await's error names the cause")

	require.Equal(t, int32(3), runs.Load(), "each step ran once per try")
	require.Equal(t, int32(2), handled.Load(), "Handle saw ErrTxIdleTimeout on each try")
	var effects int
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT count(*) FROM {schema}.idle_effects`, e.schema)).Scan(&effects))
	require.Zero(t, effects, "the writes of the ended transactions were rolled back")
}
