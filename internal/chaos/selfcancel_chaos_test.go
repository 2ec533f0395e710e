//go:build chaos

package chaos

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/stretchr/testify/require"
)

// A worker whose heartbeat cannot reach the database for a whole lease presumes its claims lost
// and cancels their steps. The database may still show the claim as the worker's (no reaper has
// released it: the lease ran out a moment ago, or every node's writes were failing). A step that
// then returns its context's error failed because the worker cancelled it, not on its own: its
// claim is handed back as a lost lease (a recovery, no attempt spent), as the reaper would, and
// the step runs again. Before, the failure was applied under the claim like the step's own: an
// attempt spent, and a job on its last attempt failed for a heartbeat's outage.
func TestChaosSelfCancelledStepCostsNoAttempt(t *testing.T) {
	e := newEnv(t, 8)
	ctx := context.Background()
	var beatFails atomic.Bool
	defer fault.Set(fault.Heartbeat, func(subject string) error {
		if subject == "a" && beatFails.Load() {
			return errors.New("test: A's heartbeat cannot reach the database")
		}
		return nil
	})()
	var runs atomic.Int32
	cancelled := make(chan error, 1)
	job := gendurable.Job[int]{Name: "one-try", Queue: "q", MaxAttempts: 1,
		Perform: func(ctx *gendurable.Ctx, _ int) error {
			if runs.Add(1) > 1 {
				return nil
			}
			// The first run outlasts the lease with its heartbeat failing: the worker cancels it.
			beatFails.Store(true)
			<-ctx.Done()
			cancelled <- context.Cause(ctx)
			return ctx.Err()
		}}
	// No reaper anywhere: the claim stays the worker's in the database however late it is.
	a := e.client(t, &gendurable.Config{Name: "a", Machines: []gendurable.Machine{job}, PollInterval: 20 * time.Millisecond,
		Lease: time.Second, Heartbeat: 100 * time.Millisecond, Reaper: &gendurable.ReaperConfig{Disabled: true},
		GC: &gendurable.GCConfig{Disabled: true}, Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1}}})
	start(t, a)
	res, err := a.Insert(ctx, job.With(0), nil)
	require.NoError(t, err)
	select {
	case cause := <-cancelled:
		require.ErrorIs(t, cause, gendurable.ErrLeaseLost)
	case <-time.After(30 * time.Second):
		t.Fatal("the step was never cancelled")
	}
	beatFails.Store(false)
	eventually(t, 30*time.Second, "the job finished", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status IN ('done', 'failed')`, res.ID) == 1
	})
	var status string
	var attempt, recoveries int
	var kinds []string
	require.NoError(t, e.pool.QueryRow(ctx, e.q(`SELECT status, attempt, recoveries,
		ARRAY(SELECT x ->> 'kind' FROM jsonb_array_elements(coalesce(errors, '[]')) AS x)
		FROM {schema}.instances WHERE id = $1`), res.ID).Scan(&status, &attempt, &recoveries, &kinds))
	require.Equal(t, "done", status, "the job failed for its worker's heartbeat (errors of kinds %v)", kinds)
	require.EqualValues(t, 2, runs.Load(), "the step ran again after its cancellation")
	require.Equal(t, 1, attempt, "the cancelled run spent an attempt")
	require.Equal(t, 1, recoveries, "the cancelled run counts as a recovery")
	require.Equal(t, []string{"lease"}, kinds, "the cancelled run is recorded as a lost lease")
}
