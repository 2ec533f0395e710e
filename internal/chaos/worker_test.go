package chaos

// The worker-process harness, the one every test here that needs another process uses: the test
// binary re-executed as a worker (TestMain dispatches on GD_WORKER), configured by one workerCfg
// (JSON in GD_WORKER), running one set of machines, and reporting one workerReport when it is
// stopped. The test side starts it and waits for "ready", SIGKILLs, SIGSTOPs and SIGCONTs it, and
// SIGTERMs it to drain and read its report.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// workerEnv names the environment variable that makes the test binary a worker: its value is the
// worker's configuration, a workerCfg in JSON.
const workerEnv = "GD_WORKER"

// The machine sets a worker can run (workerCfg.Machines).
const (
	// machinesCrash: linear5 (queue of the instance's insert, "crash" by default) whose every
	// step records its effect on the engine's pool and then sleeps StepMS, and the fan-out parent
	// fan (fanMachine), whose steps record theirs too.
	machinesCrash = "crash"
	// machinesChaos: linear5 for infrastructure faults (chaosMachine, queue "chaos"): each step
	// records its effect on a pool of its own (FxURL), retrying until it lands, and sleeps up to
	// StepMS, a function of Seed and the step.
	machinesChaos = "chaos"
	// machinesRaces: gatewalk (T3), t6job and t6fan (T6), stamp and timed (T12), in the first
	// queue, each step sleeping U(StepMinMS, StepMaxMS) (racesMachines).
	machinesRaces = "races"
	// machinesDocsV1, machinesDocsV2: version 1 or 2 of the doc machine (docMachine, queue
	// "docs"), whose steps record which version of the code ran them.
	machinesDocsV1 = "docs1"
	machinesDocsV2 = "docs2"
	// machinesFast: fast5 and solo (fastpaths_test.go), queue "fast": each step records its
	// effect, sleeps StepMS whatever becomes of its claim, and names the client that ran it.
	machinesFast = "fast"
	// machinesHA: hachain and haprobe (failover_test.go), queue of the insert: chains of
	// instances that wake each other with signals sent in their steps' transactions, through a
	// gate, each step recording its effect in its own transaction.
	machinesHA = "ha"
	// machinesFair: fairjob (fairness_test.go), queue of the insert: a job that sleeps StepMS,
	// under the client's FairWeights.
	machinesFair = "fair"
)

// workerCfg configures a worker process. Durations are in milliseconds; a zero ReaperMS or GCMS
// turns the reaper or GC off, a zero HeartbeatMS or Conns takes the library's or pgx's default.
type workerCfg struct {
	// URL is the engine's database, FxURL the effects' (default URL), Schema the schema, Name the
	// client's name; App is the engine pool's application_name (default gd-worker-<name>-<pid>).
	URL, FxURL, Schema, Name, App string
	// Conns and FxConns size the engine's and the effects' pools; ExecMode is the engine pool's
	// pgx exec mode ("", "exec", "simple" or "describe").
	Conns, FxConns int32
	ExecMode       string
	// Machines is the machine set (machinesCrash, machinesChaos, machinesRaces, machinesDocsV1,
	// machinesDocsV2 or machinesFast).
	Machines string
	// Queues are worked with Conc slots each and Prefetch more claims; Probes adds one-slot
	// queues p0, p1, …
	Queues   []string
	Conc     int
	Prefetch int
	Probes   int
	// QueuePollMS overrides PollMS for some queues.
	QueuePollMS map[string]int
	// The client's timing.
	LeaseMS, HeartbeatMS, PollMS, ReaperMS, GCMS, RetentionMS int
	// Gates: name -> {limit, shards}; Rates: name -> {allowed, period ms, burst}.
	Gates map[string][2]int
	Rates map[string][3]int
	// StepMS is each step's sleep in the crash set, its bound in the chaos set; StepMinMS and
	// StepMaxMS bound it in the races set.
	StepMS, StepMinMS, StepMaxMS int
	Seed                         uint64
	// Poke "postgres" pokes through LISTEN/NOTIFY (default: local).
	Poke string
	// Ticks records when each of the client's loops did its work (workerReport.Ticks).
	Ticks bool
	// Quiet drops the client's log lines (they are still scanned for the report).
	Quiet bool
	// Marks prints a line for every step that finished an instance, as its commit returned
	// (worker.doneAt).
	Marks bool
	// Beats prints a line for every heartbeat that reached the database, with when it was sent
	// (worker.beatSince).
	Beats bool
	// Schedules (crash set): the client's Config.Service is its Name, and it declares
	// OwnSchedules schedules "<name>-<k>" and the SharedSchedules, each firing linear5 in the
	// first queue every ScheduleEveryMS, overlap allowed, with a catch-up window of
	// ScheduleCatchUpMS.
	OwnSchedules                       int
	SharedSchedules                    []string
	ScheduleEveryMS, ScheduleCatchUpMS int
	// FairWeights are the client's fairness weights (Config.FairnessWeights).
	FairWeights map[string]float64
	// Inserters (fast set): this many goroutines insert solo instances with Insert, so that the
	// worker's own Insert claims them, until SIGUSR1; the worker then prints "inserted <n>"
	// (fastWorker.insertLoop).
	Inserters int
}

