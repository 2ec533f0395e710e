package races

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// workerCfg configures a worker process (the test binary re-executed with GD_RACES_HELPER set).
type workerCfg struct {
	URL, Schema, Name string
	Queue             string
	Conc              int
	PollMS, LeaseMS   int
	ReaperMS, GCMS    int // 0: disabled
	RetentionMS       int
	// Gates: name -> {limit, shards}; Rates: name -> {allowed, period ms, burst}.
	Gates map[string][2]int
	Rates map[string][3]int
	// StepMinMS, StepMaxMS bound each step's sleep.
	StepMinMS, StepMaxMS int
	Seed                 uint64
}

// helperMain runs the test binary as a worker process: a client working cfg.Queue with the
// machines every races test uses, configured by GD_RACES_CFG (JSON). It prints "ready" once
// started and drains on SIGTERM.
func helperMain(role string) int {
	if role != "worker" {
		fmt.Fprintln(os.Stderr, "races: unknown helper role", role)
		return 2
	}
	var cfg workerCfg
	if err := json.Unmarshal([]byte(os.Getenv("GD_RACES_CFG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "races: GD_RACES_CFG:", err)
		return 2
	}
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Few connections: the tests' Postgres is shared (max_connections 100 by default).
	pc.MaxConns = 5
	pc.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("gd-races-%s-%d", cfg.Name, os.Getpid())
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	sc := pc.Copy()
	sc.MaxConns = 3
	side, err := pgxpool.NewWithConfig(ctx, sc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer side.Close()
	w := &helperWorker{cfg: cfg, side: side, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid()))),
		schema: pgx.Identifier{cfg.Schema}.Sanitize()}
	c := &gendurable.Config{
		Name: cfg.Name, Schema: cfg.Schema, Machines: w.machines(),
		Queues:       map[string]gendurable.QueueConfig{cfg.Queue: {Concurrency: cfg.Conc}},
		PollInterval: time.Duration(cfg.PollMS) * time.Millisecond,
		Lease:        time.Duration(cfg.LeaseMS) * time.Millisecond,
		Reaper:       &gendurable.ReaperConfig{Disabled: cfg.ReaperMS == 0, Interval: time.Duration(cfg.ReaperMS) * time.Millisecond},
		GC: &gendurable.GCConfig{Disabled: cfg.GCMS == 0, Interval: time.Duration(cfg.GCMS) * time.Millisecond,
			Retention: time.Duration(cfg.RetentionMS) * time.Millisecond},
	}
	if len(cfg.Gates) > 0 {
		c.ConcurrencyLimits = map[string]gendurable.ConcurrencyLimit{}
		for name, g := range cfg.Gates {
			c.ConcurrencyLimits[name] = gendurable.ConcurrencyLimit{Limit: g[0], Shards: g[1]}
		}
	}
	if len(cfg.Rates) > 0 {
		c.RateLimits = map[string]gendurable.Rate{}
		for name, r := range cfg.Rates {
			c.RateLimits[name] = gendurable.Rate{Allowed: r[0], Period: time.Duration(r[1]) * time.Millisecond, Burst: r[2]}
		}
	}
	cl, err := gendurable.NewClient(pool, c)
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
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type helperWorker struct {
	cfg    workerCfg
	side   *pgxpool.Pool
	schema string
	mu     sync.Mutex
	rng    *rand.Rand
}

func (w *helperWorker) sleep(ctx *gendurable.Ctx) {
	w.mu.Lock()
	d := w.cfg.StepMinMS
	if span := w.cfg.StepMaxMS - w.cfg.StepMinMS; span > 0 {
		d += w.rng.IntN(span + 1)
	}
	w.mu.Unlock()
	select {
	case <-time.After(time.Duration(d) * time.Millisecond):
	case <-ctx.Done():
	}
}

func (w *helperWorker) intn(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(n)
}

// fanState is t6fan's state: the correlation keys of the children it spawns.
type fanState struct {
	Keys []string `json:"keys"`
}

// walkState is gatewalk's state: linear5's counter and path, and the concurrency key the
// instance holds now (the step records its effect under it).
type walkState struct {
	I    int      `json:"i"`
	Path []string `json:"path"`
	Key  string   `json:"key,omitempty"`
	// Keys are the keys a step may switch to.
	Keys []string `json:"keys,omitempty"`
}

// machines are the worker's machines:
//   - gatewalk (T3): five steps; each records its effect and its presence in t_inflight under
//     its concurrency key for its whole run; 10 % of transitions switch the key, 5 % release it.
//   - t6job (T6): one rate-limited step.
//   - t6fan (T6): spawns children whose correlation keys collide with the inserters' keys.
//   - stamp (T12): one step that records its effect.
//   - timed (T12): parks on a signal that never comes, with a 1 s timeout, then finishes.
func (w *helperWorker) machines() []gendurable.Machine {
	pid := os.Getpid()
	walkSteps := map[string]gendurable.StepFunc[walkState]{}
	for i, s := range linearSteps {
		walkSteps[s] = func(ctx *gendurable.Ctx, st walkState) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			if st.Key != "" {
				if _, err := w.side.Exec(ctx, `INSERT INTO `+w.schema+`.t_inflight (key, id, pid) VALUES ($1, $2, $3)`, st.Key, ctx.ID, pid); err != nil {
					return gendurable.Outcome{}, err
				}
			}
			w.sleep(ctx)
			if st.Key != "" {
				if _, err := w.side.Exec(context.WithoutCancel(ctx), `DELETE FROM `+w.schema+`.t_inflight WHERE id = $1 AND pid = $2`, ctx.ID, pid); err != nil {
					return gendurable.Outcome{}, err
				}
			}
			st.I++
			st.Path = append(st.Path, s)
			if i == len(linearSteps)-1 {
				return gendurable.Done(st), nil
			}
			switch r := w.intn(100); {
			case r < 10 && len(st.Keys) > 0:
				st.Key = st.Keys[w.intn(len(st.Keys))]
				return gendurable.Next(linearSteps[i+1], st, gendurable.ConcurrencyKey(st.Key)), nil
			case r < 15:
				st.Key = ""
				return gendurable.Next(linearSteps[i+1], st, gendurable.ReleaseConcurrencyKey()), nil
			}
			return gendurable.Next(linearSteps[i+1], st), nil
		}
	}
	walk := gendurable.FSM[walkState]{Name: "gatewalk", Start: "s0", Queue: w.cfg.Queue, Steps: walkSteps}
	job := gendurable.Job[string]{Name: "t6job", Queue: w.cfg.Queue, Perform: func(ctx *gendurable.Ctx, _ string) error {
		w.sleep(ctx)
		return nil
	}}
	fan := gendurable.FSM[fanState]{Name: "t6fan", Start: "spawn", Queue: w.cfg.Queue, Steps: map[string]gendurable.StepFunc[fanState]{
		"spawn": func(ctx *gendurable.Ctx, f fanState) (gendurable.Outcome, error) {
			kids := make([]gendurable.Child, len(f.Keys))
			for i, k := range f.Keys {
				kids[i] = gendurable.Child{Input: job.With(k), Opts: &gendurable.InsertOpts{CorrelationKey: k, RateLimit: "api:" + k[len(k)-1:]}}
			}
			return gendurable.Spawn(kids, "join", f), nil
		},
		"join": func(ctx *gendurable.Ctx, f fanState) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	stamp := gendurable.Job[string]{Name: "stamp", Queue: w.cfg.Queue, Perform: func(ctx *gendurable.Ctx, _ string) error {
		return oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid)
	}}
	timed := gendurable.FSM[walkState]{Name: "timed", Start: "s0", Queue: w.cfg.Queue, Steps: map[string]gendurable.StepFunc[walkState]{
		"s0": func(ctx *gendurable.Ctx, st walkState) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			return gendurable.Await([]string{"never"}, "s1", st, gendurable.Timeout(time.Second)), nil
		},
		"s1": func(ctx *gendurable.Ctx, st walkState) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, w.side, w.cfg.Schema, ctx.ID, ctx.Step, ctx.Attempt, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			return gendurable.Done(st), nil
		},
	}}
	return []gendurable.Machine{walk, job, fan, stamp, timed}
}

