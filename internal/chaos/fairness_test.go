package chaos

// Fair shares across worker processes (docs/fairness.md): the fair order lives in the rows, so
// two processes that pick one queue together keep the keys' weights between them.

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// fairQueue is the fair set's queue.
const fairQueue = "fair"

// fairJob is the fair set's machine: a job of fairQueue that sleeps step.
func fairJob(step time.Duration) gendurable.Job[int] {
	return gendurable.Job[int]{Name: "fairjob", Queue: fairQueue, Perform: func(*gendurable.Ctx, int) error {
		time.Sleep(step)
		return nil
	}}
}

// Three keys backlogged at weights 1:2:4 (backlogs in the same proportion, so that all three last
// to the end), worked by two worker processes: in every window of the claims (in the claiming
// picks' transaction times, logged by a trigger) while all three had rows, each key's share is
// within 10% of its weight's, and both processes claimed. Windows of 10 s on 140,000 instances
// (GD_CHAOS=full); of 350 consecutive claims on 14,000 (CI: a window of 250 ms held as few as
// 40 claims as the workers began, where one claim is 2.5% of the window against a tolerance of
// 1.4% for A).
func TestFairSharesAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8)
	require.NoError(t, oracle.LogClaims(context.Background(), e.pool, e.schema))
	weights := map[string]float64{"A": 1, "B": 2, "C": 4}
	scale := oracle.Size(1_000, 10_000)
	job := fairJob(0)
	ins := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}, FairnessWeights: weights})
	total := 0
	for key, w := range map[string]int{"A": 2, "B": 4, "C": 8} {
		for done := 0; done < w*scale; done += 1000 {
			params := make([]gendurable.InsertManyParams, min(1000, w*scale-done))
			for i := range params {
				params[i] = gendurable.InsertManyParams{Input: job.With(i), Opts: &gendurable.InsertOpts{FairnessKey: key}}
			}
			_, err := ins.InsertMany(context.Background(), params)
			require.NoError(t, err)
			total += len(params)
		}
	}
	var workers []*worker
	for _, name := range []string{"w1", "w2"} {
		workers = append(workers, startWorker(t, workerCfg{URL: e.url, Schema: e.schema, Name: name, Machines: machinesFair,
			Queues: []string{fairQueue}, Conc: 20, PollMS: 50, LeaseMS: 30_000, HeartbeatMS: 6_000, StepMS: 2,
			FairWeights: weights, Quiet: true}))
	}
	deadline := time.Now().Add(oracle.Size(2*time.Minute, 10*time.Minute))
	for e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) < total {
		require.True(t, time.Now().Before(deadline), "every instance done in time")
		time.Sleep(200 * time.Millisecond)
	}
	for _, w := range workers {
		w.stop(t)
	}

	counts, err := oracle.ClaimSharesByCount(context.Background(), e.pool, e.schema, 350)
	window := "350 claims"
	if oracle.Full() {
		counts, err = oracle.ClaimShares(context.Background(), e.pool, e.schema, 10*time.Second)
		window = "10s"
	}
	require.NoError(t, err)
	require.NotEmpty(t, counts, "a full window while all three keys were backlogged")
	for win, c := range counts {
		n := c["A"] + c["B"] + c["C"]
		t.Logf("window %d (%s): A %d, B %d, C %d", win, window, c["A"], c["B"], c["C"])
		for key, w := range weights {
			share, want := float64(c[key])/float64(n), w/7
			require.InDelta(t, want, share, want/10, "window %d: key %s's share of %d claims", win, key, n)
		}
	}
	for _, name := range []string{"w1", "w2"} {
		n := e.count(t, `SELECT count(*) FROM {schema}.t_claims WHERE owner LIKE $1 || ':%'`, name)
		require.Positive(t, n, "claims of worker %s", name)
		t.Logf("worker %s claimed %d of %d", name, n, total)
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status <> 'done'`))
}