// leaseMS sets a worker's lease and a heartbeat of a fifth of it.
func leaseMS(ms int) func(*workerCfg) {
	return func(c *workerCfg) { c.LeaseMS, c.HeartbeatMS = ms, ms/5 }
}

// crashCfg is the crash set's worker in e's schema: queue "crash", 8 slots, lease 1s, heartbeat
// 200ms, poll and reaper 100ms, GC at the library's defaults, steps of 5ms; set changes the rest.
func (e *env) crashCfg(name string, set ...func(*workerCfg)) workerCfg {
	c := workerCfg{URL: e.url, Schema: e.schema, Name: name, Machines: machinesCrash, Queues: []string{"crash"}, Conc: 8,
		PollMS: 100, ReaperMS: 100, GCMS: int(gendurable.DefaultGCInterval.Milliseconds()), StepMS: 5}
	for _, f := range append([]func(*workerCfg){leaseMS(1000)}, set...) {
		f(&c)
	}
	return c
}

// chaosCfg is the chaos set's worker on the engine URL url (effects on fxURL): queue "chaos",
// 8 slots, lease 2s, heartbeat 400ms, poll 200ms, reaper 250ms, GC off, steps of up to 10ms, pools
// of 12 and 4 connections; set changes the rest.
func chaosCfg(url, fxURL, schema, name string, set ...func(*workerCfg)) workerCfg {
	c := workerCfg{URL: url, FxURL: fxURL, Schema: schema, Name: name, Machines: machinesChaos, Queues: []string{"chaos"},
		Conc: 8, Conns: 12, FxConns: 4, PollMS: 200, ReaperMS: 250, RetentionMS: int((24 * time.Hour).Milliseconds()),
		StepMS: 10}
	for _, f := range append([]func(*workerCfg){leaseMS(2000)}, set...) {
		f(&c)
	}
	return c
}

// staleClaim is a claim, as the outcome log and a worker's outcome.stale events name it: the
// instance, the step it was claimed at, and the attempt (the attempt alone does not tell the
// claims of one instance apart: every step's first claim is attempt 1).
type staleClaim struct {
	ID      int64  `json:"id"`
	Step    string `json:"step"`
	Attempt int64  `json:"attempt"`
}

