package chaos

// The process-fault tests of the reliability suite (docs/reliability.md): T1 (kill -9 loop),
// T1b (pause past the lease), T1c (SIGTERM drain) and T4 (worker-id collision). Each is seeded
// (seed=N; replay with GD_SEED=N), ends with the oracle's invariants and reports a chaos-summary
// line; GD_CHAOS=full runs the full size.

import (
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// doneCount counts the instances done.
func doneCount(t *testing.T, e *env) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`)
}

// T1: three workers (one of them prefetching), one SIGKILLed at random every U(200ms, 1s) and
// restarted at once under the same name (so startup reclaim meets its predecessor's claims), until every instance is done.
// Nothing is lost or finished twice, every repeated effect comes from a killed process, and the
// last instance finishes within lease + 2 × reaper + 3s of the last kill. A fault-free run of the
// same workers first gives the throughput baseline.
func TestKillLoopLosesNothing(t *testing.T) {
	t.Parallel()
	e, ctx := oracleEnv(t)
	seed, rng := oracle.Seed(t)
	n, baseN := oracle.Size(600, 10000), oracle.Size(200, 1000)
	began := time.Now()
	// One of the three prefetches (QueueConfig.Prefetch): its waiting claims die with it too.
	c := newVariedCrew(t, e, 3, nil, e.t1Cfg(""), func(i int, c *workerCfg) {
		if i == 0 {
			c.Prefetch = 3 * c.Conc
		}
	})

	baseFrom := time.Now()
	insertLinear(t, e, baseN)
	eventually(t, 2*time.Minute, "the baseline done", func() bool { return doneCount(t, e) == baseN })
	baseline := throughput(t, e, baseFrom, time.Now().Add(time.Second))

	from := time.Now()
	insertLinear(t, e, n)
	c.killLoop(rng, oracle.Size(3*time.Minute, 15*time.Minute),
		func() time.Duration { return time.Duration(200+rng.IntN(800)) * time.Millisecond },
		func() bool { return doneCount(t, e) == n+baseN })
	var lastDone time.Time
	require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT max(at) FROM {schema}.t_outcome_log WHERE new_status = 'done'`, e.schema)).Scan(&lastDone))
	tail := lastDone.Sub(c.lastKill)
	faulted := throughput(t, e, from, lastDone.Add(time.Microsecond))
	t.Logf("%d kills; %.0f steps/s under kills, %.0f fault-free; the last instance done %v after the last kill",
		c.kills, faulted, baseline, tail.Round(time.Millisecond))

	require.Zero(t, unexplainedDuplicates(t, e, c.faulted, nil), "unexplained duplicate effects")
	verdict(t, e, oracle.Opts{N: n + baseN, Effects: true, Counter: true, Path: linearPath},
		oracle.Summary{Test: "T1 kill -9 loop", Seed: seed, Instances: n + baseN, Kills: c.kills,
			Throughput: faulted, Baseline: baseline, Seconds: time.Since(began).Seconds()})
	require.Positive(t, c.kills)
	if oracle.Full() {
		require.GreaterOrEqual(t, c.kills, 50, "the full size kills at least 50 times")
	}
	require.LessOrEqual(t, tail, t1Lease+2*t1Reaper+3*time.Second,
		"the last instance finishes within lease + 2 × reaper + 3s of the last kill")
}

// runningBy counts the rows executing under claims of the worker named name whose step began in
// its process pid (the step's effect is recorded): its outcome is still to come.
func runningBy(t *testing.T, e *env, name string, pid int) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances i WHERE status = 'executing' AND locked_by LIKE $1
		AND EXISTS (SELECT 1 FROM {schema}.t_effects f WHERE f.id = i.id AND f.step = i.step AND f.attempt = i.attempt AND f.pid = $2)`,
		name+":%", pid)
}

// executingBy counts the rows executing under claims of the worker named name.
func executingBy(t *testing.T, e *env, name string) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND locked_by LIKE $1`, name+":%")
}

