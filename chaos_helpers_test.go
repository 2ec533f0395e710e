package gendurable_test

// Shared pieces of the infrastructure-fault tests (Postgres restarts, session kills, network
// faults, PgBouncer, bloat): seeds and sizes, the effect-logging linear5 machine, and the chaos
// worker process (the test binary re-executed with GD_HELPER=chaos).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
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
	"github.com/gendurable/gendurable/internal/oracle"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// linear5Path is the path every finished chaos instance must have (I5).
var linear5Path = []string{"s0", "s1", "s2", "s3", "s4"}

// chaosMachine is linear5 for fault tests: each step records its external effect on fx (a pool
// of its own, in autocommit, retried until it lands, so a step never moves on without its
// effect), then sleeps U(0, maxDelay) (a function of the seed and the step's coordinates), then
// moves on. A failed try is retried at once and often: faults, not the machine, are under test.
func chaosMachine(fx *pgxpool.Pool, schema string, pid int, seed uint64, maxDelay time.Duration) gendurable.FSM[path] {
	insert := expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, schema)
	steps := map[string]gendurable.StepFunc[path]{}
	for i, s := range linear5Path {
		steps[s] = func(ctx *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			if fx != nil {
				for {
					_, err := fx.Exec(ctx, insert, ctx.ID, ctx.Step, ctx.Attempt, pid)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return gendurable.Outcome{}, fmt.Errorf("effect of %d/%s: %w", ctx.ID, ctx.Step, err)
					}
					select {
					case <-time.After(50 * time.Millisecond):
					case <-ctx.Done():
					}
				}
			}
			if maxDelay > 0 {
				h := fnv.New64a()
				fmt.Fprintf(h, "%d/%d/%s/%d", seed, ctx.ID, ctx.Step, ctx.Attempt)
				select {
				case <-time.After(time.Duration(h.Sum64() % uint64(maxDelay))):
				case <-ctx.Done():
					return gendurable.Outcome{}, context.Cause(ctx)
				}
			}
			p.I++
			p.Path = append(p.Path, s)
			if i == len(linear5Path)-1 {
				return gendurable.Done(p), nil
			}
			return gendurable.Next(linear5Path[i+1], p), nil
		}
	}
	return gendurable.FSM[path]{Name: "linear5", Start: "s0", Steps: steps, Queue: "chaos",
		MaxAttempts: 1000, Backoff: func(int) time.Duration { return 20 * time.Millisecond }}
}