// workerReport is what a worker counted, printed as its last line ("report {json}") when it
// stops gracefully (a SIGKILLed worker prints nothing).
type workerReport struct {
	// Events counts every event the client emitted, by name.
	Events map[string]int `json:"events"`
	// StaleClaims are the claims of the outcomes it dropped as stale (outcome.stale).
	StaleClaims []staleClaim `json:"stale_claims"`
	// LostClaims are the instances whose running steps the heartbeat cancelled, their claims
	// lost (from the log's "lost claims" lines: at most ten a line).
	LostClaims []int64 `json:"lost_claims,omitempty"`
	// HandBacks counts the claims of steps whose own transaction lost its session, handed back.
	HandBacks int `json:"hand_backs,omitempty"`
	// CommitFailed counts the committer's failed tries (commit.failed without an instance: not
	// its final give-up), Unknown those whose outcome is unknown (not pgconn.SafeToRetry).
	CommitFailed int `json:"commit_failed"`
	Unknown      int `json:"unknown"`
	// Errors22P02 and Prepared count invalid_text_representation and "prepared statement" errors
	// seen in any event or log line.
	Errors22P02 int `json:"errors_22p02"`
	Prepared    int `json:"prepared"`
	// Ticks (workerCfg.Ticks) holds, for each of the client's loops, when a piece of work it
	// reported began and ended (unix milliseconds; of the pieces that ended within 50ms of each
	// other, the first): scheduler.picked, heartbeat.beat, reaper.swept, gc.swept.
	Ticks map[string][][2]int64 `json:"ticks,omitempty"`
	// Busy (workerCfg.Ticks) holds the windows (unix milliseconds, from and to) in which the
	// client ran steps without a break for at least two heartbeat intervals: every heartbeat
	// tick inside one has claims to extend, so it must report a beat.
	Busy [][2]int64 `json:"busy,omitempty"`
}

func (r workerReport) stale() int { return r.Events[string(gendurable.EventOutcomeStale)] }
func (r workerReport) steps() int { return r.Events[string(gendurable.EventStepFinished)] }

// busyAfter returns the first busy window (Busy) that reaches at least span past t, from where it
// begins or t, whichever is later; ok is false if there is none.
func (r workerReport) busyAfter(t time.Time, span time.Duration) (from time.Time, ok bool) {
	for _, w := range r.Busy {
		b := time.UnixMilli(w[0])
		if b.Before(t) {
			b = t
		}
		if time.UnixMilli(w[1]).Sub(b) >= span {
			return b, true
		}
	}
	return time.Time{}, false
}

// firstTickAfter returns, for each loop, how long after t its first tick came (absent: none). A
// tick is when a piece of work that got through began, and a piece in flight at t ticks at t:
// the loop was at work when t came and got through (t, the return of pg_ctl start -w, comes
// after the server is ready by up to pg_ctl's polling interval, and work that began in between
// is the loop coming back). How long the database then took is not the loop's lateness.
func (r workerReport) firstTickAfter(t time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, ts := range r.Ticks {
		for _, w := range ts { // in the order the pieces ended
			if !time.UnixMilli(w[1]).Before(t) {
				out[name] = max(time.UnixMilli(w[0]).Sub(t), 0)
				break
			}
		}
	}
	return out
}

// sum adds up reports' counts.
func sum(all ...workerReport) workerReport {
	s := workerReport{Events: map[string]int{}}
	for _, x := range all {
		for name, n := range x.Events {
			s.Events[name] += n
		}
		s.StaleClaims = append(s.StaleClaims, x.StaleClaims...)
		s.LostClaims = append(s.LostClaims, x.LostClaims...)
		s.HandBacks += x.HandBacks
		s.CommitFailed += x.CommitFailed
		s.Unknown += x.Unknown
		s.Errors22P02 += x.Errors22P02
		s.Prepared += x.Prepared
	}
	return s
}

// tally builds a worker's report from its client's events and log lines.
type tally struct {
	mu    sync.Mutex
	r     workerReport
	ticks bool
	marks bool
	beats bool
	// busyMin is the shortest busy window recorded (ms); running and busyFrom track the steps
	// in flight.
	busyMin  int64
	running  int
	busyFrom int64
}