// T1b: a worker is SIGSTOPped while it holds claims, for at least 3 × lease and until the others
// have taken every claim it held, then SIGCONTed. The steps it was running finish and their
// outcomes reach the database late: every one is dropped (outcome.stale), so no instance is
// rewound, finished twice or given a repeated path step (I2, I3, I5). Each worker's stale
// outcomes are exactly the claims the database shows it lost, but for one case the committer
// documents: an outcome statement in flight when the pause landed commits, the worker's wait for
// it times out meanwhile, and the retry finds its rows gone (its own first try moved them on)
// and reports them stale. Each such outcome must be one the database shows ended by the claim's
// own outcome, and the worker must have seen its commit fail.
func TestPausedWorkersLateCommitsAreDropped(t *testing.T) {
	t.Parallel()
	e, _ := oracleEnv(t)
	seed, rng := oracle.Seed(t)
	rounds, perRound := oracle.Size(1, 5), oracle.Size(300, 1000)
	began := time.Now()
	c := newCrew(t, e, 3, nil, e.t1Cfg(""))
	for round := range rounds {
		insertLinear(t, e, perRound)
		i := rng.IntN(len(c.workers))
		name := c.workers[i].name
		// Pause it while it runs steps: SIGSTOP lands between steps as often as not, and a
		// claim the database shows may be one whose pick answer the worker has not received
		// yet (no step of it will run before the pause ends). So look again once it is
		// stopped, for a claim whose step began in it, and let it run a little more if it had
		// none.
		for {
			eventually(t, time.Minute, name+" holding claims", func() bool { return executingBy(t, e, name) > 0 })
			c.pause(i)
			if runningBy(t, e, name, c.workers[i].pid()) > 0 {
				break
			}
			c.resume(i)
		}
		pausedAt := time.Now()
		eventually(t, time.Minute, "the others reclaiming "+name+"'s claims", func() bool {
			return executingBy(t, e, name) == 0 && time.Since(pausedAt) >= 3*t1Lease
		})
		c.resume(i)
		eventually(t, 2*time.Minute, "the round done", func() bool { return doneCount(t, e) == (round+1)*perRound })
	}
	// Every worker exits gracefully and reports its events; the database's account of lost
	// claims must match each one's count of dropped outcomes.
	stale, pausedStale := 0, 0
	for _, w := range c.workers {
		pid := w.pid()
		rep := w.term(t)
		ev, dropped := rep.Events, rep.StaleClaims
		lost, ended := claimEnds(t, e, w.name+":%")
		require.Len(t, dropped, ev["outcome.stale"], "%s: every outcome.stale listed", w.name)
		isDropped := map[staleClaim]bool{}
		unseen := 0 // stale only because the worker never saw its first try commit
		for _, d := range dropped {
			isDropped[d] = true
			if lost[d] == 0 {
				require.Positive(t, ended[d], "%s: outcome of %v reported stale, but its claim was neither lost nor ended by it", w.name, d)
				unseen++
			}
		}
		unknown := 0 // lost claims whose step never ran: the pick's answer was lost while it stood still
		for l := range lost {
			if !isDropped[l] {
				// Two cases look like a lost claim in the outcome log and are not one the worker
				// must report. A pick that committed while the worker stood still, whose answer
				// its timeout dropped: the worker never knew the claim, and its step never ran
				// under it. Or the claim's own retry outcome (its step failed, say its effect's
				// insert timed out across the pause), which puts the row back at the same step
				// as a release would, but records the step's error for that attempt, not a lease
				// error. A release gives the attempt back, so the worker may have claimed the
				// same attempt again and run it to its outcome: each such claim explains one of
				// its effects.
				ran := e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1 AND step = $2 AND attempt = $3 AND pid = $4`,
					l.ID, l.Step, l.Attempt, pid) - ended[l]
				if ran > 0 {
					require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND EXISTS (
						SELECT 1 FROM jsonb_array_elements(coalesce(errors, '[]')) AS x
						WHERE x ->> 'step' = $2 AND (x ->> 'attempt')::int = $3 AND x ->> 'kind' <> 'lease')`,
						l.ID, l.Step, l.Attempt), "%s: claim %v lost, its step ran, its outcome not reported stale", w.name, l)
				}
				unknown++
			}
		}
		if unknown > 0 {
			t.Logf("%s: %d claims that look lost and were not: never learnt of, or ended by their own retry", w.name, unknown)
		}
		if unseen > 0 {
			require.Positive(t, ev["commit.failed"], "%s: %d outcomes applied yet reported stale, with no failed commit", w.name, unseen)
		}
		t.Logf("%s (pid %d, paused %v): outcome.stale %d, claims lost %d, applied by a try whose commit went unseen %d",
			w.name, pid, c.paused[pid], ev["outcome.stale"], len(lost), unseen)
		stale += ev["outcome.stale"]
		if c.paused[pid] {
			pausedStale += ev["outcome.stale"]
		}
	}
	require.Zero(t, unexplainedDuplicates(t, e, c.faulted, nil), "unexplained duplicate effects")
	verdict(t, e, oracle.Opts{N: rounds * perRound, Effects: true, Counter: true, Path: linearPath},
		oracle.Summary{Test: "T1b pause past the lease", Seed: seed, Instances: rounds * perRound, Pauses: c.pauses,
			Seconds: time.Since(began).Seconds()})
	t.Logf("%d late outcomes dropped (outcome.stale), %d of them from paused workers", stale, pausedStale)
	require.GreaterOrEqual(t, pausedStale, rounds, "every pause drops at least one late outcome")
}