// poolConfig parses url into a pool config with an application name (for finding the pool's
// backends), at most maxConns connections and the exec mode ("" keeps pgx's default).
func poolConfig(url, app string, maxConns int32, mode string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
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

// chaosStats is what a chaos worker counted, printed as its last line when it stops.
type chaosStats struct {
	Stale         int `json:"stale"`          // outcome.stale
	CommitFailed  int `json:"commit_failed"`  // failed commit tries
	Unknown       int `json:"unknown"`        // failed tries whose outcome is unknown (not SafeToRetry)
	HeartbeatLost int `json:"heartbeat_lost"` // heartbeat.lost
	Steps         int `json:"steps"`          // step.finished
	Errors22P02   int `json:"errors_22p02"`   // invalid_text_representation seen in any event or log
	Prepared      int `json:"prepared"`       // "prepared statement" errors seen in any event or log
	// Ticks (GD_TICKS=1) holds, for each of the client's loops, when it reported doing its work
	// (unix milliseconds, at most one per 50ms): scheduler.picked, heartbeat.beat, reaper.swept,
	// gc.swept.
	Ticks map[string][]int64 `json:"ticks,omitempty"`
}

// tickLog records the ticks of a worker's loops (see chaosStats.Ticks).
type tickLog struct {
	mu    sync.Mutex
	ticks map[string][]int64
}

func (l *tickLog) add(name string) {
	now := time.Now().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	if ts := l.ticks[name]; len(ts) == 0 || now-ts[len(ts)-1] >= 50 {
		l.ticks[name] = append(ts, now)
	}
}

// firstTickAfter returns, for each loop, how long after t its first tick came (absent: none).
func (st chaosStats) firstTickAfter(t time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, ts := range st.Ticks {
		for _, ms := range ts {
			if at := time.UnixMilli(ms); !at.Before(t) {
				out[name] = at.Sub(t)
				break
			}
		}
	}
	return out
}

// chaosWorkerMain runs a chaos worker process: a client working queue "chaos" with chaosMachine,
// configured from the environment (see startChaosWorker). It prints "ready" once started; on
// SIGTERM it stops, prints "stats <json>" and exits.
func chaosWorkerMain() int {
	env := func(k string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
			return v
		}
		return def
	}
	ms := func(k string, def int) time.Duration { return time.Duration(env(k, def)) * time.Millisecond }
	ctx := context.Background()
	pid := os.Getpid()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "chaos worker:", err); return 2 }
	cfg, err := poolConfig(os.Getenv("GD_URL"), os.Getenv("GD_APP"), int32(env("GD_CONNS", 12)), os.Getenv("GD_EXEC_MODE"))
	if err != nil {
		return fail(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	fxCfg, err := poolConfig(os.Getenv("GD_FX_URL"), fmt.Sprintf("fx-%d", pid), int32(env("GD_FX_CONNS", 4)), "")
	if err != nil {
		return fail(err)
	}
	fx, err := pgxpool.NewWithConfig(ctx, fxCfg)
	if err != nil {
		return fail(err)
	}
	defer fx.Close()
	seed, _ := strconv.ParseUint(os.Getenv("GD_SEED"), 10, 64)
	schema := os.Getenv("GD_SCHEMA")

	var stale, commitFailed, unknown, lost, steps, bad22, prepared atomic.Int64
	scan := func(err error) {
		if err == nil {
			return
		}
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "22P02" {
			bad22.Add(1)
		}
		if strings.Contains(err.Error(), "prepared statement") {
			prepared.Add(1)
		}
	}
	var ticks *tickLog
	if os.Getenv("GD_TICKS") != "" {
		ticks = &tickLog{ticks: map[string][]int64{}}
	}
	hook := func(ev gendurable.Event) {
		scan(ev.Err)
		if ticks != nil {
			switch ev.Name {
			case gendurable.EventSchedulerPicked, gendurable.EventHeartbeatBeat, gendurable.EventReaperSwept,
				gendurable.EventGCSwept:
				ticks.add(string(ev.Name))
			}
		}
		switch ev.Name {
		case gendurable.EventOutcomeStale:
			stale.Add(1)
		case gendurable.EventCommitFailed:
			if ev.InstanceID == 0 { // a failed try of the committer (not its final give-up)
				commitFailed.Add(1)
				if !pgconn.SafeToRetry(ev.Err) {
					unknown.Add(1)
				}
			}
		case gendurable.EventHeartbeatLost:
			lost.Add(1)
		case gendurable.EventStepFinished:
			steps.Add(1)
		}
	}
	logs := &scanHandler{scan: func(s string) {
		if strings.Contains(s, "22P02") {
			bad22.Add(1)
		}
		if strings.Contains(s, "prepared statement") {
			prepared.Add(1)
		}
	}, next: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})}
	if os.Getenv("GD_QUIET") != "" {
		logs.next = nil
	}
	lease := ms("GD_LEASE_MS", 2000)
	queues := map[string]gendurable.QueueConfig{"chaos": {Concurrency: env("GD_CONC", 8)}}
	// GD_PROBES queues p0, p1, … of one slot each: a probe insert goes to a queue of its own, so
	// that only a poke, never a poll of a busy queue, can start it fast.
	for i := range env("GD_PROBES", 0) {
		queues[fmt.Sprint("p", i)] = gendurable.QueueConfig{Concurrency: 1}
	}
	c := &gendurable.Config{
		Name:         os.Getenv("GD_NAME"),
		Schema:       schema,
		Machines:     []gendurable.Machine{chaosMachine(fx, schema, pid, seed, ms("GD_STEP_MS", 10))},
		Queues:       queues,
		Lease:        lease,
		Heartbeat:    ms("GD_HEARTBEAT_MS", int(lease.Milliseconds()/5)),
		PollInterval: ms("GD_POLL_MS", 200),
		Reaper:       &gendurable.ReaperConfig{Interval: ms("GD_REAPER_MS", 250), Disabled: env("GD_REAPER_MS", 250) == 0},
		// GD_GC_MS sweeps (0: GC off) that delete nothing the oracle reads: a day's retention.
		GC: &gendurable.GCConfig{Disabled: env("GD_GC_MS", 0) == 0, Interval: ms("GD_GC_MS", 0),
			Retention: 24 * time.Hour},
		Hooks:  []func(gendurable.Event){hook},
		Logger: slog.New(logs),
	}
	if os.Getenv("GD_POKE") == "postgres" {
		c.Poke = gendurable.PokePostgres()
	}
	cl, err := gendurable.NewClient(pool, c)
	if err != nil {
		return fail(err)
	}
	if err := cl.Start(ctx); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	code := 0
	if err := cl.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker: stop:", err)
		code = 1
	}
	st := chaosStats{Stale: int(stale.Load()), CommitFailed: int(commitFailed.Load()),
		Unknown: int(unknown.Load()), HeartbeatLost: int(lost.Load()), Steps: int(steps.Load()),
		Errors22P02: int(bad22.Load()), Prepared: int(prepared.Load())}
	if ticks != nil {
		st.Ticks = ticks.ticks
	}
	b, _ := json.Marshal(st)
	fmt.Println("stats " + string(b))
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

