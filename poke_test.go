package gendurable_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// idleFor is how long a queue must sit idle before a test relies on its pokes: by then its idle
// backoff has grown past 2.5 s (10 ms doubling per empty poll), so a start within pokeBound
// cannot be a poll's doing.
const (
	idleFor   = 3 * time.Second
	pokeBound = 100 * time.Millisecond
)

// poked waits for the queues to idle (their next poll seconds away), runs try, and requires its
// latency within bound. A try that misses by less than bound (a loaded machine) is run again, up
// to three times; a miss by more fails at once: that is a poll's doing, not a poke's.
func poked(t *testing.T, what string, bound time.Duration, try func() time.Duration) {
	t.Helper()
	var seen []time.Duration
	for range 3 {
		time.Sleep(idleFor)
		d := try()
		if d < bound {
			return
		}
		seen = append(seen, d)
		if d >= 2*bound {
			break
		}
	}
	t.Fatalf("%s: not started within %v after an insert (tries: %v)", what, bound, seen)
}

// startLatency is, by the database clock, how long after its insert instance id's first step
// started (the effect machine records each step).
func startLatency(t *testing.T, e *env, id int64) time.Duration {
	t.Helper()
	var ms float64
	eventually(t, 5*time.Second, "the first step", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1`, id) > 0
	})
	require.NoError(t, e.pool.QueryRow(context.Background(), expand(`
		SELECT extract(epoch FROM min(f.at) - i.inserted_at) * 1000
		FROM {schema}.t_effects f JOIN {schema}.instances i USING (id) WHERE id = $1 GROUP BY i.inserted_at`, e.schema),
		id).Scan(&ms))
	return time.Duration(ms * float64(time.Millisecond))
}

func createEffects(t *testing.T, e *env) {
	e.exec(t, `CREATE TABLE {schema}.t_effects (id bigint, step text, attempt int, pid int, at timestamptz DEFAULT clock_timestamp())`)
}

// effectMachine is linear5 whose every step first records an external effect in t_effects
// (autocommit, on the pool, outside the outcome's transaction) and then sleeps.
func effectMachine(pool *pgxpool.Pool, schema string, pid int, delay time.Duration) gendurable.FSM[path] {
	return linear("linear5", delay, func(ctx *gendurable.Ctx) {
		_, err := pool.Exec(ctx, expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, schema),
			ctx.ID, ctx.Step, ctx.Attempt, pid)
		if err != nil && ctx.Err() == nil {
			panic(err)
		}
	})
}

func insertEffect(t *testing.T, cl *gendurable.Client) int64 {
	t.Helper()
	res, err := cl.Insert(context.Background(), linear("linear5", 0, nil).With(path{}), &gendurable.InsertOpts{Queue: "crash"})
	require.NoError(t, err)
	return res.ID
}

// With the default local transport, an insert on the client that runs the queue starts at once,
// though the queue polls only every 10 s.
func TestPokeLocalStartsAnInsertAtOnce(t *testing.T) {
	e := newEnv(t)
	createEffects(t, e)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{effectMachine(e.pool, e.schema, os.Getpid(), 0)},
		Queues: map[string]gendurable.QueueConfig{"crash": {Concurrency: 4}}, PollInterval: 10 * time.Second})
	start(t, cl)
	poked(t, "Insert", pokeBound, func() time.Duration { return startLatency(t, e, insertEffect(t, cl)) })
}

// hop is a moment of a fan-out round trip, recorded by the steps in t_hops.
func hopMachines(e *env) (gendurable.FSM[struct{}], gendurable.Job[struct{}]) {
	record := func(ctx *gendurable.Ctx, what string) {
		_, err := e.pool.Exec(ctx, expand(`INSERT INTO {schema}.t_hops (id, what) VALUES ($1, $2)`, e.schema), ctx.ID, what)
		if err != nil {
			panic(err)
		}
	}
	spoke := gendurable.Job[struct{}]{Name: "spoke", Queue: "spokes", Perform: func(ctx *gendurable.Ctx, _ struct{}) error {
		record(ctx, "child")
		time.Sleep(400 * time.Millisecond) // long enough that the parent's queue backs off
		return nil
	}}
	hub := gendurable.FSM[struct{}]{Name: "hub", Start: "fan", Queue: "hubs", Steps: map[string]gendurable.StepFunc[struct{}]{
		"fan": func(ctx *gendurable.Ctx, s struct{}) (gendurable.Outcome, error) {
			record(ctx, "parent")
			return gendurable.Spawn([]gendurable.Child{{Input: spoke.With(s)}, {Input: spoke.With(s)}, {Input: spoke.With(s)}},
				"join", s), nil
		},
		"join": func(ctx *gendurable.Ctx, s struct{}) (gendurable.Outcome, error) {
			record(ctx, "join")
			return gendurable.Done(s), nil
		},
	}}
	return hub, spoke
}

// A cross-queue fan-out round trip (parent → children in another queue → join) needs no poll at
// any hop: every hop starts within pokeBound though the queues poll every 10 s.
func TestFanOutRoundTripWithoutPolling(t *testing.T) {
	for _, transport := range []string{"local", "postgres"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.exec(t, `CREATE TABLE {schema}.t_hops (id bigint, what text, at timestamptz DEFAULT clock_timestamp())`)
			hub, spoke := hopMachines(e)
			machines := []gendurable.Machine{hub, spoke}
			slow := 10 * time.Second
			var web *gendurable.Client
			if transport == "local" {
				web = e.client(t, &gendurable.Config{Machines: machines, PollInterval: slow,
					Queues: map[string]gendurable.QueueConfig{"hubs": {}, "spokes": {}}})
				start(t, web)
			} else {
				pg := gendurable.PokePostgres()
				hubs := e.client(t, &gendurable.Config{Name: "hubs", Machines: machines, PollInterval: slow, Poke: pg,
					Queues: map[string]gendurable.QueueConfig{"hubs": {}}})
				spokes := e.client(t, &gendurable.Config{Name: "spokes", Machines: machines, PollInterval: slow, Poke: pg,
					Queues: map[string]gendurable.QueueConfig{"spokes": {}}})
				web = e.client(t, &gendurable.Config{Name: "web", Machines: machines, Poke: pg})
				start(t, hubs)
				start(t, spokes)
				start(t, web)
			}
			// A try's latency is its slowest hop.
			poked(t, "every hop", pokeBound, func() time.Duration {
				res, err := web.Insert(context.Background(), hub.With(struct{}{}), nil)
				require.NoError(t, err)
				r, err := web.Await(context.Background(), res.ID, 5*time.Second, nil)
				require.NoError(t, err)
				require.Equal(t, gendurable.AwaitDone, r.Status)
				hop := func(query string) time.Duration {
					var ms float64
					require.NoError(t, e.pool.QueryRow(context.Background(), expand(query, e.schema), res.ID).Scan(&ms))
					return time.Duration(ms * float64(time.Millisecond))
				}
				insertToParent := hop(`SELECT extract(epoch FROM h.at - i.inserted_at) * 1000
					FROM {schema}.t_hops h JOIN {schema}.instances i USING (id) WHERE id = $1 AND what = 'parent'`)
				spawnToChild := hop(`SELECT extract(epoch FROM max(h.at - i.inserted_at)) * 1000
					FROM {schema}.t_hops h JOIN {schema}.instances i USING (id) WHERE i.parent_id = $1 AND what = 'child'`)
				lastChildToJoin := hop(`SELECT extract(epoch FROM
					(SELECT at FROM {schema}.t_hops WHERE id = $1 AND what = 'join') -
					(SELECT max(finalized_at) FROM {schema}.instances WHERE parent_id = $1)) * 1000`)
				t.Logf("insert→parent %v, spawn→child %v, last child→join %v", insertToParent, spawnToChild, lastChildToJoin)
				return max(insertToParent, spawnToChild, lastChildToJoin)
			})
		})
	}
}

// dropPokes is a transport whose publishes are all lost (its listening side works).
type dropPokes struct{ inner gendurable.PokeTransport }

func (d dropPokes) Open(ctx context.Context, n gendurable.PokeNode) (gendurable.PokeConn, error) {
	c, err := d.inner.Open(ctx, n)
	return dropConn{c}, err
}

type dropConn struct{ gendurable.PokeConn }

func (dropConn) Publish([]string) {}

// Lost pokes cost at most a poll interval: every instance still starts within it. The web
// node's transport drops every publish, so only the worker's poll can find its rows.
func TestLostPokesCostAtMostAPoll(t *testing.T) {
	e := newEnv(t)
	createEffects(t, e)
	const poll = 500 * time.Millisecond
	worker := e.client(t, &gendurable.Config{Name: "worker", Poke: gendurable.PokePostgres(), PollInterval: poll,
		Machines: []gendurable.Machine{effectMachine(e.pool, e.schema, os.Getpid(), 0)},
		Queues:   map[string]gendurable.QueueConfig{"crash": {Concurrency: 4}}})
	start(t, worker)
	web := e.client(t, &gendurable.Config{Name: "web", Poke: dropPokes{gendurable.PokePostgres()},
		Machines: []gendurable.Machine{linear("linear5", 0, nil)}})
	start(t, web)
	time.Sleep(2 * time.Second) // the worker's idle backoff reaches the poll interval
	var ids []int64
	for range 12 {
		ids = append(ids, insertEffect(t, web))
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

// A listening connection that breaks is reopened: what was inserted meanwhile starts once it is
// back, and pokes reach the node again afterwards.
func TestPokeListenerReconnects(t *testing.T) {
	e := newEnv(t)
	createEffects(t, e)
	worker := e.client(t, &gendurable.Config{Name: "worker", Poke: gendurable.PokePostgres(), PollInterval: 10 * time.Second,
		Machines: []gendurable.Machine{effectMachine(e.pool, e.schema, os.Getpid(), 0)},
		Queues:   map[string]gendurable.QueueConfig{"crash": {Concurrency: 4}}})
	start(t, worker)
	web := e.client(t, &gendurable.Config{Name: "web", Poke: gendurable.PokePostgres(),
		Machines: []gendurable.Machine{linear("linear5", 0, nil)}})
	start(t, web)
	time.Sleep(idleFor)

	killed := e.count(t, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'gendurable poke listener worker' AND datname = current_database()`)
	require.Equal(t, 1, killed)
	lost := insertEffect(t, web)
	require.Less(t, startLatency(t, e, lost), 2*time.Second, "the reconnect did not wake the queue")

	poked(t, "pokes after the reconnect", pokeBound, func() time.Duration { return startLatency(t, e, insertEffect(t, web)) })
}

