package chaos

// T20, a change of primary: a pg_auto_failover formation (monitor, primary, synchronous standby)
// under three worker processes; two switchovers and a hard kill of the primary during the run.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// chainState is hachain's state: linear5's counter and path, the correlation key of the next
// link of its chain ("" for the last), and whether it is a chain's first link.
type chainState struct {
	I     int      `json:"i"`
	Path  []string `json:"path"`
	Next  string   `json:"next,omitempty"`
	First bool     `json:"first,omitempty"`
}

// chainPath is the path every finished hachain instance takes (I5).
var chainPath = []string{"s0", "s1", "s2"}

// haGate is the key every hachain instance's last step runs under, and haLimit its gate's limit.
const (
	haGate  = "ha:all"
	haLimit = 8
)

// haWorker runs the ha set's machines in a worker process: cl is its client (the steps send
// signals through it), set before the client starts.
type haWorker struct {
	cfg workerCfg
	cl  *gendurable.Client
}

// machines are the ha set's machines (workerCfg.Machines machinesHA), every step recording its
// effect in t_effects in its own transaction (Ctx.Tx), so an effect commits exactly when the
// step's outcome does:
//   - hachain: s0 parks awaiting "go" (a chain's first link moves on at once); s1 sleeps StepMS,
//     then signals the next link of its chain ("go", by correlation key) in its transaction and
//     moves on under the gate's key; s2 finishes.
//   - haprobe: one step, its effect; the test inserts it into a queue of one worker's own that
//     is polled only at start-up, so only a poke can start it soon.
func (w *haWorker) machines() []gendurable.Machine {
	pid := os.Getpid()
	insert := expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`, w.cfg.Schema)
	effect := func(ctx *gendurable.Ctx) (pgx.Tx, error) {
		tx, err := ctx.Tx()
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(ctx, insert, ctx.ID, ctx.Step, ctx.Attempt, pid)
		return tx, err
	}
	advance := func(st chainState, step string) chainState {
		st.I++
		st.Path = append(st.Path, step)
		return st
	}
	chain := gendurable.FSM[chainState]{Name: "hachain", Start: "s0", Queue: "ha", MaxAttempts: 1000,
		Backoff: func(int) time.Duration { return 50 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[chainState]{
			"s0": func(ctx *gendurable.Ctx, st chainState) (gendurable.Outcome, error) {
				if _, err := effect(ctx); err != nil {
					return gendurable.Outcome{}, err
				}
				st = advance(st, "s0")
				if st.First {
					return gendurable.Next("s1", st), nil
				}
				return gendurable.Await([]string{"go"}, "s1", st), nil
			},
			"s1": func(ctx *gendurable.Ctx, st chainState) (gendurable.Outcome, error) {
				select {
				case <-time.After(time.Duration(w.cfg.StepMS) * time.Millisecond):
				case <-ctx.Done():
					return gendurable.Outcome{}, context.Cause(ctx)
				}
				tx, err := effect(ctx)
				if err != nil {
					return gendurable.Outcome{}, err
				}
				if st.Next != "" {
					if _, err := w.cl.SignalTx(ctx, tx, gendurable.ByKey("hachain", st.Next), "go", nil); err != nil {
						return gendurable.Outcome{}, fmt.Errorf("signal %s: %w", st.Next, err)
					}
				}
				return gendurable.Next("s2", advance(st, "s1"), gendurable.ConcurrencyKey(haGate)), nil
			},
			"s2": func(ctx *gendurable.Ctx, st chainState) (gendurable.Outcome, error) {
				if _, err := effect(ctx); err != nil {
					return gendurable.Outcome{}, err
				}
				return gendurable.Done(advance(st, "s2")), nil
			},
		}}
	probe := gendurable.Job[string]{Name: "haprobe", Queue: "ha", Perform: func(ctx *gendurable.Ctx, _ string) error {
		_, err := effect(ctx)
		return err
	}}
	return []gendurable.Machine{chain, probe}
}

// haFault is one change of primary the test made, and what it cost.
type haFault struct {
	kind     string
	from, to string // the primary before and after
	began    time.Time
	settled  time.Time // the formation stable again, the new primary serving
	firstNew time.Time // the first committed transition on the new primary
	lastOld  time.Time // the last committed transition on the old primary before the change
}

// T20: three worker processes (PokePostgres, the default lease of 30 s, heartbeat 6 s) work
// chains of hachain instances (100 chains of 100 links, each link's middle step 500 ms long; CI:
// 20 links of 1 s; another 100 chains whenever less than that is left before a change) on a
// pg_auto_failover formation, through a multi-host URL with target_session_attrs=read-write. At
// 15 % and 40 % of the first chains' instances done (and 2 % more done on the new primary since
// the last change), `pg_autoctl perform switchover`; at 65 %, the
// primary's keeper and server are SIGKILLed together, the monitor promotes the standby
// (unhealthy after 2 s, demote timeout 4 s), and the killed node is started again to rejoin as
// the standby. Pass, from the rows on the final primary: I1 to I7 (every instance done, one
// terminal transition each, exact paths and counters, an effect for every step that moved on,
// nothing executing, the gate's counter at 0, no signal left), I8 from both nodes' server logs;
// no (instance, step) effect committed twice (every effect commits in its step's transaction);
// never more than the gate's limit executing under its key (a sampler on the primary, every
// 5 ms when it can reach one); no running step lost its claim (no heartbeat.lost: the lease
// outlasts each change, and the next change waits for a beat on the new primary); each worker's
// listener session on the final primary, and a probe in its own queue (polled at start-up, then
// at doubling intervals up to an hour) started by a poke within 5 s of its insert after the last
// change. Reported: per change, the time from its
// start to the first commit on the new primary and the gap between the last commit on the old
// and the first on the new; the claims the reaper released (picks whose reply was lost with the
// old primary) and the step transactions that lost their session and handed their claim back.
func TestFailoverLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seed, _ := oracle.Seed(t)
	began := time.Now()
	hctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	h, err := devdb.StartHA(hctx, devdb.HAOptions{Unhealthy: 2 * time.Second, DemoteTimeout: 4 * time.Second})
	if err != nil && os.Getenv("CI") != "true" && strings.Contains(err.Error(), "pg_auto_failover is not installed") {
		t.Skip(err)
	}
	require.NoError(t, err, "the pg_auto_failover formation (CI=true: .ci/run must provide postgresql-*-auto-failover)")
	t.Cleanup(func() { require.NoError(t, h.Close()) })
	pool := openPool(t, h.URL, 8)
	var syncNames string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&syncNames))
	require.NotEmpty(t, syncNames, "the primary replicates synchronously: a commit it acknowledged survives its loss")
	e := &env{url: h.URL, pool: pool, side: openPool(t, h.URL, 4), schema: durabledbtest.Schema(t, pool), started: began}
	require.NoError(t, oracle.Install(ctx, pool, e.schema))
	// Which server committed each transition: the port of the node that was primary then.
	e.exec(t, `ALTER TABLE {schema}.t_outcome_log ADD COLUMN port integer NOT NULL DEFAULT inet_server_port()`)
	ports := map[string]int{}
	for _, n := range h.Nodes {
		ports[n.Name] = n.Port
	}

	// A batch of chains lasts links × StepMS (20 s / 50 s); another batch goes in before a change
	// whenever less than a batch is left to do (see atFraction), so that changes slow to settle on
	// a busy machine never find the run over.
	chains, links := 100, oracle.Size(20, 100)
	batch, n := chains*links, 0
	ins := e.client(t, &gendurable.Config{Name: "ins", Poke: gendurable.PokePostgres(), Logger: slog.New(slog.DiscardHandler),
		Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Machines: (&haWorker{cfg: workerCfg{Schema: e.schema}}).machines()})
	// An inserting node calls Start (with no queues) for its inserts to poke other nodes.
	start(t, ins)
	chain := (&haWorker{}).machines()[0].(gendurable.FSM[chainState])
	key := func(c, j int) string { return fmt.Sprintf("c%d-%d", c, j) }
	insertBatch := func() {
		t.Helper()
		params := make([]gendurable.InsertManyParams, 0, batch)
		for c := n / links; c < n/links+chains; c++ {
			for j := range links {
				st := chainState{First: j == 0}
				if j+1 < links {
					st.Next = key(c, j+1)
				}
				params = append(params, gendurable.InsertManyParams{Input: chain.With(st),
					Opts: &gendurable.InsertOpts{CorrelationKey: key(c, j)}})
			}
		}
		eventually(t, time.Minute, "a batch of chains inserted", func() bool {
			_, err := ins.InsertMany(ctx, params)
			return err == nil
		})
		n += batch
		t.Logf("%d chains of %d links inserted: %d instances in all", chains, links, n)
	}
	insertBatch()

	// The gate's sampler: on the primary whenever one answers (a sample that fails is skipped,
	// and the next one reconnects through the multi-host URL).
	var mu sync.Mutex
	most := 0
	stopSampler := sampleEvery(t, e, func() []any { return []any{haGate} },
		`SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND concurrency_key = $1`,
		func(vals []any) {
			mu.Lock()
			most = max(most, int(vals[0].(int64)))
			mu.Unlock()
		}, func(error) bool { return true })

	cfg := workerCfg{URL: h.URL, Schema: e.schema, Machines: machinesHA, Conc: 40, Conns: 12, Poke: "postgres",
		PollMS: 200, ReaperMS: 500, GCMS: 0, StepMS: oracle.Size(1000, 500), Seed: seed, Quiet: true, Beats: true,
		Gates: map[string][2]int{"ha": {haLimit, 1}}}
	leaseMS(int(gendurable.DefaultLease.Milliseconds()))(&cfg)
	var workers []*worker
	for i := range 3 {
		c := cfg
		c.Name = fmt.Sprint("ha", i)
		probeQueue := "probe-" + c.Name
		c.Queues = []string{"ha", probeQueue}
		// Polled at start-up only, within the test: a probe there starts on a poke or not soon.
		c.QueuePollMS = map[string]int{probeQueue: int(time.Hour.Milliseconds())}
		workers = append(workers, startWorker(t, c))
	}
	probe := func(when string) {
		t.Helper()
		probeJob := (&haWorker{}).machines()[1].(gendurable.Job[string])
		for _, w := range workers {
			var res gendurable.InsertResult
			eventually(t, time.Minute, "a probe inserted", func() bool {
				var err error
				res, err = ins.Insert(ctx, probeJob.With(""), &gendurable.InsertOpts{Queue: "probe-" + w.name})
				return err == nil
			})
			var lag time.Duration
			eventually(t, 30*time.Second, "the probe's step ran", func() bool {
				var ms float64
				err := e.side.QueryRow(ctx, e.q(`SELECT extract(epoch FROM f.at - i.inserted_at) * 1000 FROM {schema}.t_effects f
					JOIN {schema}.instances i ON i.id = f.id WHERE f.id = $1`), res.ID).Scan(&ms)
				lag = time.Duration(ms * float64(time.Millisecond))
				return err == nil
			})
			t.Logf("probe %s, worker %s: started %v after its insert", when, w.name, lag.Round(time.Millisecond))
			// The worker listens on the server that is primary now.
			require.Equal(t, 1, e.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1`,
				"gendurable poke listener "+w.name+"%"), "worker %s's LISTEN session on the primary", w.name)
			require.Less(t, lag, 5*time.Second, "worker %s's LISTEN did not hear the probe's poke %s", w.name, when)
		}
	}
	probe("before the changes")

	done := func() int {
		var k int
		if err := e.side.QueryRow(ctx, e.q(`SELECT count(*) FROM {schema}.instances WHERE status = 'done' AND machine = 'hachain'`)).Scan(&k); err != nil {
			return -1
		}
		return k
	}
	// The next change waits for the fraction of the first batch, and for 2 % of a batch more
	// instances done on the new primary since the last change settled; with less than a batch
	// left to do, another batch goes in first.
	after := 0
	atFraction := func(f float64) {
		t.Helper()
		if k := done(); k >= 0 && n-k < batch {
			insertBatch()
		}
		want := max(int(f*float64(batch)), after+batch/50)
		eventually(t, 5*time.Minute, fmt.Sprintf("%d instances done", want), func() bool { return done() >= want })
	}
	var faults []haFault
	change := func(kind string, do func(primary string) error) {
		from, err := h.Primary(ctx)
		require.NoError(t, err)
		f := haFault{kind: kind, from: from, began: time.Now()}
		require.NoError(t, do(from))
		require.NoError(t, h.WaitStable(ctx, 2*time.Minute))
		f.to, err = h.Primary(ctx)
		require.NoError(t, err)
		require.NotEqual(t, f.from, f.to, "%s: the primary did not change", kind)
		f.settled = time.Now()
		faults = append(faults, f)
		// Each change must be outlasted by the lease on its own: the next one waits until every
		// worker's heartbeat has reached the new primary, or no claim is left that none extended
		// since (an idle worker's; a lost pick's, once the reaper released it). Two changes back
		// to back could otherwise keep every beat out for longer than a lease.
		eventually(t, 2*time.Minute, "every claim's lease extended on the new primary", func() bool {
			beaten := true
			for _, w := range workers {
				beaten = beaten && w.beatSince(f.settled)
			}
			if beaten {
				return true
			}
			var k int
			err := e.side.QueryRow(ctx, e.q(`SELECT count(*) FROM {schema}.instances WHERE status = 'executing'
				AND locked_until < $1::timestamptz + $2 * interval '1 millisecond'`), f.settled, cfg.LeaseMS).Scan(&k)
			return err == nil && k == 0 // a query that fails (a pool connection to the old primary) is asked again
		})
		after = done()
	}
	atFraction(0.15)
	change("switchover", func(string) error { return h.Switchover(ctx) })
	atFraction(0.40)
	change("switchover", func(string) error { return h.Switchover(ctx) })
	atFraction(0.65)
	change("kill", func(primary string) error { return h.Kill(primary) })
	require.NoError(t, h.Restart(faults[2].from))
	require.NoError(t, h.WaitStable(ctx, 2*time.Minute))
	states, err := h.States(ctx)
	require.NoError(t, err)
	t.Logf("after the kill, the killed node rejoined: %+v", states)
	rejoined := false
	for _, st := range states {
		if st.Name == faults[2].from {
			require.Equal(t, "secondary", st.Reported, "the killed node rejoined as the standby: %+v", states)
			rejoined = true
		}
	}
	require.True(t, rejoined, "the killed node %s is in the formation's states: %+v", faults[2].from, states)

	eventually(t, 5*time.Minute, "every instance done", func() bool { return done() == n })
	probe("after the changes")
	gateSamples, gateFailed := stopSampler()
	var reports []workerReport
	for _, w := range workers {
		reports = append(reports, w.term(t))
	}
	all := sum(reports...)

	// The cost of each change, from the rows: when the new primary committed its first
	// transition, and the old its last.
	if testing.Verbose() {
		events, err := h.Events(ctx)
		require.NoError(t, err)
		for _, ev := range events {
			t.Log("monitor: " + ev)
		}
	}
	for i := range faults {
		f := &faults[i]
		t.Logf("%s %s → %s began %s", f.kind, f.from, f.to, f.began.Format("15:04:05.000"))
		require.NoError(t, pool.QueryRow(ctx, e.q(`SELECT
			  (SELECT min(at) FROM {schema}.t_outcome_log WHERE port = $1 AND at >= $3),
			  (SELECT max(at) FROM {schema}.t_outcome_log WHERE port = $2 AND at >= $3 - interval '1 minute' AND at <= $4)`),
			ports[f.to], ports[f.from], f.began, f.settled).Scan(&f.firstNew, &f.lastOld))
		t.Logf("%s %s → %s: settled after %v; first commit on the new primary %v after the change began; commits paused %v (last on the old primary to first on the new)",
			f.kind, f.from, f.to, f.settled.Sub(f.began).Round(time.Millisecond), f.firstNew.Sub(f.began).Round(time.Millisecond),
			f.firstNew.Sub(f.lastOld).Round(time.Millisecond))
	}

	v, err := oracle.Check(ctx, pool, e.schema, oracle.Opts{N: n + 2*len(workers), Effects: true, Counter: true,
		Paths: map[string][]string{"hachain": chainPath}})
	require.NoError(t, err)
	logs, err := h.ServerLogs()
	require.NoError(t, err)
	if k := strings.Count(logs, "deadlock detected"); k > 0 {
		v = append(v, oracle.Violation{Invariant: "I8 no deadlocks", Detail: fmt.Sprintf("the servers logged %d deadlocks", k)})
	}
	twice := e.count(t, `SELECT count(*) FROM (SELECT 1 FROM {schema}.t_effects GROUP BY id, step HAVING count(*) > 1) d`)
	expired := e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors @> '[{"kind":"lease"}]'`)
	dupTerminal := e.count(t, `SELECT coalesce(sum(k - 1), 0) FROM (SELECT count(*) AS k FROM {schema}.t_outcome_log
		WHERE new_status = 'done' AND old_status IS DISTINCT FROM new_status GROUP BY id) c`)
	mu.Lock()
	mostGate := most
	mu.Unlock()
	lostBeats := all.Events[string(gendurable.EventHeartbeatLost)]
	t.Logf("%d instances, %d steps, %d outcome commits retried (events), %d stale outcomes; gate: %d samples (%d failed during the changes), at most %d executing (limit %d); claims released as expired: %d; heartbeats that found running claims lost (each cancels those steps): %d; step transactions that lost their session, claims handed back: %d",
		n, all.steps(), all.Events[string(gendurable.EventCommitFailed)], all.stale(), gateSamples, gateFailed, mostGate, haLimit, expired, lostBeats, all.HandBacks)
	oracle.Report(t, oracle.Summary{Test: t.Name(), Seed: seed, Instances: n, Faults: len(faults),
		Violations: len(v), DuplicateTerminal: dupTerminal, Seconds: time.Since(began).Seconds()})
	require.Empty(t, v, "oracle violations")
	require.Zero(t, twice, "a step's transactional effect committed twice")
	require.LessOrEqual(t, mostGate, haLimit, "more executions under the gate's key than its limit")
	require.Greater(t, gateSamples, 100)
	// Claims the reaper released are those of picks whose reply was lost with the old primary
	// (the rows were claimed, the worker never heard): their lease runs out. A running step's
	// claim must not be lost: its heartbeat reaches the new primary within the lease.
	if lostBeats > 0 {
		ids := all.LostClaims
		for _, c := range all.StaleClaims {
			ids = append(ids, c.ID)
		}
		require.NoError(t, pool.QueryRow(ctx, e.q(`SELECT coalesce(array_agg(id), '{}') || $1::bigint[] FROM (SELECT id FROM {schema}.instances
			WHERE errors::text ILIKE '%lease%' LIMIT 10) x`), ids).Scan(&ids))
		var rows []string
		require.NoError(t, pool.QueryRow(ctx, e.q(`SELECT coalesce(array_agg(format('%s #%s %s: %s/%s -> %s/%s by %s on %s',
			l.at::time, l.seq, l.id, l.old_status, l.old_step, l.new_status, l.new_step, l.locked_by, l.port) ORDER BY l.id, l.seq), '{}')
			FROM {schema}.t_outcome_log l WHERE l.id = ANY($1)`), ids).Scan(&rows))
		for _, r := range rows {
			t.Log(r)
		}
		t.Logf("lost claims: %v; stale claims: %+v; ports %v", all.LostClaims, all.StaleClaims, ports)
		logHistory(t, e, ids)
	}
	require.Zero(t, lostBeats, "running steps lost their claims: the lease should outlast each change of primary")
}
