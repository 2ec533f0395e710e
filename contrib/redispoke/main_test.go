package redispoke_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/contrib/redispoke"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv("GD_HELPER") == "worker" {
		// The test binary re-executed as a worker process of another node.
		os.Exit(workerMain())
	}
	durabledbtest.Main(m)
}

// workerMain runs a worker process: a client working queue "q" with the effect job and the
// Redis transport, configured from the environment. It prints "ready" once started, and drains
// and exits when its stdin closes (the test ended, or the test process died).
func workerMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("GD_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	defer pool.Close()
	pollMS, err := strconv.Atoi(os.Getenv("GD_POLL_MS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: GD_POLL_MS:", err)
		return 2
	}
	schema := os.Getenv("GD_SCHEMA")
	cl, err := gendurable.NewClient(pool, &gendurable.Config{
		Name:         "worker",
		Schema:       schema,
		Machines:     []gendurable.Machine{effectJob(pool, schema)},
		Queues:       map[string]gendurable.QueueConfig{"q": {Concurrency: 4}},
		PollInterval: time.Duration(pollMS) * time.Millisecond,
		Poke:         redispoke.New(&redis.Options{Addr: os.Getenv("GD_REDIS")}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	if err := cl.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := cl.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// startWorker starts a worker process on the env's schema, poking through the Redis at addr and
// polling every poll, and stops it when the test ends.
func startWorker(t *testing.T, e *env, addr string, poll time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GD_HELPER=worker", "GD_URL="+e.pool.Config().ConnString(),
		"GD_SCHEMA="+e.schema, "GD_REDIS="+addr, "GD_POLL_MS="+strconv.Itoa(int(poll.Milliseconds())))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	ready := make(chan string, 1)
	exited := make(chan error, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		ready <- line
		_, _ = io.Copy(io.Discard, r)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case err := <-exited:
			require.NoError(t, err, "the worker did not stop cleanly")
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("the worker did not stop within 10s")
		}
	})
	select {
	case line := <-ready:
		require.Equal(t, "ready\n", line, "the worker did not start")
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not start within 30s")
	}
}