// step counts a step starting (+1) or ending (-1) at unix ms at, and records the busy window
// that ends.
func (c *tally) step(d int, at int64) {
	if d > 0 && c.running == 0 {
		c.busyFrom = at
	}
	c.running = max(c.running+d, 0)
	if d < 0 && c.running == 0 && at-c.busyFrom >= c.busyMin {
		c.r.Busy = append(c.r.Busy, [2]int64{c.busyFrom, at})
	}
}

func (c *tally) scanLog(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.Contains(s, "22P02") {
		c.r.Errors22P02++
	}
	if strings.Contains(s, "prepared statement") {
		c.r.Prepared++
	}
	if strings.Contains(s, "handing its claim back") {
		c.r.HandBacks++
	}
	if _, ids, ok := strings.Cut(s, "lost claims;"); ok {
		// "ids=<id> (<token>), …": the instances whose running steps the heartbeat cancelled.
		if _, list, ok := strings.Cut(ids, "ids="); ok {
			for _, f := range strings.Split(list, ", ") {
				var id int64
				if _, err := fmt.Sscan(f, &id); err == nil {
					c.r.LostClaims = append(c.r.LostClaims, id)
				}
			}
		}
	}
}

func (c *tally) hook(ev gendurable.Event) {
	// A piece of work began at the event's time less its Duration and ended at the event's time,
	// not when the hook got the event: hooks run behind the loops, on a goroutine of their own.
	at := ev.At
	if at.IsZero() {
		at = time.Now()
	}
	work := [2]int64{at.Add(-ev.Duration).UnixMilli(), at.UnixMilli()}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.r.Events[string(ev.Name)]++
	if ev.Err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(ev.Err, &pgErr) && pgErr.Code == "22P02" {
			c.r.Errors22P02++
		}
		if strings.Contains(ev.Err.Error(), "prepared statement") {
			c.r.Prepared++
		}
	}
	if c.ticks {
		switch {
		case ev.Name == gendurable.EventStepStarted:
			c.step(1, at.UnixMilli())
		case ev.Name == gendurable.EventStepFinished, ev.Name == gendurable.EventOutcomeStale,
			ev.Name == gendurable.EventCommitFailed && ev.InstanceID != 0:
			c.step(-1, at.UnixMilli())
		}
	}
	if c.beats && ev.Name == gendurable.EventHeartbeatBeat {
		fmt.Printf("%s%d\n", beatPrefix, at.Add(-ev.Duration).UnixNano()) // when it was sent
	}
	switch ev.Name {
	case gendurable.EventStepFinished:
		if c.marks && ev.Outcome == "done" {
			fmt.Printf("%s%d %d\n", markPrefix, ev.InstanceID, ev.At.UnixNano())
		}
	case gendurable.EventOutcomeStale:
		c.r.StaleClaims = append(c.r.StaleClaims, staleClaim{ev.InstanceID, ev.Step, int64(ev.Attempt)})
	case gendurable.EventCommitFailed:
		if ev.InstanceID == 0 { // a failed try of the committer (not its final give-up)
			c.r.CommitFailed++
			if !pgconn.SafeToRetry(ev.Err) {
				c.r.Unknown++
			}
		}
	case gendurable.EventSchedulerPicked, gendurable.EventHeartbeatBeat, gendurable.EventReaperSwept, gendurable.EventGCSwept:
		if c.ticks {
			// Dropping a later piece that ended in the same 50ms only makes a first tick later.
			if ts := c.r.Ticks[string(ev.Name)]; len(ts) == 0 || work[1]-ts[len(ts)-1][1] >= 50 {
				c.r.Ticks[string(ev.Name)] = append(ts, work)
			}
		}
	}
}

func (c *tally) json() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(c.r)
	return string(b)
}

// poolConfig parses url into a pool config with an application name (for finding the pool's
// backends), at most maxConns connections (0: pgx's default) and the exec mode ("" keeps pgx's
// default).
func poolConfig(url, app string, maxConns int32, mode string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	switch mode {
	case "":
	case "exec":
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	case "simple":
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	case "describe":
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
	default:
		return nil, fmt.Errorf("unknown exec mode %q", mode)
	}
	return cfg, nil
}

