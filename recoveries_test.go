package gendurable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// A claim lost to a crashed worker costs the instance no attempt: the reaper's release gives the
// attempt back and counts a recovery instead. An instance whose step has MaxAttempts 2 survives
// three lost claims and then runs to its end; the recovery past ReaperConfig.MaxRecoveries fails
// one, saying why.
func TestLostClaimsCostRecoveriesNotAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "fragile", MaxAttempts: 2, Perform: func(*gendurable.Ctx, int) error { return nil }}
	reaper := e.client(t, &gendurable.Config{Name: "reaper", Machines: []gendurable.Machine{job},
		Reaper: &gendurable.ReaperConfig{Interval: 20 * time.Millisecond, MaxRecoveries: 3}})
	start(t, reaper)
	survivor, err := reaper.Insert(ctx, job.With(1), nil)
	require.NoError(t, err)
	doomed, err := reaper.Insert(ctx, job.With(2), nil)
	require.NoError(t, err)
	// crash claims id as a pick would (attempt + 1) for a worker that then dies: its lease is
	// already over, and the reaper releases it.
	crash := func(id int64, k int) *gendurable.Instance {
		t.Helper()
		e.exec(t, `UPDATE {schema}.instances SET status = 'executing', attempt = attempt + 1, locked_by = $2,
			locked_until = now() - interval '1 second' WHERE id = $1 AND status = 'available'`, id, fmt.Sprintf("ghost-%d#%d", id, k))
		var in *gendurable.Instance
		eventually(t, 10*time.Second, "the reaper releases the lost claim", func() bool {
			in, err = reaper.Get(ctx, id)
			require.NoError(t, err)
			return in.Status != gendurable.StatusExecuting
		})
		return in
	}
	for k := 1; k <= 3; k++ {
		for _, id := range []int64{survivor.ID, doomed.ID} {
			in := crash(id, k)
			require.Equal(t, gendurable.StatusAvailable, in.Status, "recovery %d of at most 3", k)
			require.Equal(t, 0, in.Attempt, "a lost claim costs no attempt")
			require.Equal(t, k, in.Recoveries)
			last := in.Errors[len(in.Errors)-1]
			require.Equal(t, "lease", last.Kind)
			require.Equal(t, 1, last.Attempt, "the error names the try that was lost")
		}
	}
	// The fourth lost claim of the step is one too many.
	in := crash(doomed.ID, 4)
	require.Equal(t, gendurable.StatusFailed, in.Status)
	require.Equal(t, 4, in.Recoveries)
	require.NotNil(t, in.FinalizedAt)
	require.Contains(t, in.Errors[len(in.Errors)-1].Error, "recovery 4 of this step, past the limit of 3")

	// Three recoveries past MaxAttempts 2, the survivor still runs, and finishes.
	worker := e.client(t, &gendurable.Config{Name: "worker", Machines: []gendurable.Machine{job},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 1}}})
	start(t, worker)
	eventually(t, 10*time.Second, "the survivor done", func() bool {
		in, err := reaper.Get(ctx, survivor.ID)
		require.NoError(t, err)
		return in.Status == gendurable.StatusDone
	})
	in, err = reaper.Get(ctx, survivor.ID)
	require.NoError(t, err)
	require.Equal(t, 1, in.Attempt, "its one try that ran")
	require.Equal(t, 3, in.Recoveries, "the row keeps the count of its last step")
}

func TestMaxRecoveriesIsValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, n := range []int{-1, 1 << 31} {
		_, err := gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Reaper: &gendurable.ReaperConfig{MaxRecoveries: n}})
		var ce *gendurable.ConfigError
		require.ErrorAs(t, err, &ce, "MaxRecoveries %d", n)
		require.Equal(t, "Reaper.MaxRecoveries", ce.Field)
	}
}
