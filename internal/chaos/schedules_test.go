package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// fireRow is one instance a schedule fired: its schedule, fire time and insert time.
type fireRow struct {
	schedule string
	at       time.Time
	inserted time.Time
}

// fires reads, from the rows, every instance a schedule fired, by schedule in fire-time order
// (the correlation key is schedule/<name>/<fire time>), and checks that no key has two.
func fires(t *testing.T, e *env) map[string][]fireRow {
	t.Helper()
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT correlation_key FROM {schema}.instances
		WHERE correlation_key LIKE 'schedule/%' GROUP BY 1 HAVING count(*) > 1) d`), "two instances of one fire time")
	rows, err := e.pool.Query(context.Background(), e.q(`SELECT correlation_key, inserted_at FROM {schema}.instances
		WHERE correlation_key LIKE 'schedule/%' ORDER BY correlation_key`))
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][]fireRow{}
	for rows.Next() {
		var key string
		var r fireRow
		require.NoError(t, rows.Scan(&key, &r.inserted))
		cut := strings.LastIndexByte(key, '/')
		r.schedule = key[len("schedule/"):cut]
		r.at, err = time.Parse(time.RFC3339Nano, key[cut+1:])
		require.NoError(t, err, key)
		out[r.schedule] = append(out[r.schedule], r)
	}
	require.NoError(t, rows.Err())
	return out
}

// Three worker processes, each its own service declaring its own schedules and one shared one,
// every second; one of them is SIGKILLed and restarted every few seconds. From the rows: exactly
// one instance per fire time of every schedule, none missing (the catch-up window is longer than
// any gap a kill makes), and the fire lag (fire time to the insert's transaction) p99 under 1s.
func TestSchedulesFireOncePerFireTimeUnderKills(t *testing.T) {
	t.Parallel()
	e, _ := oracleEnv(t)
	seed, rng := oracle.Seed(t)
	run := oracle.Size(8*time.Second, 60*time.Second)
	began := time.Now()
	c := newCrew(t, e, 3, nil, e.t1Cfg("", func(c *workerCfg) {
		c.OwnSchedules, c.SharedSchedules, c.ScheduleEveryMS, c.ScheduleCatchUpMS = 2, []string{"shared"}, 1000, 60_000
	}))
	end := time.Now().Add(run)
	c.killLoop(rng, run+time.Minute, func() time.Duration { return time.Duration(2000+rng.IntN(2000)) * time.Millisecond },
		func() bool { return time.Now().After(end) })
	for _, w := range c.workers {
		w.stop(t)
	}

	all := fires(t, e)
	names := []string{"shared", "w0-0", "w0-1", "w1-0", "w1-1", "w2-0", "w2-1"}
	require.Len(t, all, len(names), "schedules that fired: %v", all)
	var lags []time.Duration
	total := 0
	for _, name := range names {
		fs := all[name]
		require.GreaterOrEqual(t, len(fs), int(run/time.Second)-3, "%s fired %d times in %v", name, len(fs), run)
		for i, f := range fs {
			if i > 0 {
				require.Equal(t, time.Second, f.at.Sub(fs[i-1].at), "%s: fire times %v then %v", name, fs[i-1].at, f.at)
			}
			lags = append(lags, f.inserted.Sub(f.at))
		}
		total += len(fs)
	}
	require.Zero(t, e.count(t, `SELECT coalesce(sum(skipped), 0) FROM {schema}.schedules`), "fire times skipped")
	p50, p99 := percentile(lags, 0.5), percentile(lags, 0.99)
	t.Logf("%d schedules, %d fires, %d kills; fire lag p50 %v p99 %v max %v", len(names), total, c.kills, p50, p99,
		percentile(lags, 1))
	require.Equal(t, total, drainFired(t, e))
	verdict(t, e, oracle.Opts{N: total},
		oracle.Summary{Test: "schedules under kills", Seed: seed, Instances: total, Kills: c.kills,
			Seconds: time.Since(began).Seconds()})
	require.Positive(t, c.kills)
	require.Less(t, p99, time.Second, "fire lag p99")
}

// Every node down for a while, then one starts: the fire times missed within the catch-up window
// are fired, the older ones are not (and are counted skipped).
func TestSchedulesCatchUpOnlyWithinTheWindowAfterAnOutage(t *testing.T) {
	t.Parallel()
	e, _ := oracleEnv(t)
	seed, _ := oracle.Seed(t)
	down := oracle.Size(8*time.Second, 2*time.Minute)
	const window = 3 * time.Second
	cfg := e.t1Cfg("", func(c *workerCfg) {
		c.SharedSchedules, c.ScheduleEveryMS, c.ScheduleCatchUpMS = []string{"tick"}, 1000, int(window.Milliseconds())
	})
	w := startWorker(t, cfg)
	eventually(t, 30*time.Second, "three fires", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE correlation_key LIKE 'schedule/tick/%'`) >= 3
	})
	w.kill()
	var lastBefore time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), e.q(`SELECT max(scheduled_at) FROM {schema}.instances
		WHERE correlation_key LIKE 'schedule/tick/%'`)).Scan(&lastBefore))
	time.Sleep(down)
	w = startWorker(t, cfg)
	eventually(t, 30*time.Second, "a fire after the outage", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE correlation_key LIKE 'schedule/tick/%' AND scheduled_at > $1
			AND inserted_at > $1 + $2 * interval '1 millisecond'`, lastBefore, down.Milliseconds()) > 0
	})
	w.stop(t)

	fs := fires(t, e)["tick"]
	// The first fire after the gap, and the round that made it.
	i := 1
	for i < len(fs) && fs[i].at.Sub(fs[i-1].at) == time.Second {
		i++
	}
	require.Less(t, i, len(fs), "no gap in the fire times: %v", fs)
	gapFrom, round := fs[i-1].at, fs[i].inserted
	// From the round on, every fire time of the window before it is there, and none older.
	for j := i; j < len(fs); j++ {
		require.False(t, fs[j].at.Before(round.Add(-window)), "fire time %v older than the window of the round at %v",
			fs[j].at, round)
	}
	first := fs[i].at
	require.False(t, first.After(round.Add(-window).Add(time.Second)), "the window's fire times were not fired: first %v, round %v",
		first, round)
	missed := int(first.Sub(gapFrom)/time.Second) - 1
	var skipped int
	require.NoError(t, e.pool.QueryRow(context.Background(), e.q(`SELECT skipped FROM {schema}.schedules WHERE name = 'tick'`)).Scan(&skipped))
	require.Equal(t, missed, skipped, "skipped count")
	t.Logf("down %v: last fire before %v; the round at %v fired from %v; %d fire times skipped", down, gapFrom, round, first, skipped)
	require.Equal(t, len(fs), drainFired(t, e))
	verdict(t, e, oracle.Opts{N: len(fs)},
		oracle.Summary{Test: "schedules after an outage", Seed: seed, Instances: len(fs), Kills: 1, Seconds: down.Seconds()})
	require.Greater(t, missed, 0)
}

// drainFired removes the schedules (nothing fires any more) and lets a worker without schedules
// finish every instance they fired, for the oracle.
func drainFired(t *testing.T, e *env) int {
	t.Helper()
	e.exec(t, `DELETE FROM {schema}.schedules`)
	w := startWorker(t, e.t1Cfg("drain"))
	n := e.count(t, `SELECT count(*) FROM {schema}.instances`)
	eventually(t, 2*time.Minute, "every fired instance done", func() bool { return doneCount(t, e) == n })
	w.stop(t)
	return n
}
