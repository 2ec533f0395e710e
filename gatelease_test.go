package gendurable_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// gateSampler samples, every few milliseconds until stop is closed, every gate shard's executing
// rows against its counter and capacity, and the leases. It records the most executing rows seen
// for one key, the most leases seen at once, and every sample where a shard ran more rows than
// its capacity or than its counter holds (each an over-admission or a counter below the truth).
type gateSampler struct {
	mu                     sync.Mutex
	maxKey, maxLeases, n   int
	violations             []string
	leasedShards, sawLease map[string]bool
}

func sampleGates(t *testing.T, e *env, stop <-chan struct{}) (*gateSampler, *sync.WaitGroup) {
	s := &gateSampler{leasedShards: map[string]bool{}, sawLease: map[string]bool{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// One snapshot: the executing rows per key and shard, the counters, the leases.
			rows, err := e.pool.Query(ctx, expand(`
				WITH ex AS (SELECT concurrency_key AS key, concurrency_shard AS shard, count(*) AS n
				            FROM {schema}.instances WHERE status = 'executing' AND concurrency_key IS NOT NULL
				            GROUP BY 1, 2),
				     perkey AS (SELECT key, sum(n)::int AS n FROM ex GROUP BY key)
				SELECT 'key', key, 0, n, 0, 0 FROM perkey
				UNION ALL
				SELECT 'shard', g.key, g.shard, coalesce(ex.n, 0)::int, g.held, g.capacity
				FROM {schema}.gates AS g LEFT JOIN ex ON ex.key = g.key AND ex.shard = g.shard
				UNION ALL
				SELECT 'lease', l.key || '/' || l.owner, l.shard, l.slots, 0, 0 FROM {schema}.gate_leases AS l`, e.schema))
			if err != nil {
				t.Error(err)
				return
			}
			var kind, key string
			var shard int16
			var n, held, capacity int
			leases := 0
			s.mu.Lock()
			for rows.Next() {
				if err := rows.Scan(&kind, &key, &shard, &n, &held, &capacity); err != nil {
					t.Error(err)
				}
				switch kind {
				case "key":
					s.maxKey = max(s.maxKey, n)
				case "shard":
					if n > capacity || n > held {
						s.violations = append(s.violations, fmt.Sprintf("%s/%d: %d executing, held %d, capacity %d", key, shard, n, held, capacity))
					}
				case "lease":
					leases++
					s.sawLease[key] = true
				}
			}
			s.maxLeases = max(s.maxLeases, leases)
			s.n++
			s.mu.Unlock()
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return s, &wg
}

// insertUnder inserts n jobs under concurrency key key, the key as their argument.
func insertUnder(t *testing.T, cl *gendurable.Client, job gendurable.Job[string], n int, key string) {
	t.Helper()
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(key), Opts: &gendurable.InsertOpts{ConcurrencyKey: key}}
	}
	_, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
}

