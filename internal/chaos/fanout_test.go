package chaos

import (
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// T17: parents fan out waves of linear5 children over two queues while three worker processes
// (each running both queues and the parents) are SIGKILLed every 2s and restarted. Every parent
// wakes exactly once per wave (one joining → runnable transition, one committed join step), its
// join count never goes below 0, every child finishes, the decrements sum to the number of
// children (no child's completion counted twice or lost), and the join steps saw every child
// done.
func TestFanOutJoinsExactlyOnceUnderKills(t *testing.T) {
	t.Parallel()
	e, ctx := oracleEnv(t)
	seed, rng := oracle.Seed(t)
	const waves = 2
	parents, children := oracle.Size(5, 20), oracle.Size(50, 200)
	began := time.Now()
	c := newCrew(t, e, 3, nil, e.t1Cfg("", func(c *workerCfg) { c.Queues = []string{"crash", "crash2"} }))

	// The join counters, sampled while the run goes on: never below 0.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	minPending, samples := 0, 0
	var sampleErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		q := expand(`SELECT coalesce(min(pending_children), 0) FROM {schema}.instances WHERE machine = 'fan'`, e.schema)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var m int
			if err := e.pool.QueryRow(ctx, q).Scan(&m); err != nil {
				sampleErr = err
				return
			}
			minPending, samples = min(minPending, m), samples+1
		}
	}()

	fan := fanMachine(nil)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{fan}})
	params := make([]gendurable.InsertManyParams, parents)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: fan.With(fanState{Path: []string{}, Waves: waves,
			PerWave: children / waves, Queues: []string{"crash", "crash2"}})}
	}
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	// The first kill as soon as children run, then one every 2s.
	eventually(t, time.Minute, "children running", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'linear5' AND status = 'executing'`) > 0
	})
	c.kill(rng.IntN(len(c.workers)))
	c.killLoop(rng, oracle.Size(3*time.Minute, 15*time.Minute), func() time.Duration { return 2 * time.Second },
		func() bool {
			return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'fan' AND status = 'done'`) == parents
		})
	close(stop)
	wg.Wait()
	require.NoError(t, sampleErr)
	t.Logf("%d kills; %d samples of the join counters, the least %d", c.kills, samples, minPending)

	require.Equal(t, parents*children, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'linear5' AND status = 'done'`),
		"every child done")
	require.Zero(t, e.count(t, `SELECT count(*) FROM (
		SELECT (SELECT count(*) FROM {schema}.t_outcome_log l
		        WHERE l.id = p.id AND l.old_status = 'joining' AND l.new_status <> 'joining') AS wakes,
		       (SELECT count(*) FROM {schema}.t_outcome_log l
		        WHERE l.id = p.id AND l.old_status = 'executing' AND l.old_step = 'join'
		          AND (l.new_step <> 'join' OR l.new_status = 'done')) AS joins
		FROM {schema}.instances p WHERE p.machine = 'fan') x WHERE wakes <> $1 OR joins <> $1`, waves),
		"a parent woke or joined other than once per wave")
	require.Equal(t, parents*children, e.count(t, `SELECT coalesce(sum(d), 0) FROM (
		SELECT lag(pending) OVER (PARTITION BY id ORDER BY seq) - pending AS d
		FROM {schema}.t_outcome_log WHERE id IN (SELECT id FROM {schema}.instances WHERE machine = 'fan')) x WHERE d > 0`),
		"the decrements sum to the children")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_outcome_log WHERE pending < 0`), "a join counter below 0")
	require.Zero(t, minPending, "a sampled join counter below 0")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'fan'
		AND NOT (result @> jsonb_build_object('seen', $1::int, 'wave', $2::int))`, children, waves),
		"a join step did not see every child of its wave done")
	require.Zero(t, unexplainedDuplicates(t, e, c.faulted, map[string]int{"fan": waves}), "unexplained duplicate effects")
	joinPath := []string{}
	for range waves {
		joinPath = append(joinPath, "spawn", "join")
	}
	verdict(t, e, oracle.Opts{N: parents + parents*children, Effects: true, Counter: true, Path: linearPath,
		Paths: map[string][]string{"fan": joinPath}},
		oracle.Summary{Test: "T17 fan-out join", Seed: seed, Instances: parents + parents*children, Kills: c.kills,
			Seconds: time.Since(began).Seconds()})
}
