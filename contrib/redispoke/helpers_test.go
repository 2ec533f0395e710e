package redispoke_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/logrecord"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// idleFor is how long a queue must sit idle before a test relies on its pokes: by then its idle
// backoff has grown past 2.5 s (10 ms doubling per empty poll), so a start within pokeBound
// cannot be a poll's doing.
const (
	idleFor   = 3 * time.Second
	pokeBound = 100 * time.Millisecond
)

// env is one test's database: a pool and a migrated schema of its own, with the effects table
// the effect job writes to.
type env struct {
	pool   *pgxpool.Pool
	schema string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := durabledbtest.Pool(t, 16)
	e := &env{pool: pool, schema: durabledbtest.Schema(t, pool)}
	e.exec(t, `CREATE TABLE {schema}.t_effects (id bigint, at timestamptz DEFAULT clock_timestamp())`)
	return e
}

// client builds a client in the env's schema running the effect job.
func (e *env) client(t *testing.T, cfg gendurable.Config) *gendurable.Client {
	t.Helper()
	cfg.Schema = e.schema
	cfg.Machines = []gendurable.Machine{effectJob(e.pool, e.schema)}
	cl, err := gendurable.NewClient(e.pool, &cfg)
	require.NoError(t, err)
	return cl
}

// start starts a client and stops it when the test ends.
func start(t *testing.T, cl *gendurable.Client) {
	t.Helper()
	require.NoError(t, cl.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, cl.Stop(ctx))
	})
}

func (e *env) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), e.expand(query), args...).Scan(&n))
	return n
}

func (e *env) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), e.expand(query), args...)
	require.NoError(t, err)
}

func (e *env) expand(query string) string {
	return strings.ReplaceAll(query, "{schema}", `"`+e.schema+`"`)
}

// effectJob records in t_effects, by the database clock, when each of its runs starts.
func effectJob(pool *pgxpool.Pool, schema string) gendurable.Job[struct{}] {
	insert := `INSERT INTO "` + schema + `".t_effects (id) VALUES ($1)`
	return gendurable.Job[struct{}]{Name: "effect", Queue: "q", Perform: func(ctx *gendurable.Ctx, _ struct{}) error {
		if _, err := pool.Exec(ctx, insert, ctx.ID); err != nil {
			return fmt.Errorf("record the effect: %w", err)
		}
		return nil
	}}
}

// insert inserts one effect job in queue "q" through cl.
func insert(t *testing.T, e *env, cl *gendurable.Client) int64 {
	t.Helper()
	res, err := cl.Insert(context.Background(), effectJob(e.pool, e.schema).With(struct{}{}), nil)
	require.NoError(t, err)
	return res.ID
}