// T1c: a worker is SIGTERMed while it runs steps, several times (restarted under a new name
// each time). It drains: it leaves no claim behind (nothing executing under its name once it has
// exited, and no claim of its released by the reaper later), and no step it ran is run again by
// anyone (no repeated effect of its pid), since nothing else is faulted.
func TestTerminatedWorkerDrainsCleanly(t *testing.T) {
	t.Parallel()
	e, _ := oracleEnv(t)
	seed, rng := oracle.Seed(t)
	rounds, perRound := oracle.Size(3, 20), oracle.Size(200, 500)
	began := time.Now()
	name := func(i, gen int) string { return fmt.Sprintf("w%d-%d", i, gen) }
	c := newCrew(t, e, 3, name, e.t1Cfg(""))
	type termed struct {
		name string
		pid  int
	}
	var terms []termed
	for round := range rounds {
		insertLinear(t, e, perRound)
		i := rng.IntN(len(c.workers))
		w := c.workers[i]
		eventually(t, time.Minute, w.name+" holding claims", func() bool { return executingBy(t, e, w.name) > 0 })
		ev := w.term(t).Events
		require.Zero(t, executingBy(t, e, w.name), "%s left claims behind", w.name)
		require.Zero(t, ev["outcome.stale"], "%s dropped outcomes while draining", w.name)
		terms = append(terms, termed{w.name, w.pid()})
		c.gens[i]++
		c.workers[i] = c.spawn(i)
		eventually(t, 2*time.Minute, "the round done", func() bool { return doneCount(t, e) == (round+1)*perRound })
	}
	for _, x := range terms {
		lost, _ := claimEnds(t, e, x.name+":%")
		require.Empty(t, lost,
			"%s: claims whose outcome it did not commit (released by the reaper, or retried after a cancel)", x.name)
		require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT id, step FROM {schema}.t_effects GROUP BY 1, 2
			HAVING count(*) > 1 AND bool_or(pid = $1)) d`, x.pid), "%s: repeated effects", x.name)
	}
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT 1 FROM {schema}.t_effects GROUP BY id, step HAVING count(*) > 1) d`),
		"no effect repeats: nothing was killed or paused")
	verdict(t, e, oracle.Opts{N: rounds * perRound, Effects: true, Counter: true, Path: linearPath},
		oracle.Summary{Test: "T1c SIGTERM drain", Seed: seed, Instances: rounds * perRound, Faults: len(terms),
			Seconds: time.Since(began).Seconds()})
}