// workerMain runs the test binary as a worker process configured by the JSON in GD_WORKER: a
// client working cfg.Queues with cfg.Machines. It prints "ready" once started; on SIGTERM it
// drains, prints "report <json>" (a workerReport) and exits (status 1 if the drain failed).
func workerMain(cfgJSON string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "worker:", err); return 2 }
	var cfg workerCfg
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return fail(fmt.Errorf("%s: %w", workerEnv, err))
	}
	ctx := context.Background()
	pid := os.Getpid()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	app := cfg.App
	if app == "" {
		app = workerApp(cfg.Name, pid)
	}
	pc, err := poolConfig(cfg.URL, app, cfg.Conns, cfg.ExecMode)
	if err != nil {
		return fail(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	fxURL := cfg.FxURL
	if fxURL == "" {
		fxURL = cfg.URL
	}
	fc, err := poolConfig(fxURL, fmt.Sprintf("fx-%d", pid), cfg.FxConns, "")
	if err != nil {
		return fail(err)
	}
	fx, err := pgxpool.NewWithConfig(ctx, fc)
	if err != nil {
		return fail(err)
	}
	defer fx.Close()

	var machines []gendurable.Machine
	var fast *fastWorker
	var ha *haWorker
	switch cfg.Machines {
	case machinesCrash:
		rec := effectRecorder(pool, cfg.Schema, pid)
		machines = []gendurable.Machine{linear("linear5", ms(cfg.StepMS), rec), fanMachine(rec)}
	case machinesChaos:
		machines = []gendurable.Machine{chaosMachine(fx, cfg.Schema, pid, cfg.Seed, ms(cfg.StepMS))}
	case machinesRaces:
		machines = newRacesWorker(cfg, fx).machines()
	case machinesDocsV1:
		machines = []gendurable.Machine{docMachine(1, fx, cfg.Schema, pid)}
	case machinesDocsV2:
		machines = []gendurable.Machine{docMachine(2, fx, cfg.Schema, pid)}
	case machinesFast:
		fast = newFastWorker(cfg, fx)
		machines = fast.machines()
	case machinesHA:
		ha = &haWorker{cfg: cfg}
		machines = ha.machines()
	case machinesFair:
		machines = []gendurable.Machine{fairJob(ms(cfg.StepMS))}
	default:
		return fail(fmt.Errorf("unknown machine set %q", cfg.Machines))
	}
	queues := map[string]gendurable.QueueConfig{}
	for _, q := range cfg.Queues {
		queues[q] = gendurable.QueueConfig{Concurrency: cfg.Conc, Prefetch: cfg.Prefetch, PollInterval: ms(cfg.QueuePollMS[q])}
	}
	// Probe queues of one slot each: a probe insert goes to a queue of its own, so that only a
	// poke, never a poll of a busy queue, can start it fast.
	for i := range cfg.Probes {
		queues[fmt.Sprint("p", i)] = gendurable.QueueConfig{Concurrency: 1}
	}
	counts := &tally{r: workerReport{Events: map[string]int{}}, ticks: cfg.Ticks, marks: cfg.Marks, beats: cfg.Beats,
		busyMin: 2 * int64(cfg.HeartbeatMS)}
	if cfg.Ticks {
		counts.r.Ticks = map[string][][2]int64{}
	}
	logs := &scanHandler{scan: counts.scanLog, next: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})}
	if cfg.Quiet {
		logs.next = nil
	}
	c := &gendurable.Config{
		Name: cfg.Name, Schema: cfg.Schema, Machines: machines, Queues: queues,
		Lease:           ms(cfg.LeaseMS),
		Heartbeat:       ms(cfg.HeartbeatMS),
		PollInterval:    ms(cfg.PollMS),
		Reaper:          &gendurable.ReaperConfig{Disabled: cfg.ReaperMS == 0, Interval: ms(cfg.ReaperMS)},
		GC:              &gendurable.GCConfig{Disabled: cfg.GCMS == 0, Interval: ms(cfg.GCMS), Retention: ms(cfg.RetentionMS)},
		Hooks:           []func(gendurable.Event){counts.hook},
		Logger:          slog.New(logs),
		FairnessWeights: cfg.FairWeights,
	}
	if cfg.Poke == "postgres" {
		c.Poke = gendurable.PokePostgres()
	}
	if cfg.OwnSchedules > 0 || len(cfg.SharedSchedules) > 0 {
		names := slices.Clone(cfg.SharedSchedules)
		for k := range cfg.OwnSchedules {
			names = append(names, fmt.Sprintf("%s-%d", cfg.Name, k))
		}
		c.Service = cfg.Name
		for _, n := range names {
			c.Schedules = append(c.Schedules, gendurable.Schedule{Name: n, Input: linear("linear5", 0, nil).With(path{}),
				Opts: &gendurable.InsertOpts{Queue: cfg.Queues[0]}, Every: ms(cfg.ScheduleEveryMS),
				CatchUp: ms(cfg.ScheduleCatchUpMS), Overlap: gendurable.OverlapAllow})
		}
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
			c.RateLimits[name] = gendurable.Rate{Allowed: r[0], Period: ms(r[1]), Burst: r[2]}
		}
	}
	cl, err := gendurable.NewClient(pool, c)
	if err != nil {
		return fail(err)
	}
	if ha != nil {
		ha.cl = cl
	}
	if err := cl.Start(ctx); err != nil {
		return fail(err)
	}
	// The handler is in place before "ready": a SIGTERM sent the moment the test reads it must
	// drain the worker, not kill it without its report.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	stopInserts := func() {}
	if fast != nil && cfg.Inserters > 0 {
		stopInserts = fast.insertLoop(cl)
	}
	fmt.Println("ready")
	<-sig
	stopInserts()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	code := 0
	if err := cl.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "worker: stop:", err)
		code = 1
	}
	fmt.Println("report " + counts.json())
	return code
}

