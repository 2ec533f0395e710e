// Package bench is gendurable's benchmark suite, run by `gendurable bench`. Each scenario runs
// in a fresh schema on the given Postgres and reports throughput and latency figures together
// with the server's version and durability settings, so a figure always travels with its
// conditions. It never changes a server setting.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options configures a run.
type Options struct {
	// Schema is the schema each scenario recreates and drops. Default "gendurable_bench".
	Schema string
	// Scenarios to run, in order; empty means every available scenario.
	Scenarios []string
	// N overrides each scenario's size (jobs, steps or inserts).
	N int
	// Concurrency overrides the client's queue concurrency (default 100).
	Concurrency int
	// Prefetch is the benchmarked queue's QueueConfig.Prefetch (default 0) on the clients the
	// scenarios work it with in this process (not fanout's, latency-remote's worker, soak's, nor
	// the worker processes of Processes).
	Prefetch int
	// Clients is how many clients (nodes) work the queue together in jobs, chain, gated and rated
	// (default 1).
	Clients int
	// Processes, when positive, has jobs and chain worked by that many worker processes (each a
	// client on a pool of its own, started by Worker) instead of in-process clients, and reports
	// the database's transactions and statement time per worked job.
	Processes int
	// Worker builds the command that starts one worker process for a scenario (see Work).
	Worker func(scenario string) *exec.Cmd
	// Preload inserts this many finished rows before each scenario, to measure the cost of a
	// large table; PreloadLive this many live rows no scenario runs (half parked on a signal,
	// half scheduled a day ahead, in the scenario's queue).
	Preload     int
	PreloadLive int
	// Duration, Rate, Window and Retention configure the soak scenario: Rate instances a second
	// (default 1,000) for Duration (default 1h), a report every Window (default 1m), GC at
	// Retention (default the library's).
	Duration  time.Duration
	Rate      float64
	Window    time.Duration
	Retention time.Duration
	// durationSet says Duration was given (cron's default differs from soak's).
	durationSet bool
	// Poke builds the poke transport of latency-remote's two clients (default PokePostgres).
	Poke func() gendurable.PokeTransport
	// Codec, when set, is the Config.Codec of the clients built by named (jobs, chain, gated,
	// rated and the others that run in-process on one queue): the cost of sealing payloads.
	Codec gendurable.Codec
	// ClientPoke, when set, is the Config.Poke of the clients built by named (default
	// PokeLocal): with PokePostgres, latency-tx's InsertTx sends its poke inside the transaction.
	ClientPoke gendurable.PokeTransport
	// Logger receives the engine's logs (default: warnings and errors to stderr).
	Logger *slog.Logger
	// Samples, when set, receives one CSV line per pickup of latency and latency-remote:
	// scenario, when its Insert began (ms after the scenario's first), the pickup's total and its
	// Insert's round trip (ms), so that a tail can be placed in time.
	Samples io.Writer
}

// Result is one scenario's figures. Pointers are fields that do not apply to every scenario.
type Result struct {
	Scenario   string   `json:"scenario"`
	N          int      `json:"n"`
	Seconds    float64  `json:"seconds"`
	InsertPerS *float64 `json:"insert_per_s,omitempty"`
	WorkPerS   *float64 `json:"work_per_s,omitempty"`
	StepsPerS  *float64 `json:"steps_per_s,omitempty"`
	P50ms      *float64 `json:"p50_ms,omitempty"`
	P95ms      *float64 `json:"p95_ms,omitempty"`
	P99ms      *float64 `json:"p99_ms,omitempty"`
	// The parts of a pickup (latency, latency-remote): InsertP50ms and InsertP99ms are the
	// Insert call's own round trip, its commit included; PickP50ms and PickP99ms the worker's
	// picks that claimed the rows (latency-remote, where a pick starts each step).
	InsertP50ms *float64 `json:"insert_p50_ms,omitempty"`
	InsertP99ms *float64 `json:"insert_p99_ms,omitempty"`
	PickP50ms   *float64 `json:"pick_p50_ms,omitempty"`
	PickP99ms   *float64 `json:"pick_p99_ms,omitempty"`
	// DBmsPerFire is the database's statement time per schedule fire (cron).
	DBmsPerFire *float64 `json:"db_ms_per_fire,omitempty"`
	// DBmsPerJob and XactsPerJob are the database's statement time and committed transactions
	// per worked job (or chain step) over the work, with --processes.
	DBmsPerJob  *float64 `json:"db_ms_per_job,omitempty"`
	XactsPerJob *float64 `json:"xacts_per_job,omitempty"`
	// ClientCPUusPerJob is the benchmark process's CPU time (user and system) per worked job
	// (or chain step, or signal and the step it woke) over the work, when the clients work
	// in-process: the library's own cost, beside the database's.
	ClientCPUusPerJob *float64 `json:"client_cpu_us_per_job,omitempty"`
	// PeakHeapMB is the largest live Go heap seen during the scenario; MaxRSSMB the process's
	// peak resident set so far.
	PeakHeapMB float64 `json:"peak_heap_mb"`
	MaxRSSMB   float64 `json:"max_rss_mb"`
	// Window is a soak's window (Partial: a report while it runs) or its last one (the summary).
	Window  *SoakWindow `json:"window,omitempty"`
	Partial bool        `json:"partial,omitempty"`
	// Clients, Processes, Preload and PreloadLive repeat the run's options.
	Clients     int `json:"clients"`
	Processes   int `json:"processes,omitempty"`
	Preload     int `json:"preload"`
	PreloadLive int `json:"preload_live"`
	Conditions
}