// T4: P2 starts under the same name as a live P1 (identical host names) while P1 holds 16 claims
// in steps longer than the test. P2's startup reclaim and reaper leave them alone for as long as
// P1's heartbeat keeps them fresh (over a whole lease): none is released before its lease ends
// (one whose lease a heartbeat delayed on a busy machine let run out is the reaper's to release,
// rightly); once P1 is SIGKILLed, all 16 are released within lease + reaper + 1s, P2 finishes
// them, and no step attempt ran in two live processes.
func TestSameNameWorkerLeavesLiveClaimsAlone(t *testing.T) {
	t.Parallel()
	e, ctx := oracleEnv(t)
	seed, _ := oracle.Seed(t)
	rounds := oracle.Size(1, 3)
	const n = 16
	began := time.Now()
	kills := 0
	var worst time.Duration
	// Every end of a claim, with the lease it had, the status it left the row in, and the times
	// of the transaction that ended it and of the end itself.
	e.exec(t, `CREATE TABLE {schema}.t_claim_ends (id bigint, owner text, lease_end timestamptz, status text,
		  tx_at timestamptz NOT NULL DEFAULT now(), at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE FUNCTION {schema}.t_log_claim_end() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN
		  INSERT INTO `+e.q("{schema}")+`.t_claim_ends (id, owner, lease_end, status)
		    VALUES (OLD.id, OLD.locked_by, OLD.locked_until, NEW.status);
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_log_claim_end AFTER UPDATE ON {schema}.instances FOR EACH ROW
		  WHEN (OLD.status = 'executing' AND OLD.locked_by IS DISTINCT FROM NEW.locked_by)
		  EXECUTE FUNCTION {schema}.t_log_claim_end()`)
	for round := range rounds {
		// Steps of a minute: P1 is killed long before one ends, so its claims stay live until
		// then however long P2 takes to start on a busy machine.
		p1 := startWorker(t, e.t1Cfg("same", func(c *workerCfg) { c.Conc, c.StepMS = 16, 60_000 }))
		insertLinear(t, e, n)
		eventually(t, time.Minute, "P1 holding 16 claims", func() bool {
			return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, p1.pid()) == n
		})
		var owners []string
		var ids []int64
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT array_agg(locked_by), array_agg(id) FROM {schema}.instances
			WHERE status = 'executing'`, e.schema)).Scan(&owners, &ids))
		require.Len(t, owners, n)
		p2 := startWorker(t, e.t1Cfg("same", func(c *workerCfg) { c.Conc = 16 }))
		// P2's startup reclaim has run (it is ready). Wait until every lease P1's claims had
		// then would have run out, and P2's reaper has swept twice since: P1's heartbeat
		// must have kept them its own.
		var leases time.Time
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT coalesce(max(locked_until), now()) FROM {schema}.instances
			WHERE id = ANY($1)`, e.schema), ids).Scan(&leases))
		eventually(t, time.Minute, "P1's leases of P2's start past, and two reaper sweeps", func() bool {
			return e.count(t, `SELECT count(*) FROM (SELECT) d WHERE now() > $1::timestamptz + $2::bigint * interval '1 millisecond'`,
				leases, (2*t1Reaper).Milliseconds()) == 1
		})
		require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_claim_ends WHERE owner = ANY($1) AND lease_end > tx_at`, owners),
			"P2 released claims of live P1's before their lease ended")
		t.Logf("round %d: %d of P1's 16 claims still its own after the lease (the others' leases ran out first)", round,
			e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND locked_by = ANY($1)`, owners))

		p1.kill()
		kills++
		killedAt := time.Now()
		eventually(t, time.Minute, "P1's claims released", func() bool {
			return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND locked_by = ANY($1)`, owners) == 0
		})
		// P1's claims by their tokens: what P2 does with the rows after does not count.
		var lastRelease time.Time
		var ends, releases int
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT max(at), count(*), count(*) FILTER (WHERE status = 'available')
			FROM {schema}.t_claim_ends WHERE owner = ANY($1)`, e.schema), owners).Scan(&lastRelease, &ends, &releases))
		require.Equal(t, n, ends, "each of P1's claims ended once")
		require.Equal(t, n, releases, "each of P1's claims released")
		took := lastRelease.Sub(killedAt)
		worst = max(worst, took)
		t.Logf("round %d: P1's 16 claims released %v after its SIGKILL", round, took.Round(time.Millisecond))
		require.LessOrEqual(t, took, t1Lease+t1Reaper+time.Second, "released within lease + reaper + 1s")
		eventually(t, time.Minute, "P2 finishing them", func() bool { return doneCount(t, e) == (round+1)*n })
		require.Zero(t, p2.term(t).stale())
	}
	// No claim ran in two processes: a step's effect from a second process comes only after the
	// release of the first one's claim (a lost claim gives its attempt back, so the attempt alone
	// does not tell the two claims apart).
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_effects f1
		JOIN {schema}.t_effects f2 ON f2.id = f1.id AND f2.step = f1.step AND f2.pid <> f1.pid AND f2.at > f1.at
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.t_outcome_log l WHERE l.id = f1.id AND l.old_status = 'executing'
		                  AND l.new_status = 'available' AND l.at > f1.at AND l.at < f2.at)`))
	verdict(t, e, oracle.Opts{N: rounds * n, Effects: true, Counter: true, Path: linearPath},
		oracle.Summary{Test: "T4 worker-id collision", Seed: seed, Instances: rounds * n, Kills: kills,
			Seconds: time.Since(began).Seconds()})
}

// T1d: crashes are not the step's fault. Instances whose steps may be tried twice (MaxAttempts
// 2) are worked by three workers with steps of 300ms, one of them SIGKILLed every U(200ms,
// 700ms) and restarted at once, batch after batch, until some step has lost at least two claims
// (which, before lost claims counted as recoveries, failed its instance) and every instance has
// finished. Pass: none failed, every claim lost to a kill is counted on its row as a recovery and
// not as an attempt, I1 to I8.
func TestCrashLoopFailsNoInstanceWithFewAttempts(t *testing.T) {
	t.Parallel()
	e, _ := oracleEnv(t)
	seed, rng := oracle.Seed(t)
	began := time.Now()
	c := newCrew(t, e, 3, nil, e.t1Cfg("", func(w *workerCfg) { w.StepMS = 300 }))
	perRound := oracle.Size(40, 200)
	// Steps that lost at least two claims: their lease errors, by instance and step.
	lostTwice := func() int {
		return e.count(t, `SELECT count(*) FROM (SELECT i.id, x ->> 'step' FROM {schema}.instances i,
			jsonb_array_elements(coalesce(i.errors, '[]')) AS x WHERE x ->> 'kind' = 'lease' GROUP BY 1, 2 HAVING count(*) >= 2) d`)
	}
	n := 0
	for round := 0; round == 0 || (lostTwice() == 0 && round < 10); round++ {
		insertLinearWith(t, e, perRound, func(_ int, o *gendurable.InsertOpts) { o.MaxAttempts = 2 })
		n += perRound
		c.killLoop(rng, 3*time.Minute, func() time.Duration { return time.Duration(200+rng.IntN(500)) * time.Millisecond },
			func() bool {
				return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status IN ('done', 'failed')`) == n
			})
	}
	twice := lostTwice()
	t.Logf("%d kills over %d instances; %d steps lost two claims or more", c.kills, n, twice)
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'failed'`),
		"instances failed, though no step returned an error")
	require.Positive(t, twice, "no step lost two claims in ten rounds: the kills never reached the case")
	// Each row's attempt counts only the tries that returned: one, for the last step.
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE attempt <> 1`))
	require.Zero(t, unexplainedDuplicates(t, e, c.faulted, nil), "unexplained duplicate effects")
	verdict(t, e, oracle.Opts{N: n, Effects: true, Counter: true, Path: linearPath},
		oracle.Summary{Test: "T1d crashes cost no attempt", Seed: seed, Instances: n, Kills: c.kills, Seconds: time.Since(began).Seconds()})
}