// startLatency is, by the database clock, how long after its insert instance id started.
func startLatency(t *testing.T, e *env, id int64) time.Duration {
	t.Helper()
	eventually(t, 15*time.Second, "the job to start", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1`, id) > 0
	})
	var ms float64
	require.NoError(t, e.pool.QueryRow(context.Background(), e.expand(`
		SELECT extract(epoch FROM min(f.at) - i.inserted_at) * 1000
		FROM {schema}.t_effects f JOIN {schema}.instances i USING (id) WHERE id = $1 GROUP BY i.inserted_at`),
		id).Scan(&ms))
	return time.Duration(ms * float64(time.Millisecond))
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sharedRedis is the address of the machine's Redis at 127.0.0.1:6379, or, where none answers
// there, of a redis-server this test starts. The tests leave nothing in it: pub/sub stores no
// keys, and every test's channels carry its own schema.
func sharedRedis(t *testing.T) string {
	t.Helper()
	const addr = "127.0.0.1:6379"
	if ping(addr) == nil {
		return addr
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		skipOrFail(t, "redispoke: no Redis for the tests: 127.0.0.1:6379 does not answer and redis-server is not installed")
	}
	return ownRedis(t).addr
}

func ping(addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// redisServer is a redis-server of one test's own, on a free port, which the test may kill and
// start again.
type redisServer struct {
	t    *testing.T
	port int
	addr string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// ownRedis starts a redis-server on a free port (persisting nothing) and kills it when the test
// ends; the test is skipped where redis-server is not installed.
func ownRedis(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		skipOrFail(t, "redispoke: this test restarts a Redis of its own and needs redis-server on the PATH")
	}
	port := freePort(t)
	r := &redisServer{t: t, port: port, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	r.start()
	t.Cleanup(r.kill)
	return r
}

// freePort is a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// start starts the server and waits until it answers.
func (r *redisServer) start() {
	r.t.Helper()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--loglevel", "warning")
	require.NoError(r.t, cmd.Start())
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	eventually(r.t, 10*time.Second, "redis-server to answer on "+r.addr, func() bool { return ping(r.addr) == nil })
}

// kill kills the server, as a crash would, and waits until it is gone.
func (r *redisServer) kill() {
	r.mu.Lock()
	cmd := r.cmd
	r.cmd = nil
	r.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// logRecorder keeps the records logged through it (a logrecord.Recorder), with the lookups these
// tests make.
type logRecorder struct{ logrecord.Recorder }

// count is how many records at level whose message contains text were logged.
func (l *logRecorder) count(level slog.Level, text string) int {
	n := 0
	for _, r := range l.Records() {
		if r.Level == level && strings.Contains(r.Message, text) {
			n++
		}
	}
	return n
}

// errors are the "error" attributes of the records whose message contains text.
func (l *logRecorder) errors(text string) []string {
	var out []string
	for _, r := range l.Records() {
		if strings.Contains(r.Message, text) {
			if v := logrecord.Attr(r, "error"); v.Kind() != slog.KindAny || v.Any() != nil {
				out = append(out, v.String())
			}
		}
	}
	return out
}

// wakeCounter is a transport that counts the wakes its inner transport delivers to a client
// (the client's own inserts wake it directly, not through the transport).
type wakeCounter struct {
	inner gendurable.PokeTransport
	wakes atomic.Int64
}

func (w *wakeCounter) Open(ctx context.Context, n gendurable.PokeNode) (gendurable.PokeConn, error) {
	wake := n.Wake
	n.Wake = func(q string) {
		w.wakes.Add(1)
		wake(q)
	}
	return w.inner.Open(ctx, n)
}

// dropPokes is a transport whose publishes are all lost (its listening side works).
type dropPokes struct{ inner gendurable.PokeTransport }

func (d dropPokes) Open(ctx context.Context, n gendurable.PokeNode) (gendurable.PokeConn, error) {
	c, err := d.inner.Open(ctx, n)
	if err != nil {
		return nil, err
	}
	return dropConn{c}, nil
}

type dropConn struct{ gendurable.PokeConn }

func (dropConn) Publish([]string) {}

// silencer is a TCP proxy to a Redis whose connections can be made to go silent, as a
// connection does when a peer vanishes without closing it (a half-open connection): what is sent
// on them is swallowed, and nothing is answered. Connections opened afterwards work.
type silencer struct {
	addr string
	l    net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]*atomic.Bool // client side → silenced
	closed bool
	wg     sync.WaitGroup
}

func newSilencer(t *testing.T, target string) *silencer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &silencer{addr: l.Addr().String(), l: l, conns: map[net.Conn]*atomic.Bool{}}
	s.wg.Go(func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			silenced := &atomic.Bool{}
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				_ = client.Close()
				_ = server.Close()
				return
			}
			s.conns[client] = silenced
			s.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						break
					}
					if !silenced.Load() {
						if _, err := dst.Write(buf[:n]); err != nil {
							break
						}
					}
				}
				_ = client.Close()
				_ = server.Close()
			}
			s.wg.Go(func() { pipe(server, client) })
			s.wg.Go(func() { pipe(client, server) })
		}
	})
	t.Cleanup(s.close)
	return s
}

// silence makes every connection open now go silent.
func (s *silencer) silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, silenced := range s.conns {
		silenced.Store(true)
	}
}

func (s *silencer) close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	_ = s.l.Close()
	s.wg.Wait()
}

// skipOrFail skips a test whose service is missing, except under CI=true, where a missing
// service is a failure of the run (.ci/run installs and starts Redis).
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why + " (CI=true: .ci/run must provide it)")
	}
	t.Skip(why)
}