// proc is a worker process.
type proc struct {
	cmd  *exec.Cmd
	cfg  workerCfg
	done chan struct{}
}

// startWorker starts a worker process, with extra environment variables; the test's cleanup
// kills it if it still runs.
func startWorker(t testing.TB, cfg workerCfg, extraEnv ...string) *proc {
	t.Helper()
	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GD_RACES_HELPER=worker", "GD_RACES_CFG="+string(b))
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stderr = &prefixWriter{prefix: "[" + cfg.Name + "] ", w: os.Stderr}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, cfg: cfg, done: make(chan struct{})}
	t.Cleanup(p.kill)
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	go func() { // reaps the process however it ends, so that kill never waits forever
		_, _ = io.Copy(io.Discard, r)
		_ = cmd.Wait()
		close(p.done)
	}()
	require.NoError(t, err, "worker %s did not start", cfg.Name)
	require.Equal(t, "ready\n", line)
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop asks the worker to drain (SIGTERM) and waits for it, killing it after a while.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

// prefixWriter prefixes each line a worker writes to stderr, filtering the engine's info logs.
type prefixWriter struct {
	prefix string
	w      io.Writer
	mu     sync.Mutex
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := strings.IndexByte(string(p.buf), '\n')
		if i < 0 {
			break
		}
		line := string(p.buf[:i+1])
		p.buf = p.buf[i+1:]
		if !strings.Contains(line, " INFO ") {
			_, _ = io.WriteString(p.w, p.prefix+line)
		}
	}
	return len(b), nil
}
