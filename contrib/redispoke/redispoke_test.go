package redispoke_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/contrib/redispoke"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// An insert on one process (a web node that runs no queue) is started by a worker in another
// process at once, though the worker polls only every 10 s.
func TestPokeReachesAnotherProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	addr := sharedRedis(t)
	startWorker(t, e, addr, 10*time.Second)
	web := e.client(t, gendurable.Config{Name: "web", Poke: redispoke.New(&redis.Options{Addr: addr})})
	start(t, web)

	time.Sleep(idleFor)
	latency := startLatency(t, e, insert(t, e, web))
	t.Logf("insert → start in the worker process: %v", latency)
	require.Less(t, latency, pokeBound)
}

// Lost pokes cost at most a poll interval: every instance still starts within it, whether the
// pokes are dropped or Redis is down.
func TestLostPokesCostAtMostAPoll(t *testing.T) {
	t.Parallel()
	const poll = 500 * time.Millisecond
	run := func(t *testing.T, e *env, web *gendurable.Client) {
		time.Sleep(2 * time.Second) // the worker's idle backoff reaches the poll interval
		var ids []int64
		for range 12 {
			ids = append(ids, insert(t, e, web))
			time.Sleep(97 * time.Millisecond)
		}
		slowest := time.Duration(0)
		for _, id := range ids {
			slowest = max(slowest, startLatency(t, e, id))
		}
		t.Logf("slowest start with every poke lost: %v (poll %v)", slowest, poll)
		require.Less(t, slowest, poll+150*time.Millisecond)
		eventually(t, 10*time.Second, "every instance done", func() bool {
			return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == len(ids)
		})
	}
	t.Run("dropped", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		opts := &redis.Options{Addr: sharedRedis(t)}
		worker := e.client(t, gendurable.Config{Name: "worker", Poke: redispoke.New(opts), PollInterval: poll,
			Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 4}}})
		start(t, worker)
		web := e.client(t, gendurable.Config{Name: "web", Poke: dropPokes{redispoke.New(opts)}})
		start(t, web)
		run(t, e, web)
	})
	t.Run("redis down", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		srv := ownRedis(t)
		opts := &redis.Options{Addr: srv.addr}
		worker := e.client(t, gendurable.Config{Name: "worker", Poke: redispoke.New(opts), PollInterval: poll,
			Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 4}}})
		start(t, worker)
		web := e.client(t, gendurable.Config{Name: "web", Poke: redispoke.New(opts)})
		start(t, web)
		srv.kill()
		run(t, e, web) // the clients stop with Redis still down
	})
}

// Redis restarts while instances are inserted continuously: nothing is lost, each client logs
// the loss once, and once the transport has subscribed again pokes work as before.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := ownRedis(t)
	opts := &redis.Options{Addr: srv.addr}
	logs := &logRecorder{}
	worker := e.client(t, gendurable.Config{Name: "worker", Poke: redispoke.New(opts), PollInterval: 10 * time.Second,
		Logger: slog.New(logs), Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 4}}})
	start(t, worker)
	web := e.client(t, gendurable.Config{Name: "web", Poke: redispoke.New(opts)})
	start(t, web)

	ctx, stopInserting := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	inserted := 0
	wg.Go(func() {
		for ctx.Err() == nil {
			_, err := web.Insert(context.Background(), effectJob(e.pool, e.schema).With(struct{}{}), nil)
			if err != nil {
				t.Errorf("insert: %v", err)
				return
			}
			inserted++
			time.Sleep(20 * time.Millisecond)
		}
	})
	time.Sleep(500 * time.Millisecond)
	srv.kill()
	eventually(t, 10*time.Second, "the worker to notice the lost subscription", func() bool {
		return logs.count(slog.LevelWarn, "lost the subscription") == 1
	})
	time.Sleep(time.Second)
	srv.start()
	restarted := time.Now()
	eventually(t, 10*time.Second, "the worker to subscribe again", func() bool {
		return logs.count(slog.LevelInfo, "subscribed to Redis again") == 1
	})
	t.Logf("subscribed again %v after the restart", time.Since(restarted).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	stopInserting()
	wg.Wait()

	eventually(t, 15*time.Second, "every inserted instance done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == inserted
	})
	require.Equal(t, inserted, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	require.Equal(t, inserted, e.count(t, `SELECT count(DISTINCT id) FROM {schema}.t_effects`))
	t.Logf("%d instances inserted across the restart, all done", inserted)

	time.Sleep(idleFor)
	require.Less(t, startLatency(t, e, insert(t, e, web)), pokeBound, "pokes after the restart")
	require.Equal(t, 1, logs.count(slog.LevelWarn, "lost the subscription"), "the loss is logged once")
}