// A signal that wakes an instance parked on another node pokes that node: the woken step runs at
// once, though the worker polls every 10 s.
func TestSignalPokesTheParkedInstancesNode(t *testing.T) {
	e := newEnv(t)
	pg := gendurable.PokePostgres()
	worker := e.client(t, &gendurable.Config{Name: "worker", Poke: pg, PollInterval: 10 * time.Second,
		Machines: []gendurable.Machine{taskFSM("tasks")}, Queues: map[string]gendurable.QueueConfig{"tasks": {}}})
	start(t, worker)
	web := e.client(t, &gendurable.Config{Name: "web", Poke: pg, AwaitTick: 5 * time.Millisecond})
	start(t, web)
	ctx := context.Background()
	poked(t, "signal → woken step → answer", pokeBound+50*time.Millisecond, func() time.Duration {
		id := insertTask(t, web, "park", 3)
		r, err := web.Await(ctx, id, 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitAwaiting, r.Status)
		time.Sleep(idleFor) // the worker's pick of the park reset its backoff
		began := time.Now()
		res, err := web.Signal(ctx, gendurable.ByID(id), "go", nil)
		require.NoError(t, err)
		require.True(t, res.Woke)
		r, err = web.Await(ctx, id, 5*time.Second, nil)
		require.NoError(t, err)
		require.Equal(t, gendurable.AwaitDone, r.Status)
		return time.Since(began)
	})
}

// A listening connection that cannot be opened fails Start with an error that says so, and
// leaves nothing running.
func TestPokePostgresStartFailsClearly(t *testing.T) {
	e := newEnv(t)
	cfg, err := pgxpool.ParseConfig(durabledbtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.AfterConnect = func(_ context.Context, c *pgconn.PgConn) error {
		if strings.HasPrefix(c.ParameterStatus("application_name"), "gendurable poke listener") {
			return errors.New("listener connections refused by the test")
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Poke: gendurable.PokePostgres(),
		Machines: []gendurable.Machine{taskFSM("tasks")}, Queues: map[string]gendurable.QueueConfig{"tasks": {}}})
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	err = cl.Start(context.Background())
	require.ErrorContains(t, err, "poke transport")
	require.ErrorContains(t, err, "listener connections refused by the test")
	eventually(t, 2*time.Second, "the start's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
	require.NoError(t, cl.Stop(context.Background()))
}
