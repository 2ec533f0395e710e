package gendurable_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// helperMain runs a worker process for the crash tests: a client working queue "crash" (or the
// queues in GD_QUEUES) with an effect-logging linear5 machine and the fan-out parent
// (fanMachine), configured from the environment. It prints "ready" once started, drains on
// SIGTERM, and prints "stale " and the JSON list of the (instance, attempt) of every outcome it
// dropped as stale, then, as its last line, "events " and the JSON count of every event it
// emitted by name (a SIGKILLed worker prints nothing).
func helperMain() int {
	env := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
			return v
		}
		return def
	}
	queueNames := []string{"crash"}
	if q := os.Getenv("GD_QUEUES"); q != "" {
		queueNames = strings.Split(q, ",")
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
	queues := map[string]gendurable.QueueConfig{}
	for _, q := range queueNames {
		queues[q] = gendurable.QueueConfig{Concurrency: env("GD_CONC", 8)}
	}
	events := &eventCounts{}
	cfg := &gendurable.Config{
		Name:         os.Getenv("GD_NAME"),
		Schema:       schema,
		Machines:     []gendurable.Machine{m, fanMachine(effectRecorder(pool, schema, pid))},
		Queues:       queues,
		Lease:        lease,
		Heartbeat:    time.Duration(env("GD_HEARTBEAT_MS", int(lease.Milliseconds()/5))) * time.Millisecond,
		PollInterval: time.Duration(env("GD_POLL_MS", 100)) * time.Millisecond,
		Reaper: &gendurable.ReaperConfig{Interval: time.Duration(env("GD_REAPER_MS", 100)) * time.Millisecond,
			Disabled: env("GD_REAPER", 1) == 0},
		Hooks: []func(gendurable.Event){events.add},
	}
	if ms := env("GD_GC_MS", 0); ms > 0 {
		cfg.GC = &gendurable.GCConfig{Interval: time.Duration(ms) * time.Millisecond}
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
	err = cl.Stop(stopCtx)
	fmt.Println("stale " + events.staleJSON())
	fmt.Println("events " + events.json())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// eventCounts counts a client's events by name (a hook), and keeps the claim, as (instance,
// attempt), of every outcome dropped as stale.
type eventCounts struct {
	mu    sync.Mutex
	n     map[gendurable.EventName]int
	stale []staleClaim
}

// staleClaim is the claim of an outcome dropped as stale: instance id and attempt.
type staleClaim [2]int64

func (c *eventCounts) add(ev gendurable.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[gendurable.EventName]int{}
	}
	c.n[ev.Name]++
	if ev.Name == gendurable.EventOutcomeStale {
		c.stale = append(c.stale, staleClaim{ev.InstanceID, int64(ev.Attempt)})
	}
}

func (c *eventCounts) staleJSON() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(c.stale)
	return string(b)
}

func (c *eventCounts) json() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(c.n)
	return string(b)
}

// effectMachine is linear5 whose every step first records an external effect (autocommit, on the
// pool, outside the outcome's transaction) and then sleeps.
func effectMachine(pool *pgxpool.Pool, schema string, pid int, delay time.Duration) gendurable.FSM[path] {
	return linear("linear5", delay, effectRecorder(pool, schema, pid))
}

// effectRecorder returns a step hook that records the step's external effect in t_effects.
func effectRecorder(pool *pgxpool.Pool, schema string, pid int) func(ctx *gendurable.Ctx) {
	return func(ctx *gendurable.Ctx) {
		_, err := pool.Exec(ctx, expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, schema),
			ctx.ID, ctx.Step, ctx.Attempt, pid)
		if err != nil && ctx.Err() == nil {
			panic(err)
		}
	}
}

// worker is a helper process.
type worker struct {
	cmd  *exec.Cmd
	name string
	// events receives the worker's event counts if it exits gracefully, stale the claims of the
	// outcomes it dropped as stale (sent first); out is closed when its stdout ends (it exited).
	events chan map[string]int
	stale  chan []staleClaim
	out    chan struct{}
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
	w := &worker{cmd: cmd, name: name, events: make(chan map[string]int, 1), stale: make(chan []staleClaim, 1),
		out: make(chan struct{})}
	t.Cleanup(func() { w.kill() })
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	if err != nil || line != "ready\n" {
		close(w.out)
		t.Fatalf("worker %s did not start: %q, %v", name, line, err)
	}
	go func() {
		defer close(w.out)
		for {
			line, err := r.ReadString('\n')
			if st, ok := strings.CutPrefix(line, "stale "); ok {
				var claims []staleClaim
				if json.Unmarshal([]byte(st), &claims) == nil {
					w.stale <- claims
				}
			}
			if ev, ok := strings.CutPrefix(line, "events "); ok {
				counts := map[string]int{}
				if json.Unmarshal([]byte(ev), &counts) == nil {
					w.events <- counts
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return w
}

// kill SIGKILLs the worker (stopped or not) and reaps it.
func (w *worker) kill() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Signal(syscall.SIGKILL)
		<-w.out
		_ = w.cmd.Wait()
	}
}

// term SIGTERMs the worker, waits for its drain and exit, and returns its event counts.
func (w *worker) term(t *testing.T) map[string]int {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-w.out:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker %s did not exit within 30s of SIGTERM", w.name)
	}
	require.NoError(t, w.cmd.Wait(), "worker %s exit status", w.name)
	select {
	case ev := <-w.events:
		return ev
	default:
		t.Fatalf("worker %s printed no event counts", w.name)
		return nil
	}
}

// staleClaims returns the claims of the outcomes the worker dropped as stale; call it after term.
func (w *worker) staleClaims(t *testing.T) []staleClaim {
	t.Helper()
	select {
	case s := <-w.stale:
		return s
	default:
		t.Fatalf("worker %s printed no stale outcomes", w.name)
		return nil
	}
}

// pause stops the worker (SIGSTOP); resume continues it (SIGCONT).
func (w *worker) pause(t *testing.T)  { require.NoError(t, syscall.Kill(w.pid(), syscall.SIGSTOP)) }
func (w *worker) resume(t *testing.T) { require.NoError(t, syscall.Kill(w.pid(), syscall.SIGCONT)) }

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

// A worker killed while it holds a gate lease (a block of slots its picks admit against) gives
// them back too: its claims' slots through the reaper, the lease's unused ones through the
// reconciler once the lease, no longer renewed, has expired.
func TestKilledWorkerGivesBackItsLeasedGateSlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	createEffects(t, e)
	const n = 24
	insertLinearKeyed(t, e, n, func(i int) string { return "gate:one" })
	// A gate far from its limit: a runner of 8 leases 8 slots after a full batch of its key.
	gates := "GD_GATES=gate=1000/1"
	victim := startWorker(t, e, "victim", "GD_STEP_MS=60000", "GD_LEASE_MS=1500", "GD_REAPER=0", gates)
	eventually(t, 20*time.Second, "the victim runs 8 steps and holds a lease of 8 more slots", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE pid = $1`, victim.pid()) == 8 &&
			e.count(t, `SELECT coalesce(sum(slots), 0) FROM {schema}.gate_leases WHERE owner LIKE 'victim%'`) == 8
	})
	require.Equal(t, 16, e.count(t, `SELECT sum(held) FROM {schema}.gates WHERE key = 'gate:one'`))
	victim.kill()
	rescuer := startWorker(t, e, "rescuer", "GD_STEP_MS=1", "GD_LEASE_MS=1500", "GD_GC_MS=50", gates)
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