// scanHandler passes every log line (message and attributes) to scan, then to next (nil: drops
// it).
type scanHandler struct {
	scan  func(string)
	next  slog.Handler
	attrs []slog.Attr
}

func (h *scanHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *scanHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	for _, a := range h.attrs {
		b.WriteString(" " + a.String())
	}
	h.scan(b.String())
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *scanHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), as...)
	return &c
}

func (h *scanHandler) WithGroup(string) slog.Handler { return h }

// worker is a worker process.
type worker struct {
	cmd  *exec.Cmd
	cfg  workerCfg
	name string
	// report receives the worker's report if it prints one; done is closed once the process
	// has exited and been reaped (exitErr is then its exit status).
	report  chan workerReport
	done    chan struct{}
	exitErr error
	// inserted receives the count of a workerCfg.Inserters worker's "inserted <n>" line.
	inserted chan int
	// finished holds the marks of workerCfg.Marks: when this worker's commit finished an
	// instance, by id.
	mu       sync.Mutex
	finished map[int64]time.Time
	lastBeat time.Time // when the last heartbeat of workerCfg.Beats was sent
}

// markPrefix starts a worker's stdout line that marks a finished instance (workerCfg.Marks).
const markPrefix = "done "

// beatPrefix starts a worker's stdout line that marks a heartbeat (workerCfg.Beats).
const beatPrefix = "beat "

// mark records a line of workerCfg.Marks or workerCfg.Beats; it reports whether line is one.
func (w *worker) mark(line string) bool {
	if s, ok := strings.CutPrefix(line, beatPrefix); ok {
		var ns int64
		if _, err := fmt.Sscan(s, &ns); err == nil {
			w.mu.Lock()
			w.lastBeat = time.Unix(0, ns)
			w.mu.Unlock()
		}
		return true
	}
	s, ok := strings.CutPrefix(line, markPrefix)
	if !ok {
		return false
	}
	var id, ns int64
	if _, err := fmt.Sscan(s, &id, &ns); err == nil {
		w.mu.Lock()
		w.finished[id] = time.Unix(0, ns)
		w.mu.Unlock()
	}
	return true
}