// chaosWorker is a chaos worker process.
type chaosWorker struct {
	cmd   *exec.Cmd
	name  string
	out   *bufio.Reader
	stats chan chaosStats
	once  sync.Once
}

// startChaosWorker starts a chaos worker named name on the engine URL url (its effects go to
// fxURL), in schema, with extra environment (GD_LEASE_MS, GD_CONC, …), and waits until it is
// ready. The test's cleanup kills it if it still runs.
func startChaosWorker(t *testing.T, url, fxURL, schema, name string, extra ...string) *chaosWorker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GD_HELPER=chaos", "GD_URL="+url, "GD_FX_URL="+fxURL, "GD_SCHEMA="+schema,
		"GD_NAME="+name)
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	w := &chaosWorker{cmd: cmd, name: name, out: bufio.NewReader(out), stats: make(chan chaosStats, 1)}
	t.Cleanup(w.kill)
	line, err := w.out.ReadString('\n')
	require.NoError(t, err, "chaos worker %s did not start", name)
	require.Equal(t, "ready\n", line)
	go func() {
		for {
			line, err := w.out.ReadString('\n')
			if s, ok := strings.CutPrefix(line, "stats "); ok {
				var st chaosStats
				if json.Unmarshal([]byte(s), &st) == nil {
					w.stats <- st
				}
			}
			if err != nil {
				_, _ = io.Copy(io.Discard, w.out)
				return
			}
		}
	}()
	return w
}

// stop ends the worker with SIGTERM (a drain) and returns what it counted.
func (w *chaosWorker) stop(t *testing.T) chaosStats {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case st := <-w.stats:
		w.once.Do(func() { _ = w.cmd.Wait() })
		return st
	case <-time.After(30 * time.Second):
		t.Fatalf("chaos worker %s did not stop within 30s", w.name)
		return chaosStats{}
	}
}

func (w *chaosWorker) kill() {
	w.once.Do(func() {
		if w.cmd.ProcessState == nil {
			_ = w.cmd.Process.Signal(syscall.SIGKILL)
		}
		_ = w.cmd.Wait()
	})
}