// TestGateLeasesNeverOverAdmit races twelve clients over one gated key far enough from its limit
// for runners to lease blocks of its slots, and close enough that the gate binds: the leases
// taken while the shards had room, the claims admitted one by one once they had not, the
// reconciler sweeping every 20 ms throughout. One client starts first and the others once it
// holds a lease (twelve starting at once filled the shards before any runner's first full
// batch, on a busy machine every time). From the database's rows, sampled: no shard ever
// runs more rows than its capacity or than its counter holds, and the key never more than its
// limit; in process, no step ever runs beside Limit others. At the end every counter is zero and
// no lease is left.
func TestGateLeasesNeverOverAdmit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const limit = 80
	var running, overs atomic.Int64
	job := gendurable.Job[string]{Name: "leased", Queue: "g", Perform: func(ctx *gendurable.Ctx, key string) error {
		if running.Add(1) > limit {
			overs.Add(1)
		}
		time.Sleep(time.Duration(2+ctx.ID%5) * time.Millisecond)
		running.Add(-1)
		return nil
	}}
	// Two shards of 40: a runner of 8 executors leases 8 slots where 32 are free.
	limits := map[string]gendurable.ConcurrencyLimit{"tenant": {Limit: limit, Shards: 2}}
	// Every lease taken or grown, logged by a trigger: whether runners leased is read from the
	// database's rows, not from samples that a short lease can fall between on a busy machine.
	e.exec(t, `CREATE TABLE {schema}.t_leases (owner text NOT NULL);
		CREATE FUNCTION {schema}.t_log_lease() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN INSERT INTO `+expand("{schema}", e.schema)+`.t_leases (owner) VALUES (NEW.owner); RETURN NULL; END $fn$;
		CREATE TRIGGER t_log_lease AFTER INSERT OR UPDATE ON {schema}.gate_leases FOR EACH ROW
		EXECUTE FUNCTION {schema}.t_log_lease()`)
	var clients []*gendurable.Client
	for i := range 12 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprint("c", i), Machines: []gendurable.Machine{job},
			ConcurrencyLimits: limits, Queues: map[string]gendurable.QueueConfig{"g": {Concurrency: 8}},
			GC: &gendurable.GCConfig{Interval: 20 * time.Millisecond}})
		clients = append(clients, cl)
	}
	require.NoError(t, clients[0].Start(context.Background()))
	stopAll := func() {
		for _, cl := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			require.NoError(t, cl.Stop(ctx))
			cancel()
		}
		clients = nil
	}
	t.Cleanup(func() {
		if clients != nil {
			stopAll()
		}
	})
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: []gendurable.Machine{job}, ConcurrencyLimits: limits})
	stop := make(chan struct{})
	s, wg := sampleGates(t, e, stop)
	n := oracle.Size(2000, 4000)
	insertUnder(t, ins, job, n, "tenant:a")
	eventually(t, time.Minute, "the first client's runner leasing slots", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.t_leases`) > 0
	})
	for _, cl := range clients[1:] {
		require.NoError(t, cl.Start(context.Background()))
	}
	eventually(t, 3*time.Minute, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	close(stop)
	wg.Wait()
	s.mu.Lock()
	t.Logf("%d samples; most executing %d; most leases at once %d; runners seen holding a lease %d, logged leasing %d",
		s.n, s.maxKey, s.maxLeases, len(s.sawLease), e.count(t, `SELECT count(DISTINCT owner) FROM {schema}.t_leases`))
	require.Greater(t, s.n, 30)
	require.Empty(t, s.violations, "a shard ran more rows than its capacity or its counter")
	require.LessOrEqual(t, s.maxKey, limit, "the key had more than Limit executing rows")
	require.GreaterOrEqual(t, s.maxKey, limit*3/4, "the gate is live: the key came near its limit")
	s.mu.Unlock()
	require.Positive(t, e.count(t, `SELECT count(DISTINCT owner) FROM {schema}.t_leases`), "runners leased slots")
	require.Zero(t, overs.Load(), "a step ran beside Limit others")

	stopAll()
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.gate_leases`), "every lease released at Stop")
	require.Equal(t, 0, e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`), "counters end at zero")
}

// TestGateLeaseLostMidRunLeavesTheGateExact takes a running client's lease away: its expiry is
// set in the past (its heartbeat would renew it only ten seconds later) while the client still
// counts on it. The client's picks then admit nothing against it (they check it); the reconciler,
// sweeping every 20 ms, removes it with its unused slots, or the client, finding no row of its
// key under it, releases it first; the key is admitted claim by claim again, or under a new
// lease. From the rows, sampled throughout: no shard runs more rows than its counter holds. At
// the end every counter is zero (a slot given back to a lease already gone is a counter one too
// high, which the reconciler brings down) and no lease is left.
func TestGateLeaseLostMidRunLeavesTheGateExact(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	job := gendurable.Job[string]{Name: "leased", Queue: "g", Perform: func(ctx *gendurable.Ctx, key string) error {
		time.Sleep(time.Duration(1+ctx.ID%3) * time.Millisecond)
		return nil
	}}
	limits := map[string]gendurable.ConcurrencyLimit{"tenant": {Limit: 1000, Shards: 1}}
	var swept atomic.Int64
	worker := e.client(t, &gendurable.Config{Name: "worker", Machines: []gendurable.Machine{job},
		ConcurrencyLimits: limits, Queues: map[string]gendurable.QueueConfig{"g": {Concurrency: 10}},
		Heartbeat: 10 * time.Second, GC: &gendurable.GCConfig{Disabled: true}})
	start(t, worker)
	maint := e.client(t, &gendurable.Config{Name: "maint", ConcurrencyLimits: limits,
		GC: &gendurable.GCConfig{Interval: 20 * time.Millisecond},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			if ev.Name == gendurable.EventGCSwept {
				swept.Add(int64(ev.Gates))
			}
		}}})
	start(t, maint)
	stop := make(chan struct{})
	s, wg := sampleGates(t, e, stop)
	n := oracle.Size(1500, 3000)
	insertUnder(t, worker, job, n, "tenant:a")
	eventually(t, time.Minute, "a lease", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.gate_leases`) > 0
	})
	before := swept.Load()
	e.exec(t, `UPDATE {schema}.gate_leases SET expires_at = now() - interval '1 second'`)
	eventually(t, 10*time.Second, "the expired lease removed", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.gate_leases WHERE expires_at < now()`) == 0
	})
	eventually(t, 3*time.Minute, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
	close(stop)
	wg.Wait()
	s.mu.Lock()
	t.Logf("%d samples; most executing %d", s.n, s.maxKey)
	require.Empty(t, s.violations, "a shard ran more rows than its counter holds")
	s.mu.Unlock()
	t.Logf("gate repairs by the reconciler since the expiry: %d", swept.Load()-before)
	eventually(t, 10*time.Second, "counters back at zero, no lease left", func() bool {
		// The worker's lease (a new one, if it leased again) ends once its key has gone quiet.
		return e.count(t, `SELECT count(*) FROM {schema}.gate_leases`) == 0 &&
			e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`) == 0
	})
}