// beatSince reports whether a heartbeat of this worker's (workerCfg.Beats) sent after t reached
// the database.
func (w *worker) beatSince(t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastBeat.After(t)
}

// doneAt is when this worker's commit finished instance id (workerCfg.Marks), if it did.
func (w *worker) doneAt(id int64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.finished[id]
	return at, ok
}

// startWorker starts a worker process with cfg (and extra environment variables) and waits until
// it is ready. The test's cleanup kills it if it still runs.
func startWorker(t testing.TB, cfg workerCfg, extraEnv ...string) *worker {
	t.Helper()
	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stderr = &prefixWriter{prefix: "[" + cfg.Name + "] ", w: os.Stderr}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	w := &worker{cmd: cmd, cfg: cfg, name: cfg.Name, report: make(chan workerReport, 1), done: make(chan struct{}),
		finished: map[int64]time.Time{}, inserted: make(chan int, 1)}
	t.Cleanup(w.kill)
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	for err == nil && w.mark(line) {
		line, err = r.ReadString('\n')
	}
	go func() { // reads the report and reaps the process however it ends, so that kill never waits forever
		for {
			line, err := r.ReadString('\n')
			if w.mark(line) {
				continue
			}
			if s, ok := strings.CutPrefix(line, insertedPrefix); ok {
				var n int
				if _, err := fmt.Sscan(s, &n); err == nil {
					w.inserted <- n
				}
				continue
			}
			if s, ok := strings.CutPrefix(line, "report "); ok {
				var rep workerReport
				if json.Unmarshal([]byte(s), &rep) == nil {
					w.report <- rep
				}
			}
			if err != nil {
				break
			}
		}
		_, _ = io.Copy(io.Discard, r)
		w.exitErr = cmd.Wait()
		close(w.done)
	}()
	if err != nil || line != "ready\n" {
		t.Fatalf("worker %s did not start: %q, %v", cfg.Name, line, err)
	}
	return w
}

func (w *worker) pid() int { return w.cmd.Process.Pid }

// app is the application_name of the worker's engine pool (workerCfg.App).
func (w *worker) app() string {
	if w.cfg.App != "" {
		return w.cfg.App
	}
	return workerApp(w.cfg.Name, w.pid())
}

// workerApp is the default application_name of the engine pool of worker name in process pid.
func workerApp(name string, pid int) string { return fmt.Sprintf("gd-worker-%s-%d", name, pid) }

// kill SIGKILLs the worker (stopped or not) and waits for it to be gone.
func (w *worker) kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
}

// stop SIGTERMs the worker, waits for its drain and exit, and returns its report; the worker's
// exit status is then in exitErr.
func (w *worker) stop(t testing.TB) workerReport {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker %s did not exit within 30s of SIGTERM", w.name)
	}
	select {
	case rep := <-w.report:
		return rep
	default:
		t.Fatalf("worker %s printed no report", w.name)
		return workerReport{}
	}
}

// term is stop for a worker whose drain must succeed: it also requires a clean exit.
func (w *worker) term(t testing.TB) workerReport {
	t.Helper()
	rep := w.stop(t)
	require.NoError(t, w.exitErr, "worker %s exit status", w.name)
	return rep
}

// pause stops the worker (SIGSTOP); resume continues it (SIGCONT).
func (w *worker) pause(t testing.TB)  { require.NoError(t, syscall.Kill(w.pid(), syscall.SIGSTOP)) }
func (w *worker) resume(t testing.TB) { require.NoError(t, syscall.Kill(w.pid(), syscall.SIGCONT)) }

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
