package gendurable_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/oracle"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// helperMain runs a worker process for the crash tests: a client working queue "crash" with an
// effect-logging linear5 machine, configured from the environment. It prints "ready" once
// started and drains on SIGTERM.
func helperMain() int {
	env := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
			return v
		}
		return def
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("GD_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	schema := os.Getenv("GD_SCHEMA")
	stepDelay := time.Duration(env("GD_STEP_MS", 5)) * time.Millisecond
	pid := os.Getpid()
	m := effectMachine(pool, schema, pid, stepDelay)
	lease := time.Duration(env("GD_LEASE_MS", 1000)) * time.Millisecond
	cfg := &gendurable.Config{
		Name:         os.Getenv("GD_NAME"),
		Schema:       schema,
		Machines:     []gendurable.Machine{m},
		Queues:       map[string]gendurable.QueueConfig{"crash": {Concurrency: env("GD_CONC", 8)}},
		Lease:        lease,
		Heartbeat:    time.Duration(env("GD_HEARTBEAT_MS", int(lease.Milliseconds()/5))) * time.Millisecond,
		PollInterval: time.Duration(env("GD_POLL_MS", 100)) * time.Millisecond,
		Reaper:       &gendurable.ReaperConfig{Interval: 100 * time.Millisecond, Disabled: env("GD_REAPER", 1) == 0},
	}
	if os.Getenv("GD_POKE") == "postgres" {
		cfg.Poke = gendurable.PokePostgres()
	}
	// GD_GATES: "name=limit/shards,..."
	if g := os.Getenv("GD_GATES"); g != "" {
		cfg.ConcurrencyLimits = map[string]gendurable.ConcurrencyLimit{}
		for _, part := range strings.Split(g, ",") {
			var name string
			var limit, shards int
			eq := strings.IndexByte(part, '=')
			name = part[:eq]
			if _, err := fmt.Sscanf(part[eq+1:], "%d/%d", &limit, &shards); err != nil {
				fmt.Fprintln(os.Stderr, "GD_GATES:", err)
				return 2
			}
			cfg.ConcurrencyLimits[name] = gendurable.ConcurrencyLimit{Limit: limit, Shards: shards}
		}
	}
	cl, err := gendurable.NewClient(pool, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := cl.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := cl.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// effectMachine is linear5 whose every step first records an external effect (autocommit, on the
// pool, outside the outcome's transaction) and then sleeps.
func effectMachine(pool *pgxpool.Pool, schema string, pid int, delay time.Duration) gendurable.FSM[path] {
	return linear("linear5", delay, func(ctx *gendurable.Ctx) {
		_, err := pool.Exec(ctx, expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, schema),
			ctx.ID, ctx.Step, ctx.Attempt, pid)
		if err != nil && ctx.Err() == nil {
			panic(err)
		}
	})
}

// worker is a helper process.
type worker struct {
	cmd  *exec.Cmd
	name string
}

func startWorker(t *testing.T, e *env, name string, extra ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GD_HELPER=worker", "GD_URL="+e.pool.Config().ConnString(),
		"GD_SCHEMA="+e.schema, "GD_NAME="+name)
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "worker did not start")
	require.Equal(t, "ready\n", line)
	go func() { _, _ = io.Copy(io.Discard, out) }()
	w := &worker{cmd: cmd, name: name}
	t.Cleanup(func() { w.kill() })
	return w
}

func (w *worker) kill() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Signal(syscall.SIGKILL)
		_ = w.cmd.Wait()
	}
}

func (w *worker) pid() int { return w.cmd.Process.Pid }

func createEffects(t *testing.T, e *env) {
	e.exec(t, `CREATE TABLE {schema}.t_effects (id bigint, step text, attempt int, pid int, at timestamptz DEFAULT clock_timestamp())`)
}

func insertLinear(t *testing.T, e *env, n int) {
	t.Helper()
	insertLinearKeyed(t, e, n, nil)
}

// insertLinearKeyed inserts n linear5 instances in queue "crash"; key(i), if given, is the i-th
// instance's concurrency key.
func insertLinearKeyed(t *testing.T, e *env, n int, key func(i int) string) {
	t.Helper()
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{linear("linear5", 0, nil)}})
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: linear("linear5", 0, nil).With(path{}),
			Opts: &gendurable.InsertOpts{Queue: "crash"}}
		if key != nil {
			params[i].Opts.ConcurrencyKey = key(i)
		}
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
	e := newEnv(t)
	createEffects(t, e)
	const n = 40
	insertLinear(t, e, n)
	// The victim takes long steps and holds claims when it dies.
	victim := startWorker(t, e, "victim", "GD_STEP_MS=60000", "GD_LEASE_MS=1500", "GD_REAPER=0")
	eventually(t, 20*time.Second, "victim runs eight steps", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 8
	})
	victim.kill()
	killedAt := time.Now()

	rescuer := startWorker(t, e, "rescuer", "GD_STEP_MS=1", "GD_LEASE_MS=1500")
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

func TestKillLoopLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, oracle.Install(ctx, e.pool, e.schema))
	deadlocksBefore, err := oracle.Deadlocks(ctx, e.pool)
	require.NoError(t, err)
	const n, procs = 300, 3
	insertLinear(t, e, n)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GD_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	workers := make([]*worker, procs)
	args := []string{"GD_STEP_MS=5", "GD_LEASE_MS=1000"}
	for i := range workers {
		workers[i] = startWorker(t, e, fmt.Sprint("w", i), args...)
	}
	killed := map[int]bool{}
	deadline := time.Now().Add(3 * time.Minute)
	var lastKill time.Time
	for e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) < n {
		require.True(t, time.Now().Before(deadline), "not done within 3 minutes")
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		if len(killed) >= 8 {
			continue
		}
		i := rng.IntN(procs)
		killed[workers[i].pid()] = true
		workers[i].kill()
		lastKill = time.Now()
		// Restart at once under the same name: startup reclaim takes what it left, once stale.
		workers[i] = startWorker(t, e, fmt.Sprint("w", i), args...)
	}
	t.Logf("killed %d workers; last instance done %v after the last kill", len(killed), time.Since(lastKill))
	requireAllExact(t, e, n)
	violations, err := oracle.Check(ctx, e.pool, e.schema, oracle.Opts{N: n, Effects: true, Counter: true,
		Path: []string{"s0", "s1", "s2", "s3", "s4"}, DeadlocksBefore: deadlocksBefore})
	require.NoError(t, err)
	require.Empty(t, violations)
	// Every repeated effect is explained by a killed process: for each (id, step) with k
	// effects, at least k-1 came from processes that were killed.
	rows, err := e.pool.Query(ctx, expand(`SELECT id, step, array_agg(pid) FROM {schema}.t_effects GROUP BY 1, 2 HAVING count(*) > 1`, e.schema))
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		var step string
		var pids []int32
		require.NoError(t, rows.Scan(&id, &step, &pids))
		fromKilled := 0
		for _, p := range pids {
			if killed[int(p)] {
				fromKilled++
			}
		}
		require.GreaterOrEqual(t, fromKilled, len(pids)-1, "unexplained repeat of %d/%s by %v", id, step, pids)
	}
	require.NoError(t, rows.Err())
}

func TestStartupReclaimTakesOnlyStaleClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createEffects(t, e)
	const n = 16
	insertLinear(t, e, n)
	// Lease 8s, heartbeat 200ms: a claim is stale for startup reclaim after 4s without a beat.
	slow := []string{"GD_STEP_MS=60000", "GD_LEASE_MS=8000", "GD_HEARTBEAT_MS=200", "GD_REAPER=0", "GD_CONC=16"}
	p1 := startWorker(t, e, "same", slow...)
	eventually(t, 20*time.Second, "p1 holds 16 claims", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`) == n
	})
	var p1Owner string
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`SELECT min(locked_by) FROM {schema}.instances`, e.schema)).Scan(&p1Owner))

	// A second process with the same name on the same host (identical container host names):
	// its startup reclaim must not touch p1's fresh claims.
	p2 := startWorker(t, e, "same", slow...)
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND split_part(locked_by, '#', 1) = split_part($1, '#', 1)`, p1Owner))

	// p1 dies. Nobody runs a reaper, so only a restart under the same name can release its
	// claims: it does, as soon as they are stale (4s), before their lease (8s) runs out.
	p1.kill()
	killed := time.Now()
	p2.kill()
	time.Sleep(4500 * time.Millisecond)
	p3 := startWorker(t, e, "same", "GD_STEP_MS=1", "GD_LEASE_MS=8000", "GD_HEARTBEAT_MS=200", "GD_REAPER=0", "GD_CONC=16")
	eventually(t, 30*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1 AND at > $2`, p3.pid(), killed.Add(8*time.Second)),
		"p3 ran the steps before p1's leases ran out: startup reclaim, not expiry, released them")
	requireAllExact(t, e, n)
	// No step ran in two live processes at once: p1 and p2 never both ran an (id, step, attempt).
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (SELECT id, step, attempt FROM {schema}.t_effects
		WHERE pid IN ($1, $2) GROUP BY 1, 2, 3 HAVING count(DISTINCT pid) > 1) d`, p1.pid(), p2.pid()))
	p3.kill()
}

func TestKilledChildIsRecoveredAndTheParentStillJoins(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createEffects(t, e)
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
	victim := startWorker(t, e, "victim", "GD_STEP_MS=60000", "GD_LEASE_MS=1500", "GD_REAPER=0")
	eventually(t, 20*time.Second, "the victim runs children", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 8
	})
	victim.kill()
	rescuer := startWorker(t, e, "rescuer", "GD_STEP_MS=1", "GD_LEASE_MS=1500", "GD_REAPER=0")
	eventually(t, 60*time.Second, "the parent done", func() bool {
		in, _ := p.Get(ctx, r.ID)
		return in.Status == gendurable.StatusDone
	})
	in, err := p.Get(ctx, r.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"done": 10}`, string(in.Result))
	require.Equal(t, int64(1), joins.Load())
	require.Equal(t, 8, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1 AND errors @> '[{"kind":"lease"}]'`, r.ID),
		"the killed children were released by the reaper")
	rescuer.kill()
}

func TestConcurrencyKeyAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createEffects(t, e)
	const n = 200
	insertLinearKeyed(t, e, n, func(i int) string { return fmt.Sprint("acct-", i%5) })
	stop := make(chan struct{})
	maxSeen, wg := sampleMaxPerKey(t, e, stop)
	a := startWorker(t, e, "a", "GD_STEP_MS=3", "GD_CONC=8")
	b := startWorker(t, e, "b", "GD_STEP_MS=3", "GD_CONC=8")
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
	e := newEnv(t)
	createEffects(t, e)
	const n = 12
	insertLinearKeyed(t, e, n, func(i int) string { return "gate:one" })
	gates := "GD_GATES=gate=4/2"
	victim := startWorker(t, e, "victim", "GD_STEP_MS=60000", "GD_LEASE_MS=1500", "GD_REAPER=0", gates)
	eventually(t, 20*time.Second, "the victim holds the gate's 4 slots", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 4
	})
	require.Equal(t, 4, e.count(t, `SELECT sum(held) FROM {schema}.gates WHERE key = 'gate:one'`))
	victim.kill()
	rescuer := startWorker(t, e, "rescuer", "GD_STEP_MS=1", "GD_LEASE_MS=1500", gates)
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