// Conditions are the server facts a figure depends on.
type Conditions struct {
	Postgres          string `json:"postgres"`
	SynchronousCommit string `json:"synchronous_commit"`
	Fsync             string `json:"fsync"`
	SharedBuffers     string `json:"shared_buffers"`
	Autovacuum        string `json:"autovacuum"`
	CPUs              int    `json:"cpus"`
}

// scenario is one benchmark.
type scenario struct {
	name        string
	defaultN    int
	summary     string
	unavailable string // why it cannot run yet, if it cannot
	// named: it runs only when asked for by name (it is long), not in "every scenario".
	named bool
	run   func(ctx context.Context, r *runner, n int) (Result, error)
}

func scenarios() []scenario {
	return []scenario{
		{name: "jobs", defaultN: 50000, summary: "InsertMany N one-step no-op jobs in batches of 1,000, then one client (concurrency 100) works them", run: runJobs},
		{name: "chain", defaultN: 50000, summary: "N/5 instances of a 5-step no-op FSM inserted in bulk, worked by one client", run: runChain},
		{name: "latency", defaultN: 500, summary: "an idle running client; N single Inserts 5 ms apart; time from the Insert call to the step's start", run: runLatency},
		{name: "latency-remote", defaultN: 500, summary: "latency across nodes: a client that works no queue inserts, a worker client on its own pool starts the step, woken by the poke transport (PokePostgres)", run: runLatencyRemote},
		{name: "jitter", defaultN: 2000, named: true, summary: "uses no database: N sleeps of 5 ms (the latency scenarios' spacing); how late the host wakes a sleeping goroutine, of which a pickup takes several in series", run: runJitter},
		{name: "latency-tx", defaultN: 500, summary: "an idle running client on the default configuration; N InsertTx, each in a transaction of its own committed at once, 5 ms apart; time from the Commit call to the step's start", run: runLatencyTx},
		{name: "await", defaultN: 500, summary: "an idle running client; N sequential Insert + client.Await of a one-step job; time from the Insert call to Await's answer", run: runAwait},
		{name: "signal", defaultN: 5000, summary: "N instances parked on Await, each signalled (4 senders at once); time from the Signal call to the woken step's start", run: runSignal},
		{name: "fanout", defaultN: 20000, summary: "one parent spawning N one-step children in another queue, then joining", run: runFanout},
		{name: "gated", defaultN: 50000, summary: "jobs, each under one gate key whose limit (100,000 over 8 shards) never binds: the admission cost", run: runGated},
		{name: "fair", defaultN: 50000, summary: "jobs, spread over 10,000 fairness keys (InsertOpts.FairnessKey, the key of job i is i mod 10,000): the fair order's cost", run: runFair},
		{name: "rated", defaultN: 50000, summary: "jobs, each under one rate limit that never binds (10 million a second): the admission cost", run: runRated},
		{name: "soak", named: true, summary: "a constant load (--rate, default 1,000/s) for --duration (default 1h) with GC at --retention; a report every --window (default 1m): work rate, pickup p50/p99, the instances table's sizes, live and dead tuples, autovacuum runs, GC deletions, lock waits", run: runSoak},
		{name: "cron", defaultN: 1000, named: true, summary: "N schedules firing every second for --duration (default 10 s) on one node that runs no queue; work/s = fires/s, latency = fire lag (fire time to the insert's commit), db_ms_per_fire", run: runCron},
	}
}

// Available lists the scenarios that can run now.
func Available() []string {
	var out []string
	for _, s := range scenarios() {
		if s.unavailable == "" {
			out = append(out, s.name)
		}
	}
	return out
}

// defaults lists the scenarios a run with none named runs: the available ones but the long ones.
func defaults() []string {
	var out []string
	for _, s := range scenarios() {
		if s.unavailable == "" && !s.named {
			out = append(out, s.name)
		}
	}
	return out
}

