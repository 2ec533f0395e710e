package gendurable_test

// The process-fault tests of the reliability suite (RELIABILITY.md §4.2): T1 (kill -9 loop),
// T1b (pause past the lease), T1c (SIGTERM drain) and T4 (worker-id collision). Each is seeded
// (seed=N; replay with GD_SEED=N), ends with the oracle's invariants and reports a chaos-summary
// line; GD_CHAOS=full runs the full size.

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/oracle"
	"github.com/stretchr/testify/require"
)

// doneCount counts the instances done.
func doneCount(t *testing.T, e *env) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`)
}

// T1: three workers, one SIGKILLed at random every U(200ms, 1s) and restarted at once under the
// same name (so startup reclaim meets its predecessor's claims), until every instance is done.
// Nothing is lost or finished twice, every repeated effect comes from a killed process, and the
// last instance finishes within lease + 2 × reaper + 3s of the last kill. A fault-free run of the
// same workers first gives the throughput baseline.
func TestKillLoopLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, oracle.Install(ctx, e.pool, e.schema))
	deadlocksBefore, err := oracle.Deadlocks(ctx, e.pool)
	require.NoError(t, err)
	seed, rng := oracle.Seed(t)
	n, baseN := oracle.Size(1000, 10000), oracle.Size(200, 1000)
	began := time.Now()
	c := newCrew(t, e, 3, nil, t1Worker()...)

	baseFrom := time.Now()
	insertLinear(t, e, baseN)
	eventually(t, 2*time.Minute, "the baseline done", func() bool { return doneCount(t, e) == baseN })
	baseline := throughput(t, e, baseFrom, time.Now())

	from := time.Now()
	insertLinear(t, e, n)
	c.killLoop(rng, oracle.Size(3*time.Minute, 15*time.Minute),
		func() time.Duration { return time.Duration(200+rng.IntN(800)) * time.Millisecond },
		func() bool { return doneCount(t, e) == n+baseN })
	var lastDone time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT max(at) FROM {schema}.t_outcome_log WHERE new_status = 'done'`, e.schema)).Scan(&lastDone))
	tail := lastDone.Sub(c.lastKill)
	faulted := throughput(t, e, from, lastDone)
	t.Logf("%d kills; %.0f steps/s under kills, %.0f fault-free; the last instance done %v after the last kill",
		c.kills, faulted, baseline, tail.Round(time.Millisecond))

	require.Zero(t, unexplainedDuplicates(t, e, c.faulted), "unexplained duplicate effects")
	verdict(t, e, oracle.Opts{N: n + baseN, Effects: true, Counter: true, Path: linearPath, DeadlocksBefore: deadlocksBefore},
		oracle.Summary{Test: "T1 kill -9 loop", Seed: seed, Instances: n + baseN, Kills: c.kills,
			Throughput: faulted, Baseline: baseline, Seconds: time.Since(began).Seconds()})
	require.Positive(t, c.kills)
	if oracle.Full() {
		require.GreaterOrEqual(t, c.kills, 50, "the full size kills at least 50 times")
	}
	require.LessOrEqual(t, tail, t1Lease+2*t1Reaper+3*time.Second,
		"the last instance finishes within lease + 2 × reaper + 3s of the last kill")
}
