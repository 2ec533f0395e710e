package chaos

// Crash recovery across worker processes (docs/reliability.md, "Other process and fault tests"):
// a worker SIGKILLed while it holds claims, a restart under the same name, two processes sharing
// concurrency keys and gates.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func insertLinear(t *testing.T, e *env, n int) {
	t.Helper()
	insertLinearKeyed(t, e, n, nil)
}

// insertLinearKeyed inserts n linear5 instances in queue "crash"; key(i), if given, is the i-th
// instance's concurrency key.
func insertLinearKeyed(t *testing.T, e *env, n int, key func(i int) string) {
	t.Helper()
	insertLinearWith(t, e, n, func(i int, o *gendurable.InsertOpts) {
		if key != nil {
			o.ConcurrencyKey = key(i)
		}
	})
}

// insertLinearWith inserts n linear5 instances in queue "crash", set(i, opts) changing the i-th
// one's options.
func insertLinearWith(t *testing.T, e *env, n int, set func(i int, o *gendurable.InsertOpts)) {
	t.Helper()
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{linear("linear5", 0, nil)}})
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: linear("linear5", 0, nil).With(path{}),
			Opts: &gendurable.InsertOpts{Queue: "crash"}}
		set(i, params[i].Opts)
	}
	_, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
}

// requireAllExact checks the end state: every instance done once with the exact path, no claims
// left, and no step of a finished instance without its effect.
func requireAllExact(t *testing.T, e *env, n int) {
	t.Helper()
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'
		AND result = '{"i":5,"path":["s0","s1","s2","s3","s4"]}'::jsonb`))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE locked_by IS NOT NULL`))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances i CROSS JOIN unnest(ARRAY['s0','s1','s2','s3','s4']) AS s(step)
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.t_effects f WHERE f.id = i.id AND f.step = s.step)`))
}

func TestKilledWorkerIsRecoveredByAnother(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	const n = 40
	insertLinear(t, e, n)
	// The victim takes long steps and holds claims when it dies.
	victim := startWorker(t, e.crashCfg("victim", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.ReaperMS = 60000, 0
	}))
	eventually(t, 20*time.Second, "victim runs eight steps", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 8
	})
	victim.kill()
	killedAt := time.Now()

	rescuer := startWorker(t, e.crashCfg("rescuer", leaseMS(1500), func(c *workerCfg) {
		c.StepMS = 1
	}))
	eventually(t, 60*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	requireAllExact(t, e, n)
	// The victim's eight claims were released by the reaper with the lease error recorded, once
	// the lease expired (not before).
	require.Equal(t, 8, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors @> '[{"kind":"lease"}]'`))
	require.Less(t, time.Since(killedAt), 30*time.Second)
	require.Equal(t, 8, e.count(t, `SELECT count(DISTINCT id) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()))
	rescuer.kill()
}

// A worker killed while it holds prefetched claims beside its running steps: the reaper releases
// them all once the lease runs out, another worker runs them, and the prefetched rows never ran
// in the victim.
func TestKilledWorkersPrefetchedClaimsAreRecovered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	const n = 40
	insertLinear(t, e, n)
	victim := startWorker(t, e.crashCfg("victim", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.ReaperMS, c.Conc, c.Prefetch = 60000, 0, 4, 12
	}))
	// The victim runs no reaper and nobody else works the queue: its claims stay its own until
	// the kill, however late its heartbeat.
	var held []int64
	eventually(t, 20*time.Second, "the victim holding 16 claims, running 4 steps", func() bool {
		rows, err := e.pool.Query(context.Background(), expand(`SELECT id FROM {schema}.instances
			WHERE status = 'executing' AND locked_by LIKE 'victim:%'`, e.schema))
		require.NoError(t, err)
		held, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return len(held) == 16 && e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 4
	})
	victim.kill()
	rescuer := startWorker(t, e.crashCfg("rescuer", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.Prefetch = 1, 8
	}))
	eventually(t, 60*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	requireAllExact(t, e, n)
	require.Equal(t, 16, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND errors @> '[{"kind":"lease"}]'`, held),
		"the reaper released the victim's 16 claims, running and prefetched")
	require.Equal(t, 4, e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()),
		"the victim ran only the steps it had begun")
	rescuer.kill()
}

func TestStartupReclaimTakesOnlyStaleClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	const n = 16
	insertLinear(t, e, n)
	// Lease 12s, heartbeat 200ms: a claim is stale for startup reclaim 6s after its last beat,
	// and its lease runs 6s more.
	slow := func(c *workerCfg) { c.StepMS, c.LeaseMS, c.HeartbeatMS, c.ReaperMS, c.Conc = 60000, 12000, 200, 0, 16 }
	p1 := startWorker(t, e.crashCfg("same", slow))
	eventually(t, 20*time.Second, "p1 holds 16 claims", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`) == n
	})
	var p1Owner string
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`SELECT min(locked_by) FROM {schema}.instances`, e.schema)).Scan(&p1Owner))

	// A second process with the same name on the same host (identical container host names):
	// its startup reclaim must not touch p1's fresh claims.
	p2 := startWorker(t, e.crashCfg("same", slow))
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND split_part(locked_by, '#', 1) = split_part($1, '#', 1)`, p1Owner))

	// p1 dies. Nobody runs a reaper, so only a restart under the same name can release its
	// claims: it does once they are stale (6s without a beat), before their lease (12s) runs out.
	p1.kill()
	p2.kill()
	// The database's clock says when the claims are stale and when their leases end. (A
	// heartbeat of p1's still in flight could only extend a lease: the bound read here is the
	// stricter.)
	eventually(t, 30*time.Second, "p1's claims stale", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'
			AND locked_until >= now() + interval '6 seconds'`) == 0
	})
	var leaseEnd time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`SELECT min(locked_until) FROM {schema}.instances`, e.schema)).Scan(&leaseEnd))
	p3 := startWorker(t, e.crashCfg("same", slow, func(c *workerCfg) { c.StepMS = 1 }))
	eventually(t, 30*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	// Each instance's first change out of p1's claim was a release (p1 ran no step to its
	// outcome), and it came before p1's lease ran out: startup reclaim, not expiry, released it.
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM (SELECT DISTINCT ON (id) id, new_status, at
		FROM {schema}.t_outcome_log WHERE old_status = 'executing' ORDER BY id, seq) r
		WHERE r.new_status = 'available' AND r.at < $1`, leaseEnd),
		"p3's startup reclaim released p1's stale claims before their lease ran out")
	requireAllExact(t, e, n)
	// No step ran in two live processes at once: p1 and p2 never both ran an (id, step, attempt).
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (SELECT id, step, attempt FROM {schema}.t_effects
		WHERE pid IN ($1, $2) GROUP BY 1, 2, 3 HAVING count(DISTINCT pid) > 1) d`, p1.pid(), p2.pid()))
	p3.kill()
}

func TestKilledChildIsRecoveredAndTheParentStillJoins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	child := linear("linear5", 0, nil)
	type fan struct {
		Done int `json:"done"`
	}
	var joins atomic.Int64
	parent := gendurable.FSM[fan]{Name: "fan", Start: "spawn", Queue: "parents", Steps: map[string]gendurable.StepFunc[fan]{
		"spawn": func(*gendurable.Ctx, fan) (gendurable.Outcome, error) {
			kids := make([]gendurable.Child, 10)
			for i := range kids {
				kids[i] = gendurable.Child{Input: child.With(path{}), Opts: &gendurable.InsertOpts{Queue: "crash"}}
			}
			return gendurable.Spawn(kids, "join", fan{}), nil
		},
		"join": func(ctx *gendurable.Ctx, f fan) (gendurable.Outcome, error) {
			joins.Add(1)
			for _, c := range ctx.Children {
				if c.Status == gendurable.StatusDone {
					f.Done++
				}
			}
			return gendurable.Done(f), nil
		},
	}}
	p := e.client(t, &gendurable.Config{Name: "p", Machines: []gendurable.Machine{parent},
		Queues: map[string]gendurable.QueueConfig{"parents": {}}, Reaper: &gendurable.ReaperConfig{Interval: 100 * time.Millisecond}})
	start(t, p)
	ctx := context.Background()
	r, err := p.Insert(ctx, parent.With(fan{}), nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the parent joining", func() bool {
		in, _ := p.Get(ctx, r.ID)
		return in.Status == gendurable.StatusJoining
	})
	victim := startWorker(t, e.crashCfg("victim", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.ReaperMS = 60000, 0
	}))
	// The children the victim runs when it is killed: executing under its claims, their steps
	// begun in it. (On a busy machine its heartbeat can miss a lease and lose claims before the
	// kill; it then claims children again, so it is its claims at the kill that count.)
	var held []int64
	eventually(t, time.Minute, "the victim running eight children", func() bool {
		rows, err := e.pool.Query(ctx, expand(`SELECT i.id FROM {schema}.instances i WHERE i.parent_id = $1
			AND i.status = 'executing' AND i.locked_by LIKE 'victim:%' AND EXISTS (SELECT 1 FROM {schema}.t_effects f
			WHERE f.id = i.id AND f.step = i.step AND f.attempt = i.attempt AND f.pid = $2)`, e.schema), r.ID, victim.pid())
		require.NoError(t, err)
		held, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return len(held) == 8
	})
	victim.kill()
	rescuer := startWorker(t, e.crashCfg("rescuer", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.ReaperMS = 1, 0
	}))
	eventually(t, 60*time.Second, "the parent done", func() bool {
		in, _ := p.Get(ctx, r.ID)
		return in.Status == gendurable.StatusDone
	})
	in, err := p.Get(ctx, r.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"done": 10}`, string(in.Result))
	require.Equal(t, int64(1), joins.Load())
	require.Equal(t, 8, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND errors @> '[{"kind":"lease"}]'`, held),
		"the children the victim ran when killed were released by the reaper")
	rescuer.kill()
}

// sampleMaxPerKey samples the executing rows per concurrency key every few milliseconds until
// stop is closed, and returns the largest count seen for any key and how many samples it took.
func sampleMaxPerKey(t *testing.T, e *env, stop <-chan struct{}) (func() (int, int), *sync.WaitGroup) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	maxSeen, samples := 0, 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var m int
			err := e.side.QueryRow(context.Background(), expand(`SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n
				FROM {schema}.instances WHERE status = 'executing' AND concurrency_key IS NOT NULL GROUP BY concurrency_key) s`, e.schema)).Scan(&m)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			maxSeen, samples = max(maxSeen, m), samples+1
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return func() (int, int) { mu.Lock(); defer mu.Unlock(); return maxSeen, samples }, &wg
}

func TestConcurrencyKeyAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	const n = 200
	// Both workers are up before there is work, so that both take part (one that started while
	// the other had already done it all would leave nothing to race over).
	a := startWorker(t, e.crashCfg("a", func(c *workerCfg) { c.StepMS = 3 }))
	b := startWorker(t, e.crashCfg("b", func(c *workerCfg) { c.StepMS = 3 }))
	stop := make(chan struct{})
	maxSeen, wg := sampleMaxPerKey(t, e, stop)
	insertLinearKeyed(t, e, n, func(i int) string { return fmt.Sprint("acct-", i%5) })
	eventually(t, 2*time.Minute, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	close(stop)
	wg.Wait()
	m, samples := maxSeen()
	t.Logf("%d samples", samples)
	require.Equal(t, 1, m, "never two executing rows of one key")
	requireAllExact(t, e, n)
	// Both processes did work.
	require.Positive(t, e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, a.pid()))
	require.Positive(t, e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, b.pid()))
	a.kill()
	b.kill()
}

func TestKilledWorkerGivesBackItsGateSlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	const n = 12
	insertLinearKeyed(t, e, n, func(i int) string { return "gate:one" })
	gates := map[string][2]int{"gate": {4, 2}}
	victim := startWorker(t, e.crashCfg("victim", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.ReaperMS, c.Gates = 60000, 0, gates
	}))
	eventually(t, 20*time.Second, "the victim holds the gate's 4 slots", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 4
	})
	require.Equal(t, 4, e.count(t, `SELECT sum(held) FROM {schema}.gates WHERE key = 'gate:one'`))
	victim.kill()
	rescuer := startWorker(t, e.crashCfg("rescuer", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.Gates = 1, gates
	}))
	eventually(t, 60*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	requireAllExact(t, e, n)
	eventually(t, 5*time.Second, "the slots are back", func() bool {
		return e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`) == 0
	})
	require.Equal(t, 4, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors @> '[{"kind":"lease"}]'`))
	rescuer.kill()
}

// A worker killed while it holds a gate lease (a block of slots its picks admit against) gives
// them back too: its claims' slots through the reaper, the lease's unused ones through the
// reconciler once the lease, no longer renewed, has expired.
func TestKilledWorkerGivesBackItsLeasedGateSlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	const n = 24
	insertLinearKeyed(t, e, n, func(i int) string { return "gate:one" })
	// A gate far from its limit: a runner of 8 leases 8 slots after a full batch of its key.
	gates := map[string][2]int{"gate": {1000, 1}}
	victim := startWorker(t, e.crashCfg("victim", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.ReaperMS, c.Gates = 60000, 0, gates
	}))
	eventually(t, 20*time.Second, "the victim runs 8 steps and holds a lease of 8 more slots", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 8 &&
			e.count(t, `SELECT coalesce(sum(slots), 0) FROM {schema}.gate_leases WHERE owner LIKE 'victim%'`) == 8
	})
	require.Equal(t, 16, e.count(t, `SELECT sum(held) FROM {schema}.gates WHERE key = 'gate:one'`))
	victim.kill()
	rescuer := startWorker(t, e.crashCfg("rescuer", leaseMS(1500), func(c *workerCfg) {
		c.StepMS, c.GCMS, c.Gates = 1, 50, gates
	}))
	eventually(t, 60*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	requireAllExact(t, e, n)
	eventually(t, 10*time.Second, "the slots are back and the leases gone", func() bool {
		return e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`) == 0 &&
			e.count(t, `SELECT count(*) FROM {schema}.gate_leases`) == 0
	})
	require.Equal(t, 8, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors @> '[{"kind":"lease"}]'`))
	rescuer.kill()
}