// The transport wakes every queue of its client once it has subscribed again after losing
// Redis (pokes sent meanwhile were lost), and hears pokes again; pokes of another schema never
// reach it.
func TestResubscribeWakesEveryQueue(t *testing.T) {
	t.Parallel()
	srv := ownRedis(t)
	tr := redispoke.New(&redis.Options{Addr: srv.addr})
	logs := &logRecorder{}
	wakes := make(chan string, 16)
	ctx := context.Background()
	listener, err := tr.Open(ctx, gendurable.PokeNode{Client: "listener", Origin: "listener@test", Schema: "s1",
		Queues: []string{"a", "b"}, Wake: func(q string) { wakes <- q }, Logger: slog.New(logs)})
	require.NoError(t, err)
	defer func() { require.NoError(t, listener.Close()) }()
	other, err := tr.Open(ctx, gendurable.PokeNode{Client: "other", Origin: "other@test", Schema: "s2",
		Queues: []string{"a"}, Wake: func(string) {}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer func() { require.NoError(t, other.Close()) }()
	sender, err := tr.Open(ctx, gendurable.PokeNode{Client: "sender", Origin: "sender@test", Schema: "s1",
		Wake: func(string) {}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer func() { require.NoError(t, sender.Close()) }()

	other.Publish([]string{"a", "b"}) // schema s2: not the listener's channels
	sender.Publish([]string{"b"})
	require.Equal(t, "b", receive(t, wakes))

	srv.kill()
	eventually(t, 10*time.Second, "the lost subscription to be logged", func() bool {
		return logs.count(slog.LevelWarn, "lost the subscription") == 1
	})
	time.Sleep(time.Second) // several failed attempts to subscribe again
	srv.start()
	woken := []string{receive(t, wakes), receive(t, wakes)}
	require.ElementsMatch(t, []string{"a", "b"}, woken)
	require.Equal(t, 1, logs.count(slog.LevelWarn, "lost the subscription"), "the loss is logged once")
	require.Equal(t, 1, logs.count(slog.LevelInfo, "subscribed to Redis again"))

	sender.Publish([]string{"a"})
	require.Equal(t, "a", receive(t, wakes))
	select {
	case q := <-wakes:
		t.Fatalf("unexpected wake of %q", q)
	case <-time.After(200 * time.Millisecond):
	}
}

// A subscription whose connection goes silent without closing (a vanished peer, a dropped NAT
// entry) is noticed by an unanswered ping and replaced, and every queue is woken.
func TestSilentSubscriptionIsReplaced(t *testing.T) {
	t.Parallel()
	addr := sharedRedis(t)
	proxy := newSilencer(t, addr)
	logs := &logRecorder{}
	wakes := make(chan string, 16)
	ctx := context.Background()
	listener, err := redispoke.NewPinging(&redis.Options{Addr: proxy.addr}, 100*time.Millisecond).Open(ctx,
		gendurable.PokeNode{Client: "listener", Origin: "listener@test", Schema: "silent",
			Queues: []string{"a", "b"}, Wake: func(q string) { wakes <- q }, Logger: slog.New(logs)})
	require.NoError(t, err)
	defer func() { require.NoError(t, listener.Close()) }()
	sender, err := redispoke.New(&redis.Options{Addr: addr}).Open(ctx, gendurable.PokeNode{Client: "sender",
		Origin: "sender@test", Schema: "silent", Wake: func(string) {}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer func() { require.NoError(t, sender.Close()) }()

	time.Sleep(300 * time.Millisecond) // pinged and answered: a quiet subscription is kept
	require.Zero(t, logs.count(slog.LevelWarn, "lost the subscription"))
	sender.Publish([]string{"a"})
	require.Equal(t, "a", receive(t, wakes))

	proxy.silence()
	woken := []string{receive(t, wakes), receive(t, wakes)}
	require.ElementsMatch(t, []string{"a", "b"}, woken, "the wakes after subscribing again")
	require.Equal(t, []string{"no answer to a ping within 100ms"}, logs.errors("lost the subscription"))
	sender.Publish([]string{"b"})
	require.Equal(t, "b", receive(t, wakes))
}

func receive(t *testing.T, wakes <-chan string) string {
	t.Helper()
	select {
	case q := <-wakes:
		return q
	case <-time.After(10 * time.Second):
		t.Fatal("no wake within 10s")
		return ""
	}
}

// A client that both inserts and runs the queue is woken by its insert directly, never a second
// time by its own message: per insert, the transport wakes only the other client running the
// queue, once.
func TestOwnPokesDoNotWakeTheirSender(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	opts := &redis.Options{Addr: sharedRedis(t)}
	a := &wakeCounter{inner: redispoke.New(opts)}
	b := &wakeCounter{inner: redispoke.New(opts)}
	queues := map[string]gendurable.QueueConfig{"q": {Concurrency: 4}}
	ca := e.client(t, gendurable.Config{Name: "a", Poke: a, Queues: queues, PollInterval: 10 * time.Second})
	start(t, ca)
	cb := e.client(t, gendurable.Config{Name: "b", Poke: b, Queues: queues, PollInterval: 10 * time.Second})
	start(t, cb)

	// InsertMany: an Insert on a client that works the queue claims its row itself and pokes
	// nobody (there is nothing left to pick).
	insertMany := func(cl *gendurable.Client) {
		_, err := cl.InsertMany(context.Background(),
			[]gendurable.InsertManyParams{{Input: effectJob(e.pool, e.schema).With(struct{}{})}})
		require.NoError(t, err)
	}
	const n = 5
	for i := range n {
		insertMany(ca)
		eventually(t, 5*time.Second, "b to hear the poke", func() bool { return b.wakes.Load() == int64(i+1) })
	}
	time.Sleep(200 * time.Millisecond) // a message to a would have arrived by now
	require.Zero(t, a.wakes.Load(), "a was poked by its own inserts")
	require.EqualValues(t, n, b.wakes.Load())

	insertMany(cb)
	eventually(t, 5*time.Second, "a to hear b's poke", func() bool { return a.wakes.Load() == 1 })
	eventually(t, 10*time.Second, "every instance done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n+1
	})
}

// A Redis that cannot be reached fails Client.Start with an error naming its address, and
// leaves no goroutine behind. (Not parallel: it checks the goroutines of the whole process.)
func TestUnreachableRedisFailsStart(t *testing.T) {
	known := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, known) })
	e := newEnv(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t))) // nothing listens there
	tr := redispoke.New(&redis.Options{Addr: addr})
	for _, queues := range []map[string]gendurable.QueueConfig{{"q": {}}, nil} {
		cl := e.client(t, gendurable.Config{Name: "unreachable", Poke: tr, Queues: queues})
		began := time.Now()
		err := cl.Start(context.Background())
		require.Error(t, err)
		require.ErrorContains(t, err, "redispoke: connect to Redis at "+addr+": ")
		t.Logf("Start failed after %v: %v", time.Since(began).Round(time.Millisecond), err)
		require.NoError(t, cl.Stop(context.Background()))
	}
}