// Run runs the scenarios and sends each result to emit as soon as it is known.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options, emit func(Result)) error {
	if opts.Schema == "" {
		opts.Schema = "gendurable_bench"
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 100
	}
	if opts.Clients == 0 {
		opts.Clients = 1
	}
	if opts.Concurrency < 0 || opts.Prefetch < 0 || opts.N < 0 || opts.Clients < 0 || opts.Processes < 0 || opts.Preload < 0 || opts.PreloadLive < 0 ||
		opts.Duration < 0 || opts.Rate < 0 || opts.Window < 0 || opts.Retention < 0 {
		return fmt.Errorf("--n, --concurrency, --prefetch, --clients, --processes, --preload, --duration, --rate, --window and --retention must be positive")
	}
	if opts.Processes > 0 && opts.Worker == nil {
		return fmt.Errorf("--processes needs a way to start worker processes")
	}
	opts.durationSet = opts.Duration > 0
	if opts.Duration == 0 {
		opts.Duration = time.Hour
	}
	if opts.Rate == 0 {
		opts.Rate = 1000
	}
	if opts.Window == 0 {
		opts.Window = min(time.Minute, opts.Duration)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	byName := map[string]scenario{}
	for _, s := range scenarios() {
		byName[s.name] = s
	}
	names := opts.Scenarios
	if len(names) == 0 {
		names = defaults()
	}
	var todo []scenario
	for _, n := range names {
		s, ok := byName[n]
		if !ok {
			return fmt.Errorf("unknown scenario %q (available: %s)", n, strings.Join(Available(), ", "))
		}
		if s.unavailable != "" {
			return fmt.Errorf("scenario %q cannot run yet: it %s (available: %s)", n, s.unavailable, strings.Join(Available(), ", "))
		}
		todo = append(todo, s)
	}
	cond, err := conditions(ctx, pool)
	if err != nil {
		return err
	}
	r := &runner{pool: pool, opts: opts}
	r.emitWindow = func(w SoakWindow) {
		emit(Result{Scenario: "soak", Seconds: w.Seconds, Window: &w, Partial: true, Conditions: cond,
			Clients: opts.Clients, Preload: opts.Preload})
	}
	for _, s := range todo {
		n := opts.N
		if n == 0 {
			n = s.defaultN
		}
		if err := durablemigrate.Drop(ctx, pool, opts.Schema); err != nil {
			return err
		}
		if err := durablemigrate.Migrate(ctx, pool, opts.Schema); err != nil {
			return err
		}
		if opts.Preload > 0 || opts.PreloadLive > 0 {
			if err := preload(ctx, pool, opts.Schema, opts.Preload, opts.PreloadLive, "preloaded", "bench"); err != nil {
				return err
			}
		}
		r.heap = startHeapSampler()
		res, err := s.run(ctx, r, n)
		res.PeakHeapMB = r.heap.stop()
		dropErr := durablemigrate.Drop(context.WithoutCancel(ctx), pool, opts.Schema)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
		if dropErr != nil {
			return dropErr
		}
		res.Scenario, res.N, res.Conditions = s.name, n, cond
		res.Clients, res.Processes, res.Preload, res.PreloadLive = opts.Clients, opts.Processes, opts.Preload, opts.PreloadLive
		res.MaxRSSMB = maxRSSMB()
		emit(res)
	}
	return nil
}

