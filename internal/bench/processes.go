package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Worker processes (Options.Processes): jobs and chain worked by processes of their own, each a
// client on a pool of its own, like that many nodes. A worker announces itself with "ready" on
// its standard output once its client has started, and stops when its standard input closes.

// processRun is what one run of worker processes measured.
type processRun struct {
	work  time.Duration // from the first worker's start to the last instance's end
	dbMS  float64       // the database's statement time over the run
	xacts int64         // the database's committed and rolled back transactions over the run
}

// workProcesses starts Options.Processes workers for scenario, waits until finished instances
// are done (read from the finished counts: a bounded read, every 2 ms), stops the workers and
// reads the database's statistics for the run. The workers' connections close when they exit,
// which makes their backends report their statistics.
func (r *runner) workProcesses(ctx context.Context, scenario string, finished int64) (processRun, error) {
	var pr processRun
	before, err := dbStats(ctx, r.pool)
	if err != nil {
		return pr, err
	}
	t0 := time.Now()
	procs := make([]*cmdHandle, 0, r.opts.Processes)
	defer func() {
		for _, p := range procs {
			_ = p.stop()
		}
	}()
	for range r.opts.Processes {
		h, err := startWorker(r.opts.Worker(scenario))
		if err != nil {
			return pr, err
		}
		procs = append(procs, h)
	}
	for _, p := range procs {
		if err := p.waitReady(30 * time.Second); err != nil {
			return pr, err
		}
	}
	q := fmt.Sprintf(`SELECT coalesce(sum(n), 0) FROM %q.finished_counts WHERE status = 'done'`, r.opts.Schema)
	err = waitFor(ctx, 10*time.Minute, "all instances done", func() bool {
		var n int64
		if err := r.pool.QueryRow(ctx, q).Scan(&n); err != nil {
			return false
		}
		return n >= finished
	})
	pr.work = time.Since(t0)
	if err != nil {
		return pr, err
	}
	for _, p := range procs {
		if err := p.stop(); err != nil {
			return pr, err
		}
	}
	procs = nil
	// A backend reports its statistics when it exits; give the server a moment to take them in.
	time.Sleep(time.Second)
	after, err := dbStats(ctx, r.pool)
	if err != nil {
		return pr, err
	}
	pr.dbMS, pr.xacts = after.activeMS-before.activeMS, after.xacts-before.xacts
	return pr, nil
}

type stats struct {
	activeMS float64
	xacts    int64
}

// dbStats reads the current database's statement time and transaction count
// (pg_stat_database; active_time needs Postgres 14).
func dbStats(ctx context.Context, pool *pgxpool.Pool) (stats, error) {
	var s stats
	err := pool.QueryRow(ctx, `SELECT coalesce(active_time, 0), xact_commit + xact_rollback
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.activeMS, &s.xacts)
	return s, err
}

// per is v per job, to four decimals.
func per(v float64, n int) *float64 {
	if n == 0 {
		return nil
	}
	x := float64(int64(v/float64(n)*10000+0.5)) / 10000
	return &x
}

// cmdHandle is a running worker process.
type cmdHandle struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	ready   chan error
	stopped bool
}

// startWorker starts cmd and watches its standard output for "ready".
func startWorker(cmd *exec.Cmd) (*cmdHandle, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a worker process: %w", err)
	}
	h := &cmdHandle{cmd: cmd, stdin: stdin, ready: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				h.ready <- nil
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		h.ready <- errors.New("a worker process ended before it was ready")
	}()
	return h, nil
}

func (h *cmdHandle) waitReady(timeout time.Duration) error {
	select {
	case err := <-h.ready:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("a worker process was not ready within %v", timeout)
	}
}

// stop closes the worker's standard input (it stops its client and exits) and waits for it.
func (h *cmdHandle) stop() error {
	if h.stopped {
		return nil
	}
	h.stopped = true
	_ = h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		return fmt.Errorf("worker process: %w", err)
	}
	return nil
}

// Work runs one worker process for scenario (jobs or chain): a client on pool working the
// scenario's queue with concurrency executors. It writes "ready" to out once the client has
// started, and stops the client when in reaches its end (the parent closed it, or died).
func Work(ctx context.Context, pool *pgxpool.Pool, schema, scenario string, concurrency int, logger *slog.Logger,
	in io.Reader, out io.Writer) error {
	var m gendurable.Machine
	switch scenario {
	case "jobs":
		m = noopJob()
	case "chain":
		m = chainFSM()
	default:
		return fmt.Errorf("worker processes run jobs or chain, not %q", scenario)
	}
	host, _ := os.Hostname()
	cl, err := gendurable.NewClient(pool, &gendurable.Config{
		Name:   fmt.Sprintf("bench-%s-%d", strings.SplitN(host, ".", 2)[0], os.Getpid()),
		Schema: schema, Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"bench": {Concurrency: concurrency}},
		Logger: logger,
	})
	if err != nil {
		return err
	}
	if err := cl.Start(ctx); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		_ = stop(cl)
		return err
	}
	_, _ = io.Copy(io.Discard, bufio.NewReader(in))
	return stop(cl)
}