// sum adds up stats.
func sum(all ...chaosStats) chaosStats {
	var s chaosStats
	for _, x := range all {
		s.Stale += x.Stale
		s.CommitFailed += x.CommitFailed
		s.Unknown += x.Unknown
		s.HeartbeatLost += x.HeartbeatLost
		s.Steps += x.Steps
		s.Errors22P02 += x.Errors22P02
		s.Prepared += x.Prepared
	}
	return s
}

// chaosDB is a chaos test's database: a pool (direct, for the test's own reads and inserts) and
// a migrated schema with the oracle installed.
type chaosDB struct {
	url    string
	pool   *pgxpool.Pool
	schema string
	before int64 // the deadlock count at the start
}

// newChaosDB makes a schema on the Postgres at url (through pool, made by the caller) and
// installs the oracle in it.
func newChaosDB(t *testing.T, url string, pool *pgxpool.Pool, schema string) *chaosDB {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, oracle.Install(ctx, pool, schema))
	before, err := oracle.Deadlocks(ctx, pool)
	require.NoError(t, err)
	return &chaosDB{url: url, pool: pool, schema: schema, before: before}
}

func (d *chaosDB) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, d.pool.QueryRow(context.Background(), expand(query, d.schema), args...).Scan(&n))
	return n
}

// insert inserts n chaosMachine instances through a client of its own, priority prio (0: 5).
func (d *chaosDB) insert(t *testing.T, n, prio int) []int64 {
	t.Helper()
	cl, err := gendurable.NewClient(d.pool, &gendurable.Config{Schema: d.schema})
	require.NoError(t, err)
	m := chaosMachine(nil, d.schema, 0, 0, 0)
	ids := make([]int64, 0, n)
	for done := 0; done < n; {
		batch := min(n-done, 5000)
		params := make([]gendurable.InsertManyParams, batch)
		for i := range params {
			params[i] = gendurable.InsertManyParams{Input: m.With(path{}), Opts: &gendurable.InsertOpts{Priority: prio}}
		}
		res, err := cl.InsertMany(context.Background(), params)
		require.NoError(t, err)
		for _, r := range res {
			ids = append(ids, r.ID)
		}
		done += batch
	}
	return ids
}

// done counts finished instances.
func (d *chaosDB) done(t *testing.T) int {
	return d.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`)
}

// waitDone waits until n instances are done, failing the test after timeout.
func (d *chaosDB) waitDone(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%d instances done", n), func() bool {
		// The test's own connections may have been cut by the fault: an error is "not yet".
		var k int
		err := d.pool.QueryRow(context.Background(), expand(`SELECT count(*) FROM {schema}.instances WHERE status = 'done'`,
			d.schema)).Scan(&k)
		return err == nil && k >= n
	})
}

// check runs the oracle (I1–I8 as the test asks) and fails the test on any violation; it
// returns the number of violations and of duplicate terminal transitions for the report.
func (d *chaosDB) check(t *testing.T, n int) (violations, dupTerminal int) {
	t.Helper()
	ctx := context.Background()
	v, err := oracle.Check(ctx, d.pool, d.schema, oracle.Opts{N: n, Effects: true, Counter: true, Path: linear5Path,
		DeadlocksBefore: d.before})
	require.NoError(t, err)
	dupTerminal = d.count(t, `SELECT coalesce(sum(k - 1), 0) FROM (SELECT count(*) AS k FROM {schema}.t_outcome_log
		WHERE new_status = 'done' AND old_status IS DISTINCT FROM new_status GROUP BY id) c`)
	require.Empty(t, v, "oracle violations")
	return len(v), dupTerminal
}

// deadlocks is the deadlock count's delta since the start.
func (d *chaosDB) deadlocks(t *testing.T) int {
	n, err := oracle.Deadlocks(context.Background(), d.pool)
	require.NoError(t, err)
	return int(n - d.before)
}