func conditions(ctx context.Context, pool *pgxpool.Pool) (Conditions, error) {
	var c Conditions
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'),
		current_setting('fsync'), current_setting('shared_buffers'), current_setting('autovacuum')`).Scan(&c.Postgres,
		&c.SynchronousCommit, &c.Fsync, &c.SharedBuffers, &c.Autovacuum)
	c.CPUs = runtime.NumCPU()
	return c, err
}

// runner holds what every scenario shares.
type runner struct {
	pool *pgxpool.Pool
	opts Options
	heap *heapSampler
	// limits and rates are the concurrency gates and rate limits the scenario's clients
	// configure (gated and rated only: the others measure a client without them).
	limits map[string]gendurable.ConcurrencyLimit
	rates  map[string]gendurable.Rate
	// emitWindow reports a soak's window while it runs.
	emitWindow func(SoakWindow)
}

// client builds a client on the scenario's schema working queue "bench".
func (r *runner) client(machines []gendurable.Machine, hooks ...func(gendurable.Event)) (*gendurable.Client, error) {
	return r.named("bench", machines, hooks...)
}

func (r *runner) named(name string, machines []gendurable.Machine, hooks ...func(gendurable.Event)) (*gendurable.Client, error) {
	return gendurable.NewClient(r.pool, &gendurable.Config{
		Name:              name,
		Schema:            r.opts.Schema,
		Machines:          machines,
		Queues:            map[string]gendurable.QueueConfig{"bench": {Concurrency: r.opts.Concurrency, Prefetch: r.opts.Prefetch}},
		Logger:            r.opts.Logger,
		Hooks:             hooks,
		ConcurrencyLimits: r.limits,
		RateLimits:        r.rates,
		Codec:             r.opts.Codec,
		Poke:              r.opts.ClientPoke,
	})
}

// cluster is Options.Clients clients working one queue, like that many nodes.
type cluster []*gendurable.Client

func (r *runner) cluster(machines []gendurable.Machine, hooks ...func(gendurable.Event)) (cluster, error) {
	cs := make(cluster, r.opts.Clients)
	for i := range cs {
		c, err := r.named(fmt.Sprint("bench", i), machines, hooks...)
		if err != nil {
			return nil, err
		}
		cs[i] = c
	}
	return cs, nil
}

func (cs cluster) start(ctx context.Context) error {
	for _, c := range cs {
		if err := c.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (cs cluster) stop() error {
	var first error
	for _, c := range cs {
		if err := stop(c); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func stop(c *gendurable.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Stop(ctx)
}

// waitFor polls cond every millisecond until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// finishedCounter counts committed terminal outcomes (step.finished events of done/failed).
func finishedCounter(n *atomic.Int64) func(gendurable.Event) {
	return func(ev gendurable.Event) {
		if ev.Name == gendurable.EventStepFinished && (ev.Outcome == "done" || ev.Outcome == "failed") {
			n.Add(1)
		}
	}
}

type noArgs struct{}

func runJobs(ctx context.Context, r *runner, n int) (Result, error) {
	return jobs(ctx, r, n, func(int) *gendurable.InsertOpts { return nil })
}

// runGated is jobs with every job under one gate key whose limit never binds.
func runGated(ctx context.Context, r *runner, n int) (Result, error) {
	r.limits = map[string]gendurable.ConcurrencyLimit{"gate": {Limit: 100_000, Shards: 8}}
	defer func() { r.limits = nil }()
	return jobs(ctx, r, n, func(int) *gendurable.InsertOpts { return &gendurable.InsertOpts{ConcurrencyKey: "gate:bench"} })
}

// fairKeys is how many fairness keys the fair scenario spreads its jobs over.
const fairKeys = 10_000

// runFair is jobs spread over fairKeys fairness keys.
func runFair(ctx context.Context, r *runner, n int) (Result, error) {
	keys := make([]string, fairKeys)
	for i := range keys {
		keys[i] = fmt.Sprint("tenant-", i)
	}
	return jobs(ctx, r, n, func(i int) *gendurable.InsertOpts {
		return &gendurable.InsertOpts{FairnessKey: keys[i%fairKeys]}
	})
}

// runRated is jobs with every job under one rate limit that never binds.
func runRated(ctx context.Context, r *runner, n int) (Result, error) {
	r.rates = map[string]gendurable.Rate{"rate": {Allowed: 10_000_000, Period: time.Second, Burst: 1_000_000}}
	defer func() { r.rates = nil }()
	return jobs(ctx, r, n, func(int) *gendurable.InsertOpts { return &gendurable.InsertOpts{RateLimit: "rate:bench"} })
}

// noopJob is the jobs scenario's machine.
func noopJob() gendurable.Job[noArgs] {
	return gendurable.Job[noArgs]{Name: "noop", Queue: "bench", Perform: func(*gendurable.Ctx, noArgs) error { return nil }}
}

// jobs inserts n no-op jobs, job i with opts(i), and works them.
func jobs(ctx context.Context, r *runner, n int, opts func(i int) *gendurable.InsertOpts) (Result, error) {
	job := noopJob()
	var finished atomic.Int64
	cs, err := r.cluster([]gendurable.Machine{job}, finishedCounter(&finished))
	if err != nil {
		return Result{}, err
	}
	cl := cs[0]
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(noArgs{}), Opts: opts(i)}
	}
	t0 := time.Now()
	for i := 0; i < n; i += 1000 {
		if _, err := cl.InsertMany(ctx, params[i:min(i+1000, n)]); err != nil {
			return Result{}, err
		}
	}
	insert := time.Since(t0)
	if r.opts.Processes > 0 {
		pr, err := r.workProcesses(ctx, "jobs", int64(n))
		if err != nil {
			return Result{}, err
		}
		return Result{Seconds: round(insert.Seconds() + pr.work.Seconds()), InsertPerS: rate(n, insert),
			WorkPerS: rate(n, pr.work), DBmsPerJob: per(pr.dbMS, n), XactsPerJob: per(float64(pr.xacts), n)}, nil
	}
	// The figure that matters is the heap of a client working a backlog, not of the batch the
	// benchmark built to insert it (dead by now: params is not used again).
	r.heap.reset()
	t1, cpu := time.Now(), cpuTime()
	if err := cs.start(ctx); err != nil {
		return Result{}, err
	}
	err = waitFor(ctx, 10*time.Minute, "all jobs done", func() bool { return finished.Load() >= int64(n) })
	work, cpu := time.Since(t1), cpuTime()-cpu
	if serr := cs.stop(); err == nil {
		err = serr
	}
	if err != nil {
		return Result{}, err
	}
	return Result{Seconds: round(insert.Seconds() + work.Seconds()), InsertPerS: rate(n, insert), WorkPerS: rate(n, work),
		ClientCPUusPerJob: per(float64(cpu.Microseconds()), n)}, nil
}

type chainState struct {
	I int `json:"i"`
}

// chainLength is the number of steps of the chain scenario's machine.
const chainLength = 5

// chainFSM is the chain scenario's machine: chainLength no-op steps.
func chainFSM() gendurable.FSM[chainState] {
	const length = chainLength
	steps := map[string]gendurable.StepFunc[chainState]{}
	for i := range length {
		name := fmt.Sprint("s", i)
		next := fmt.Sprint("s", i+1)
		steps[name] = func(_ *gendurable.Ctx, s chainState) (gendurable.Outcome, error) {
			if i == length-1 {
				return gendurable.Done(nil), nil
			}
			return gendurable.Next(next, chainState{I: s.I + 1}), nil
		}
	}
	return gendurable.FSM[chainState]{Name: "chain", Start: "s0", Queue: "bench", Steps: steps}
}

func runChain(ctx context.Context, r *runner, n int) (Result, error) {
	const length = chainLength
	fsm := chainFSM()
	var finished atomic.Int64
	cs, err := r.cluster([]gendurable.Machine{fsm}, finishedCounter(&finished))
	if err != nil {
		return Result{}, err
	}
	cl := cs[0]
	chains := max(n/length, 1)
	params := make([]gendurable.InsertManyParams, chains)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: fsm.With(chainState{})}
	}
	if _, err := cl.InsertMany(ctx, params); err != nil {
		return Result{}, err
	}
	if r.opts.Processes > 0 {
		pr, err := r.workProcesses(ctx, "chain", int64(chains))
		if err != nil {
			return Result{}, err
		}
		return Result{Seconds: round(pr.work.Seconds()), StepsPerS: rate(chains*length, pr.work),
			DBmsPerJob: per(pr.dbMS, chains*length), XactsPerJob: per(float64(pr.xacts), chains*length)}, nil
	}
	r.heap.reset()
	t0, cpu := time.Now(), cpuTime()
	if err := cs.start(ctx); err != nil {
		return Result{}, err
	}
	err = waitFor(ctx, 10*time.Minute, "all chains done", func() bool { return finished.Load() >= int64(chains) })
	d, cpu := time.Since(t0), cpuTime()-cpu
	if serr := cs.stop(); err == nil {
		err = serr
	}
	if err != nil {
		return Result{}, err
	}
	return Result{Seconds: round(d.Seconds()), StepsPerS: rate(chains*length, d),
		ClientCPUusPerJob: per(float64(cpu.Microseconds()), chains*length)}, nil
}

type latArgs struct {
	T0 int64 `json:"t0"` // unix nanoseconds taken just before the Insert call
}

func runLatency(ctx context.Context, r *runner, n int) (Result, error) {
	return latency(ctx, r, n, false)
}

// runLatencyRemote is latency across nodes: the inserting client works no queue (a web node),
// the worker is another client on a pool of its own, and the insert's poke reaches it through
// the poke transport (Options.Poke, default PokePostgres).
func runLatencyRemote(ctx context.Context, r *runner, n int) (Result, error) {
	return latency(ctx, r, n, true)
}

// runLatencyTx is the transactional outbox's pickup: each instance is inserted with InsertTx in
// a transaction of its own, committed at once, on the client that works the queue, whose
// default poke transport cannot send with the commit.
func runLatencyTx(ctx context.Context, r *runner, n int) (Result, error) {
	var mu sync.Mutex
	began := make(map[int64]time.Time, n)
	job := gendurable.Job[latArgs]{Name: "latency", Queue: "bench", Perform: func(c *gendurable.Ctx, _ latArgs) error {
		mu.Lock()
		began[c.ID] = time.Now()
		mu.Unlock()
		return nil
	}}
	var finished atomic.Int64
	cl, err := r.client([]gendurable.Machine{job}, finishedCounter(&finished))
	if err != nil {
		return Result{}, err
	}
	if err := cl.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() { _ = stop(cl) }()
	time.Sleep(500 * time.Millisecond) // the client settles into its idle state
	committed := make(map[int64]time.Time, n)
	t0 := time.Now()
	for range n {
		tx, err := r.pool.Begin(ctx)
		if err != nil {
			return Result{}, err
		}
		res, err := cl.InsertTx(ctx, tx, job.With(latArgs{}), nil)
		if err != nil {
			_ = tx.Rollback(ctx)
			return Result{}, err
		}
		at := time.Now()
		if err := tx.Commit(ctx); err != nil {
			return Result{}, err
		}
		committed[res.ID] = at
		time.Sleep(5 * time.Millisecond)
	}
	if err := waitFor(ctx, time.Minute, "all latency-tx jobs done", func() bool { return finished.Load() >= int64(n) }); err != nil {
		return Result{}, err
	}
	d := time.Since(t0)
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, n)
	for id, at := range committed {
		lat = append(lat, began[id].Sub(at))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return Result{Seconds: round(d.Seconds()), P50ms: pct(lat, 0.50), P95ms: pct(lat, 0.95), P99ms: pct(lat, 0.99)}, nil
}

func latency(ctx context.Context, r *runner, n int, remote bool) (Result, error) {
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	total := make(map[int64]time.Duration, n) // by T0, for Samples
	job := gendurable.Job[latArgs]{Name: "latency", Queue: "bench", Perform: func(_ *gendurable.Ctx, a latArgs) error {
		d := time.Since(time.Unix(0, a.T0))
		mu.Lock()
		lat = append(lat, d)
		total[a.T0] = d
		mu.Unlock()
		return nil
	}}
	var finished atomic.Int64
	var worker, web *gendurable.Client
	var picks []time.Duration
	var err error
	if !remote {
		worker, err = r.client([]gendurable.Machine{job}, finishedCounter(&finished))
		web = worker
	} else {
		poke := gendurable.PokePostgres()
		if r.opts.Poke != nil {
			poke = r.opts.Poke()
		}
		wp, perr := pgxpool.NewWithConfig(ctx, r.pool.Config().Copy())
		if perr != nil {
			return Result{}, perr
		}
		defer wp.Close()
		worker, err = gendurable.NewClient(wp, &gendurable.Config{Name: "worker", Schema: r.opts.Schema, Logger: r.opts.Logger,
			Machines: []gendurable.Machine{job}, Queues: map[string]gendurable.QueueConfig{"bench": {Concurrency: r.opts.Concurrency}},
			Hooks: []func(gendurable.Event){finishedCounter(&finished), pickTimer(&mu, &picks)}, Poke: poke})
		if err == nil {
			webPoke := gendurable.PokePostgres()
			if r.opts.Poke != nil {
				webPoke = r.opts.Poke()
			}
			web, err = gendurable.NewClient(r.pool, &gendurable.Config{Name: "web", Schema: r.opts.Schema, Logger: r.opts.Logger,
				Machines: []gendurable.Machine{job}, Poke: webPoke, Reaper: &gendurable.ReaperConfig{Disabled: true},
				GC: &gendurable.GCConfig{Disabled: true}})
		}
	}
	if err != nil {
		return Result{}, err
	}
	if err := worker.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() { _ = stop(worker) }()
	if web != worker {
		if err := web.Start(ctx); err != nil {
			return Result{}, err
		}
		defer func() { _ = stop(web) }()
	}
	// Let the clients settle into their idle state first.
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	inserts := make([]time.Duration, 0, n)
	begans := make([]time.Time, 0, n)
	for range n {
		began := time.Now()
		if _, err := web.Insert(ctx, job.With(latArgs{T0: began.UnixNano()}), nil); err != nil {
			return Result{}, err
		}
		inserts = append(inserts, time.Since(began))
		begans = append(begans, began)
		time.Sleep(5 * time.Millisecond)
	}
	if err := waitFor(ctx, time.Minute, "all latency jobs done", func() bool { return finished.Load() >= int64(n) }); err != nil {
		return Result{}, err
	}
	d := time.Since(t0)
	mu.Lock()
	defer mu.Unlock()
	if w := r.opts.Samples; w != nil {
		name := "latency"
		if remote {
			name = "latency-remote"
		}
		for i, b := range begans {
			if _, err := fmt.Fprintf(w, "%s,%.3f,%.3f,%.3f\n", name, ms(b.Sub(begans[0])), ms(total[b.UnixNano()]), ms(inserts[i])); err != nil {
				return Result{}, fmt.Errorf("write the samples: %w", err)
			}
		}
	}
	for _, ds := range [][]time.Duration{lat, inserts, picks} {
		slices.Sort(ds)
	}
	return Result{Seconds: round(d.Seconds()), P50ms: pct(lat, 0.50), P95ms: pct(lat, 0.95), P99ms: pct(lat, 0.99),
		InsertP50ms: pct(inserts, 0.50), InsertP99ms: pct(inserts, 0.99), PickP50ms: pct(picks, 0.50), PickP99ms: pct(picks, 0.99)}, nil
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// runJitter is the host's own latency, without the database: n sleeps of 5 ms (the spacing of
// the latency scenarios' inserts), and how much later than asked each one woke. A pickup is
// several such wake-ups in series (the inserting goroutine's, the server's backends', the
// worker's goroutines'), each as late as the host makes it.
func runJitter(ctx context.Context, _ *runner, n int) (Result, error) {
	const nap = 5 * time.Millisecond
	late := make([]time.Duration, 0, n)
	t0 := time.Now()
	for range n {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		at := time.Now()
		time.Sleep(nap)
		late = append(late, max(time.Since(at)-nap, 0))
	}
	d := time.Since(t0)
	slices.Sort(late)
	return Result{Seconds: round(d.Seconds()), P50ms: pct(late, 0.50), P95ms: pct(late, 0.95), P99ms: pct(late, 0.99)}, nil
}

// pickTimer collects, under mu, the durations of a worker's picks that claimed rows.
func pickTimer(mu *sync.Mutex, picks *[]time.Duration) func(gendurable.Event) {
	return func(ev gendurable.Event) {
		if ev.Name == gendurable.EventSchedulerPicked && ev.Count > 0 {
			mu.Lock()
			*picks = append(*picks, ev.Duration)
			mu.Unlock()
		}
	}
}

// runAwait is the request/response round trip: insert, then hold the caller until the instance
// is done. The client's own completion is pushed to the waiter.
func runAwait(ctx context.Context, r *runner, n int) (Result, error) {
	job := gendurable.Job[struct{}]{Name: "await", Queue: "bench", Perform: func(*gendurable.Ctx, struct{}) error { return nil }}
	cl, err := r.client([]gendurable.Machine{job})
	if err != nil {
		return Result{}, err
	}
	if err := cl.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() { _ = stop(cl) }()
	time.Sleep(500 * time.Millisecond) // let the client settle into its idle state
	lat := make([]time.Duration, 0, n)
	t0 := time.Now()
	for range n {
		began := time.Now()
		res, err := cl.Insert(ctx, job.With(struct{}{}), nil)
		if err != nil {
			return Result{}, err
		}
		a, err := cl.Await(ctx, res.ID, 10*time.Second, nil)
		if err != nil {
			return Result{}, err
		}
		if a.Status != gendurable.AwaitDone {
			return Result{}, fmt.Errorf("await %d answered %s", res.ID, a.Status)
		}
		lat = append(lat, time.Since(began))
	}
	d := time.Since(t0)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return Result{Seconds: round(d.Seconds()), StepsPerS: rate(n, d), P50ms: pct(lat, 0.50), P95ms: pct(lat, 0.95),
		P99ms: pct(lat, 0.99)}, nil
}

type parked struct{}

type wakeArgs struct {
	T0 int64 `json:"t0"` // unix nanoseconds taken just before the Signal call
}

func runSignal(ctx context.Context, r *runner, n int) (Result, error) {
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	fsm := gendurable.FSM[parked]{Name: "parker", Start: "park", Queue: "bench",
		Steps: map[string]gendurable.StepFunc[parked]{
			"park": func(*gendurable.Ctx, parked) (gendurable.Outcome, error) {
				return gendurable.Await([]string{"go"}, "woke", parked{}), nil
			},
			"woke": func(ctx *gendurable.Ctx, _ parked) (gendurable.Outcome, error) {
				var a wakeArgs
				if len(ctx.Awaited) > 0 {
					if err := ctx.Awaited[0].Decode(&a); err != nil {
						return gendurable.Outcome{}, err
					}
					d := time.Since(time.Unix(0, a.T0))
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
				return gendurable.Done(nil), nil
			},
		}}
	var finished atomic.Int64
	var parkedN atomic.Int64
	cl, err := r.client([]gendurable.Machine{fsm}, finishedCounter(&finished), func(ev gendurable.Event) {
		if ev.Name == gendurable.EventStepFinished && ev.Outcome == "await" {
			parkedN.Add(1)
		}
	})
	if err != nil {
		return Result{}, err
	}
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: fsm.With(parked{})}
	}
	res, err := cl.InsertMany(ctx, params)
	if err != nil {
		return Result{}, err
	}
	if err := cl.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() { _ = stop(cl) }()
	if err := waitFor(ctx, 5*time.Minute, "all instances parked", func() bool { return parkedN.Load() >= int64(n) }); err != nil {
		return Result{}, err
	}
	r.heap.reset()
	t0, cpu := time.Now(), cpuTime()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				if _, err := cl.Signal(ctx, gendurable.ByID(res[i].ID), "go", wakeArgs{T0: time.Now().UnixNano()}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Result{}, err
	}
	if err := waitFor(ctx, 5*time.Minute, "all woken instances done", func() bool { return finished.Load() >= int64(n) }); err != nil {
		return Result{}, err
	}
	d, cpu := time.Since(t0), cpuTime()-cpu
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return Result{Seconds: round(d.Seconds()), StepsPerS: rate(n, d), P50ms: pct(lat, 0.50), P95ms: pct(lat, 0.95), P99ms: pct(lat, 0.99),
		ClientCPUusPerJob: per(float64(cpu.Microseconds()), n)}, nil
}

type fanState struct {
	N      int `json:"n"`
	Joined int `json:"joined"`
}

func runFanout(ctx context.Context, r *runner, n int) (Result, error) {
	kid := gendurable.Job[noArgs]{Name: "kid", Queue: "bench", Perform: func(*gendurable.Ctx, noArgs) error { return nil }}
	var joined atomic.Bool
	parent := gendurable.FSM[fanState]{Name: "parent", Start: "spawn", Queue: "parents",
		Steps: map[string]gendurable.StepFunc[fanState]{
			"spawn": func(_ *gendurable.Ctx, s fanState) (gendurable.Outcome, error) {
				kids := make([]gendurable.Child, s.N)
				for i := range kids {
					kids[i] = gendurable.Child{Input: kid.With(noArgs{})}
				}
				return gendurable.Spawn(kids, "join", s), nil
			},
			"join": func(ctx *gendurable.Ctx, s fanState) (gendurable.Outcome, error) {
				s.Joined = len(ctx.Children)
				return gendurable.Done(s), nil
			},
		}}
	var finished atomic.Int64
	cl, err := gendurable.NewClient(r.pool, &gendurable.Config{
		Name: "bench", Schema: r.opts.Schema, Machines: []gendurable.Machine{parent, kid}, Logger: r.opts.Logger,
		Queues: map[string]gendurable.QueueConfig{"bench": {Concurrency: r.opts.Concurrency}, "parents": {Concurrency: 1}},
		Hooks: []func(gendurable.Event){finishedCounter(&finished), func(ev gendurable.Event) {
			if ev.Name == gendurable.EventStepFinished && ev.Machine == "parent" && ev.Outcome == "done" {
				joined.Store(true)
			}
		}},
	})
	if err != nil {
		return Result{}, err
	}
	if _, err := cl.Insert(ctx, parent.With(fanState{N: n}), nil); err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	if err := cl.Start(ctx); err != nil {
		return Result{}, err
	}
	err = waitFor(ctx, 10*time.Minute, "the parent joined", joined.Load)
	d := time.Since(t0)
	if serr := stop(cl); err == nil {
		err = serr
	}
	if err != nil {
		return Result{}, err
	}
	// Steps: the spawn, every child, the join.
	return Result{Seconds: round(d.Seconds()), StepsPerS: rate(n+2, d)}, nil
}

func pct(sorted []time.Duration, p float64) *float64 {
	if len(sorted) == 0 {
		return nil
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = min(max(i, 0), len(sorted)-1)
	v := round(float64(sorted[i].Microseconds()) / 1000)
	return &v
}

func rate(n int, d time.Duration) *float64 {
	v := round(float64(n) / d.Seconds())
	return &v
}

func round(v float64) float64 {
	switch {
	case v >= 100:
		return float64(int64(v + 0.5))
	default:
		return float64(int64(v*100+0.5)) / 100
	}
}

// heapSampler records the largest live heap while a scenario runs.
type heapSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	peak atomic.Uint64
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{done: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() {
		metrics.Read(sample)
		if v := sample[0].Value.Uint64(); v > h.peak.Load() {
			h.peak.Store(v)
		}
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.done:
				read()
				return
			case <-t.C:
				read()
			}
		}
	}()
	return h
}

// reset forgets the peak so far (after a collection, so that garbage does not count).
func (h *heapSampler) reset() {
	runtime.GC()
	h.peak.Store(0)
}

func (h *heapSampler) stop() float64 {
	close(h.done)
	h.wg.Wait()
	return round(float64(h.peak.Load()) / (1 << 20))
}

// usage is the process's resource usage so far (zero if unknown).
func usage() syscall.Rusage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return syscall.Rusage{}
	}
	return ru
}

// cpuTime is the CPU time (user and system) the process has used so far (0 if unknown).
func cpuTime() time.Duration {
	ru := usage()
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func maxRSSMB() float64 {
	return round(float64(usage().Maxrss) / 1024) // kilobytes on Linux
}

// WriteTable prints results as a human-readable table.
func WriteTable(w io.Writer, results []Result) {
	if len(results) == 0 {
		return
	}
	c := results[0].Conditions
	fmt.Fprintf(w, "Postgres %s, synchronous_commit=%s, fsync=%s, shared_buffers=%s, autovacuum=%s, %d CPUs\n\n",
		c.Postgres, c.SynchronousCommit, c.Fsync, c.SharedBuffers, c.Autovacuum, c.CPUs)
	fmt.Fprintf(w, "%-9s %8s %8s %10s %10s %10s %8s %8s %8s %9s\n",
		"scenario", "n", "seconds", "insert/s", "work/s", "steps/s", "p50 ms", "p95 ms", "p99 ms", "heap MB")
	f := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	for _, r := range results {
		fmt.Fprintf(w, "%-9s %8d %8.2f %10s %10s %10s %8s %8s %8s %9.1f\n",
			r.Scenario, r.N, r.Seconds, f(r.InsertPerS), f(r.WorkPerS), f(r.StepsPerS), f(r.P50ms), f(r.P95ms), f(r.P99ms), r.PeakHeapMB)
	}
}

// WriteJSON prints one result as one JSON line.
func WriteJSON(w io.Writer, r Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
