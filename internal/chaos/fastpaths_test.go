package chaos

// The engine's fast paths under process faults (docs/reliability.md, "Fast paths under kills
// and pauses"): steps claimed by their own Insert (no pick), picks that admit against a gate
// lease (a block of a gate's slots leased by one runner), and picks that charge a rate lane (a
// bucket debited for a whole batch in one grant). Worker processes are SIGKILLed, or SIGSTOPped
// until their leases have run out and the others have taken their claims, while they run steps
// of the fast path; the database's own rows judge the outcome.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// fastQueue is the fast set's queue.
const fastQueue = "fast"

// insertedPrefix starts the line a workerCfg.Inserters worker prints once it stopped inserting.
const insertedPrefix = "inserted "

// fastState is the fast set's state: linear5's counter and path (oracle I3, I5), the client
// that ran the last step (By: the database tells from it whose outcome applied), and the rate
// limit and weight every step of fast5 runs under (none if Limit is "").
type fastState struct {
	I      int      `json:"i"`
	Path   []string `json:"path"`
	By     string   `json:"by,omitempty"`
	Limit  string   `json:"limit,omitempty"`
	Weight int      `json:"weight,omitempty"`
}

// soloPath is the path every finished solo instance takes (I5).
var soloPath = []string{"s0"}

// fastPaths are the fast set's paths by machine (oracle.Opts.Paths).
var fastPaths = map[string][]string{"fast5": linearPath, "solo": soloPath}

// fastWorker runs the fast set's machines in a worker process (a zero one builds them for
// inserting only), and its inserters (workerCfg.Inserters).
type fastWorker struct {
	cfg workerCfg
	fx  *pgxpool.Pool
	pid int
	// waiting holds, by instance, the inserter waiting for the step of the instance it
	// inserted; ended the solo steps that ended before their inserter waited.
	mu      sync.Mutex
	waiting map[int64]chan struct{}
	ended   map[int64]bool
}

func newFastWorker(cfg workerCfg, fx *pgxpool.Pool) *fastWorker {
	return &fastWorker{cfg: cfg, fx: fx, pid: os.Getpid(), waiting: map[int64]chan struct{}{}, ended: map[int64]bool{}}
}

// step is every fast step's body: it records the step's effect (on the effects pool, whatever
// becomes of the claim), sleeps StepMS (not cut short by a lost claim: a paused process's step
// runs to its end, and its late outcome carries progress), and names this client in the state.
func (w *fastWorker) step(ctx *gendurable.Ctx, st fastState) (fastState, error) {
	if w.fx != nil {
		if _, err := w.fx.Exec(context.WithoutCancel(ctx), expand(`INSERT INTO {schema}.t_effects (id, step, attempt, pid)
			VALUES ($1, $2, $3, $4)`, w.cfg.Schema), ctx.ID, ctx.Step, ctx.Attempt, w.pid); err != nil {
			return st, fmt.Errorf("effect of %d/%s: %w", ctx.ID, ctx.Step, err)
		}
	}
	time.Sleep(time.Duration(w.cfg.StepMS) * time.Millisecond)
	st.I++
	st.Path = append(st.Path, ctx.Step)
	st.By = w.cfg.Name
	return st, nil
}

// machines are the fast set's machines, in queue "fast":
//   - fast5: five steps; each Next names the state's rate limit and weight, if it has one.
//   - solo: one step, which tells the inserter waiting for it that it ended.
func (w *fastWorker) machines() []gendurable.Machine {
	steps := map[string]gendurable.StepFunc[fastState]{}
	for i, s := range linearPath {
		steps[s] = func(ctx *gendurable.Ctx, st fastState) (gendurable.Outcome, error) {
			st, err := w.step(ctx, st)
			if err != nil {
				return gendurable.Outcome{}, err
			}
			if i == len(linearPath)-1 {
				return gendurable.Done(st), nil
			}
			if st.Limit != "" {
				return gendurable.Next(linearPath[i+1], st, gendurable.RateLimit(st.Limit), gendurable.Weight(max(st.Weight, 1))), nil
			}
			return gendurable.Next(linearPath[i+1], st), nil
		}
	}
	fast5 := gendurable.FSM[fastState]{Name: "fast5", Start: "s0", Queue: fastQueue, Steps: steps}
	solo := gendurable.FSM[fastState]{Name: "solo", Start: "s0", Queue: fastQueue, Steps: map[string]gendurable.StepFunc[fastState]{
		"s0": func(ctx *gendurable.Ctx, st fastState) (gendurable.Outcome, error) {
			st, err := w.step(ctx, st)
			w.stepEnded(ctx.ID)
			if err != nil {
				return gendurable.Outcome{}, err
			}
			return gendurable.Done(st), nil
		},
	}}
	return []gendurable.Machine{fast5, solo}
}

// stepEnded tells the inserter of instance id, if it waits, that its step ended here.
func (w *fastWorker) stepEnded(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.waiting[id]; ok {
		close(ch)
		delete(w.waiting, id)
		return
	}
	if w.cfg.Inserters > 0 {
		w.ended[id] = true
	}
}

// awaitStep waits until the step of instance id ended in this process, at most 4 × StepMS +
// 200ms (the row may have gone in available and run elsewhere), or quit is closed.
func (w *fastWorker) awaitStep(id int64, quit <-chan struct{}) {
	w.mu.Lock()
	if w.ended[id] {
		delete(w.ended, id)
		w.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	w.waiting[id] = ch
	w.mu.Unlock()
	t := time.NewTimer(time.Duration(4*w.cfg.StepMS+200) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-quit:
	}
	w.mu.Lock()
	delete(w.waiting, id)
	w.mu.Unlock()
}

// insertLoop starts cfg.Inserters goroutines, each inserting solo instances into the first queue
// with Insert, one at a time: it waits for the step of the one it inserted to end here before
// it inserts the next, so that the client has a free slot and (with few rows going in available)
// nothing due ahead of the new row, and its Insert claims the row itself. They stop on SIGUSR1
// or stop; the worker then prints "inserted <n>". stop ends them and waits until they have.
func (w *fastWorker) insertLoop(cl *gendurable.Client) (stop func()) {
	quit := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(quit) }) }
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		select {
		case <-usr1:
			end()
		case <-quit:
		}
	}()
	solo := w.machines()[1].(gendurable.FSM[fastState])
	var wg sync.WaitGroup
	var n atomic.Int64
	for range w.cfg.Inserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				r, err := cl.Insert(context.Background(), solo.With(fastState{}), &gendurable.InsertOpts{Queue: w.cfg.Queues[0]})
				if err != nil {
					fmt.Fprintln(os.Stderr, "worker: insert:", err)
					select {
					case <-quit:
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				n.Add(1)
				w.awaitStep(r.ID, quit)
			}
		}()
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		fmt.Printf("%s%d\n", insertedPrefix, n.Load())
		close(finished)
	}()
	return func() { end(); <-finished }
}

// stopInserting SIGUSR1s a workerCfg.Inserters worker and waits until it has stopped inserting,
// and returns how many instances it inserted.
func (w *worker) stopInserting(t testing.TB) int {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGUSR1))
	select {
	case n := <-w.inserted:
		return n
	case <-w.done:
		t.Fatalf("worker %s exited instead of stopping its inserts", w.name)
	case <-time.After(30 * time.Second):
		t.Fatalf("worker %s did not stop inserting within 30s of SIGUSR1", w.name)
	}
	return 0
}

// fastCfg is the fast set's worker in e's schema: queue "fast", 4 slots, lease 2s, heartbeat
// 400ms, poll 50ms, reaper and GC (the gate reconciler) every 100ms, steps of 30ms, pools of 6
// and 3 connections; set changes the rest. (A shorter lease lets a loaded machine's stalls, not
// the test's faults, lose claims: their steps would run again with no fault to explain it.)
func (e *env) fastCfg(set ...func(*workerCfg)) workerCfg {
	c := workerCfg{URL: e.url, Schema: e.schema, Machines: machinesFast, Queues: []string{fastQueue}, Conc: 4,
		Conns: 6, FxConns: 3, PollMS: 50, ReaperMS: 100, GCMS: 100, StepMS: 30}
	for _, f := range append([]func(*workerCfg){leaseMS(int(fastLease.Milliseconds()))}, set...) {
		f(&c)
	}
	return c
}

// fastLease is fastCfg's lease.
const fastLease = 2 * time.Second

// insertFast inserts n fast5 instances in queue "fast", set(i, state, opts) changing the i-th
// one's state and options.
func insertFast(t *testing.T, e *env, n int, set func(i int, st *fastState, o *gendurable.InsertOpts)) {
	t.Helper()
	machines := (&fastWorker{}).machines()
	fast5 := machines[0].(gendurable.FSM[fastState])
	cl := e.client(t, &gendurable.Config{Machines: machines})
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		st, o := fastState{}, &gendurable.InsertOpts{Queue: fastQueue}
		set(i, &st, o)
		params[i] = gendurable.InsertManyParams{Input: fast5.With(st), Opts: o}
	}
	_, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
}

// logClaims installs t_claims: every claim a pick makes (a row's update to executing), with its
// token, gate key and shard, rate limit and weight, its pick's transaction time (the clock gates
// and buckets count in), and the kind of pick, told apart by its statement: pick_leased is the
// one pick that locks a gate lease (FOR KEY SHARE), pick_rate_lane the one that grants a lane
// (its grant checks that no row of the lane is keyed: "AS keyed").
func logClaims(t *testing.T, e *env) {
	t.Helper()
	s := e.q("{schema}")
	e.exec(t, `CREATE TABLE {schema}.t_claims (id bigint NOT NULL, owner text NOT NULL, ckey text, shard smallint,
		  rkey text, weight integer, leased boolean NOT NULL, lane boolean NOT NULL, tx_at timestamptz NOT NULL DEFAULT now());
		CREATE INDEX ON {schema}.t_claims (id, owner);
		CREATE FUNCTION {schema}.t_log_claim() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN
		  INSERT INTO `+s+`.t_claims (id, owner, ckey, shard, rkey, weight, leased, lane)
		  VALUES (NEW.id, NEW.locked_by, NEW.concurrency_key, NEW.concurrency_shard, NEW.rate_limit, NEW.weight,
		          position('FOR KEY SHARE' in current_query()) > 0, position('AS keyed' in current_query()) > 0);
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_log_claim AFTER UPDATE ON {schema}.instances FOR EACH ROW
		WHEN (OLD.status IS DISTINCT FROM 'executing' AND NEW.status = 'executing')
		EXECUTE FUNCTION {schema}.t_log_claim()`)
}

// fastEnv is newEnv with the logs the tests here read besides the oracle's: t_claims
// (logClaims) and t_applied, every update of a row that applied a step's result (its state or
// its result changed: a claim, a release or a heartbeat changes neither), with the row's status
// and claim just before it and the client the result names (By).
func fastEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, 8)
	logClaims(t, e)
	e.exec(t, `CREATE TABLE {schema}.t_applied (id bigint NOT NULL, old_status text NOT NULL, owner text, by text,
		  at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE FUNCTION {schema}.t_log_applied() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN
		  INSERT INTO `+e.q("{schema}")+`.t_applied (id, old_status, owner, by)
		  VALUES (NEW.id, OLD.status::text, OLD.locked_by, coalesce(NEW.result ->> 'by', NEW.state ->> 'by'));
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_log_applied AFTER UPDATE ON {schema}.instances FOR EACH ROW
		WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.result IS DISTINCT FROM NEW.result)
		EXECUTE FUNCTION {schema}.t_log_applied()`)
	return e
}

// staleApplied counts the step results that applied although the claim they ran under was not
// the row's claim at that moment (t_applied): every result must land on a row executing under a
// claim of the client it names (By). A late outcome of a paused process that got past the fence
// would show as a result applied to an available or finished row, or under another client's
// claim.
func staleApplied(t *testing.T, e *env) int {
	t.Helper()
	var n int
	var example *string
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT count(*),
		  min(id || ': ' || old_status || ' under ' || coalesce(owner, 'no claim') || ', result by ' || coalesce(by, '?'))
		FROM {schema}.t_applied
		WHERE old_status <> 'executing' OR owner IS NULL OR split_part(owner, ':', 1) IS DISTINCT FROM by`)).Scan(&n, &example))
	if n > 0 {
		t.Errorf("%d step results applied under a claim the row no longer held, e.g. %s", n, *example)
	}
	return n
}

// catch SIGSTOPs worker i of c once the database shows it holding a claim that running counts
// (running(name, pid) > 0), and, looked at again while it stands still (a claim the database
// shows may be one whose step has not begun in it yet, or one whose outcome is on its way),
// keeps it stopped if it still holds one; else it lets it run and tries again. The second look
// waits for the statements the worker sent before it stopped to end (none of its backends
// active): an outcome on its way may commit after the stop. feed (may be nil) runs at every
// look, to keep work coming.
func catch(t *testing.T, c *crew, i int, what string, running func(name string, pid int) int, feed func()) {
	t.Helper()
	w := c.workers[i]
	deadline := time.Now().Add(2 * time.Minute)
	for {
		eventually(t, time.Until(deadline), w.name+" "+what, func() bool {
			if feed != nil {
				feed()
			}
			return running(w.name, w.pid()) > 0
		})
		w.pause(t)
		if idle(t, c.e, w.app(), false, 5*time.Second) && running(w.name, w.pid()) > 0 {
			return
		}
		w.resume(t)
	}
}

// strike SIGKILLs worker i of c (stopped by catch) and restarts it under its name, or keeps it
// stopped until gone() (its claims, and whatever else the test waits for, taken from it once
// its lease ran out) and then SIGCONTs it: its steps finish and their outcomes arrive late.
// feed (may be nil) runs at every look at gone, to keep work coming.
func strike(t *testing.T, c *crew, i int, kill bool, gone func(name string) bool, feed func()) {
	t.Helper()
	if kill {
		c.kill(i)
		return
	}
	w := c.workers[i]
	c.paused[w.pid()] = true
	c.pauses++
	stoppedAt := time.Now()
	eventually(t, time.Minute, "the others taking "+w.name+"'s claims", func() bool {
		if feed != nil {
			feed()
		}
		return time.Since(stoppedAt) >= fastLease && gone(w.name)
	})
	c.resume(i)
}

// faultPlan returns the workers of an n-worker crew to fault, in order, and whether to kill
// (true) or pause each: kills SIGKILLs and pauses SIGSTOPs in a random order. The pauses all go
// to one worker, the kills to the others: a paused worker must end gracefully, for its report
// (its count of outcomes dropped as stale).
func faultPlan(rng *rand.Rand, n, kills, pauses int) (victims []int, kill []bool) {
	paused := rng.IntN(n)
	kill = make([]bool, kills+pauses)
	for _, k := range rng.Perm(len(kill))[:kills] {
		kill[k] = true
	}
	for _, k := range kill {
		v := paused
		if k {
			v = (paused + 1 + rng.IntN(n-1)) % n
		}
		victims = append(victims, v)
	}
	return victims, kill
}

// named names worker i of a crew prefix<i> in every incarnation (a restart takes over its
// predecessor's worker-id prefix), so that the logs of tests running side by side tell their
// workers apart.
func named(prefix string) func(i, gen int) string {
	return func(i, _ int) string { return fmt.Sprint(prefix, i) }
}

// ownClaims counts the rows executing under claims of the worker named name whose step began in
// its process pid (the step's effect is recorded) and whose claim extra (a condition on the
// instance i, may be "true") picks out.
func ownClaims(t *testing.T, e *env, name string, pid int, extra string) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM {schema}.instances i WHERE status = 'executing' AND locked_by LIKE $1
		AND EXISTS (SELECT 1 FROM {schema}.t_effects f WHERE f.id = i.id AND f.step = i.step AND f.attempt = i.attempt AND f.pid = $2)
		AND `+extra, name+":%", pid)
}

// pausedStale ends every worker of c gracefully and returns the outcomes its paused workers
// dropped as stale (each paused one's own count).
func pausedStale(t *testing.T, c *crew) int {
	t.Helper()
	n := 0
	for _, w := range c.workers {
		pid := w.pid()
		rep := w.term(t)
		if c.paused[pid] {
			t.Logf("%s (pid %d, paused): outcome.stale %d", w.name, pid, rep.stale())
			n += rep.stale()
		}
	}
	return n
}

// judge checks what every test here checks once its n instances have run, from the database:
// no step result applied under a claim the row no longer held (staleApplied), no repeated
// effect but from a faulted process, and the oracle's invariants (verdict, which reports the
// summary line).
func judge(t *testing.T, e *env, c *crew, n int, seed uint64, began time.Time) {
	t.Helper()
	applied := staleApplied(t, e)
	dups := unexplainedDuplicates(t, e, c.faulted, nil)
	verdict(t, e, oracle.Opts{N: n, Effects: true, Counter: true, Paths: fastPaths},
		oracle.Summary{Test: t.Name(), Seed: seed, Instances: n, Kills: c.kills, Pauses: c.pauses,
			Seconds: time.Since(began).Seconds()})
	require.Zero(t, applied, "step results applied under lost claims")
	require.Zero(t, dups, "unexplained duplicate effects")
}

// Steps claimed by their own Insert, under kills and pauses: three worker processes each insert
// solo instances (one step of 30ms) with Insert from two goroutines, so that each is claimed by
// the Insert of the client that runs it, without a pick. A random worker is SIGKILLed (restarted
// at once under its name) or SIGSTOPped, each time once the database shows it running steps
// whose claim its Insert made (the test stops it, looks again, and kills or keeps it stopped
// only if it still is). A paused worker stays stopped until its lease has run out and the others
// have taken all its claims, then goes on: the steps it was running finish and their outcomes
// arrive late. Pass: I1 to I8; no step result applied under a claim the row no longer held
// (staleApplied); no repeated effect but from a faulted process; every pause dropped at least
// one late outcome (outcome.stale); claims made by an Insert were lost to the faults and
// recovered; at least a third of all claims were made by an Insert (most are; a loaded machine
// sends more rows in available: a pick in flight holds the free slots, and a row that went in
// available is due ahead of the next). Kills and pauses: 2 and 1 / 30 and 8.
func TestInsertClaimedStepsUnderKillsAndPauses(t *testing.T) {
	t.Parallel()
	e := fastEnv(t)
	seed, rng := oracle.Seed(t)
	kills, pauses := oracle.Size(2, 30), oracle.Size(1, 8)
	began := time.Now()
	c := newCrew(t, e, 3, named("ins"), e.fastCfg(func(w *workerCfg) { w.Conc, w.Inserters = 4, 2 }))
	insertClaimed := func(name string, pid int) int {
		return ownClaims(t, e, name, pid, `EXISTS (SELECT 1 FROM {schema}.t_outcome_log l
			WHERE l.id = i.id AND l.old_status IS NULL AND l.locked_by = i.locked_by)`)
	}
	victims, kill := faultPlan(rng, len(c.workers), kills, pauses)
	for k, i := range victims {
		catch(t, c, i, "running steps its Insert claimed", insertClaimed, nil)
		strike(t, c, i, kill[k], func(name string) bool { return executingBy(t, e, name) == 0 }, nil)
	}
	inserted := 0
	for _, w := range c.workers {
		inserted += w.stopInserting(t)
	}
	n := e.count(t, `SELECT count(*) FROM {schema}.instances`)
	eventually(t, 2*time.Minute, "every instance done", func() bool { return doneCount(t, e) == n })

	// Claims made by an Insert (the outcome log's insert of a row already executing), and those
	// of them lost (the next transition released the claim).
	var byInsert, claims, lostByInsert int
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT
		  count(*) FILTER (WHERE old_status IS NULL),
		  count(*),
		  count(*) FILTER (WHERE old_status IS NULL AND next_status = 'available')
		FROM (SELECT old_status, new_status, lead(new_status) OVER (PARTITION BY id ORDER BY seq) AS next_status
		      FROM {schema}.t_outcome_log) l
		WHERE new_status = 'executing' AND old_status IS DISTINCT FROM 'executing'`)).Scan(&byInsert, &claims, &lostByInsert))
	stale := pausedStale(t, c)
	t.Logf("%d instances (%d of them by the workers alive at the end); %d of %d claims made by an Insert, %d of those lost to %d kills and %d pauses; %d late outcomes dropped by paused workers",
		n, inserted, byInsert, claims, lostByInsert, c.kills, c.pauses, stale)
	judge(t, e, c, n, seed, began)
	require.Positive(t, lostByInsert, "no claim made by an Insert was lost to the faults")
	require.GreaterOrEqual(t, 3*byInsert, claims, "fewer than a third of the claims were made by an Insert")
	require.GreaterOrEqual(t, stale, c.pauses, "every pause drops at least one late outcome")
}

// Gate leases under kills and pauses: three worker processes (4 slots each) run fast5 instances
// of one gated key, under a gate of limit 120 on one shard: far from its limit, so each runner
// leases a block of its slots (4, growing by 4 while the shard has 16 free, to at most 32) and
// admits its claims against the lease instead of the counter; the limit leaves room for a new
// lease beside what the others lease, so that a restarted or resumed worker leases again. A
// random worker is SIGKILLed (restarted at once) or SIGSTOPped, each time while it holds a live
// lease and runs steps claimed against it; a paused worker stays stopped until the others hold
// all its claims and the reconciler has removed its expired lease, then goes on. A sampler reads, every 5ms in one snapshot, the rows executing
// per key and per shard, and the shard's counter. Pass: in every sample at most 120 executing
// rows of the key and never more in a shard than its counter holds (every execution holds one of
// the counter's slots, leased or not); leases were taken (a trigger logs them) and claims were
// made against them (t_claims); each faulted worker's lease expired and was removed by the
// reconciler; no step result applied under a lost claim; no repeated effect but from a faulted
// process; every pause dropped a late outcome; I1 to I8 (the counters back at 0, no lease left).
// Kills and pauses: 2 and 1 / 20 and 8.
func TestGateLeasesUnderKillsAndPauses(t *testing.T) {
	t.Parallel()
	e := fastEnv(t)
	seed, rng := oracle.Seed(t)
	kills, pauses := oracle.Size(2, 20), oracle.Size(1, 8)
	const limit = 120
	began := time.Now()
	s := e.q("{schema}")
	e.exec(t, `CREATE TABLE {schema}.t_leases (op text NOT NULL, owner text NOT NULL, slots integer, expired boolean,
		  at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE FUNCTION {schema}.t_log_lease() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN
		  IF TG_OP = 'DELETE' THEN
		    INSERT INTO `+s+`.t_leases (op, owner, slots, expired) VALUES ('delete', OLD.owner, OLD.slots, OLD.expires_at < now());
		  ELSIF TG_OP = 'INSERT' OR OLD.slots <> NEW.slots THEN
		    INSERT INTO `+s+`.t_leases (op, owner, slots) VALUES (lower(TG_OP), NEW.owner, NEW.slots);
		  END IF;
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_log_lease AFTER INSERT OR UPDATE OR DELETE ON {schema}.gate_leases FOR EACH ROW
		EXECUTE FUNCTION {schema}.t_log_lease()`)
	topUp := func() {
		if e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available'`) < 30 {
			insertFast(t, e, 60, func(_ int, _ *fastState, o *gendurable.InsertOpts) { o.ConcurrencyKey = "g:hot" })
		}
	}
	topUp()
	var mu sync.Mutex
	maxKey, maxHeld, over := 0, 0, 0
	var overExample string
	stopSampler := sampler(t, e, nil, `SELECT x.key, x.shard::bigint, x.n, coalesce(g.held, 0)::bigint,
		  sum(x.n) OVER (PARTITION BY x.key)::bigint
		FROM (SELECT concurrency_key AS key, concurrency_shard AS shard, count(*) AS n FROM {schema}.instances
		      WHERE status = 'executing' AND concurrency_key IS NOT NULL GROUP BY 1, 2) x
		LEFT JOIN {schema}.gates g ON g.key = x.key AND g.shard = x.shard`, func(v []any) {
		n, held, perKey := int(v[2].(int64)), int(v[3].(int64)), int(v[4].(int64))
		mu.Lock()
		defer mu.Unlock()
		maxKey, maxHeld = max(maxKey, perKey), max(maxHeld, held)
		if v[1] == nil || n > held {
			over++
			overExample = fmt.Sprintf("%v shard %v: %d executing, counter %d", v[0], v[1], n, held)
		}
	})
	c := newCrew(t, e, 3, named("gate"), e.fastCfg(func(w *workerCfg) { w.Gates = map[string][2]int{"g": {limit, 1}} }))
	leased := func(name string, pid int) int {
		if e.count(t, `SELECT count(*) FROM {schema}.gate_leases WHERE owner LIKE $1 AND expires_at > now()`, name+":%") == 0 {
			return 0
		}
		return ownClaims(t, e, name, pid, `EXISTS (SELECT 1 FROM {schema}.t_claims c
			WHERE c.id = i.id AND c.owner = i.locked_by AND c.leased)`)
	}
	victims, kill := faultPlan(rng, len(c.workers), kills, pauses)
	for k, i := range victims {
		catch(t, c, i, "running steps claimed against its gate lease", leased, topUp)
		strike(t, c, i, kill[k], func(name string) bool {
			return executingBy(t, e, name) == 0 &&
				e.count(t, `SELECT count(*) FROM {schema}.gate_leases WHERE owner LIKE $1`, name+":%") == 0
		}, topUp)
	}
	n := e.count(t, `SELECT count(*) FROM {schema}.instances`)
	eventually(t, 2*time.Minute, "every instance done", func() bool { return doneCount(t, e) == n })
	// The live workers end their leases once the key has gone quiet; the reconciler removes the
	// killed ones' once they have expired.
	eventually(t, time.Minute, "the counters back at 0 and every lease gone", func() bool {
		return e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates`) == 0 &&
			e.count(t, `SELECT count(*) FROM {schema}.gate_leases`) == 0
	})
	samples := stopSampler()
	stale := pausedStale(t, c)

	var taken, grown, expired, leasedClaims, claims int
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT
		  (SELECT count(*) FROM {schema}.t_leases WHERE op = 'insert'),
		  (SELECT count(*) FROM {schema}.t_leases WHERE op = 'update'),
		  (SELECT count(*) FROM {schema}.t_leases WHERE op = 'delete' AND expired),
		  (SELECT count(*) FROM {schema}.t_claims WHERE leased),
		  (SELECT count(*) FROM {schema}.t_claims)`)).Scan(&taken, &grown, &expired, &leasedClaims, &claims))
	mu.Lock() // (the sampler has stopped)
	mostKey, mostHeld, overs, example := maxKey, maxHeld, over, overExample
	mu.Unlock()
	t.Logf("%d instances; %d leases taken, %d grown, %d removed expired; %d of %d claims against a lease; %d kills, %d pauses, %d late outcomes dropped by paused workers; %d samples: at most %d executing of the key (limit %d), counter at most %d",
		n, taken, grown, expired, leasedClaims, claims, c.kills, c.pauses, stale, samples, mostKey, limit, mostHeld)
	judge(t, e, c, n, seed, began)
	require.Zero(t, overs, "a shard ran more executions than its counter holds (%s)", example)
	require.LessOrEqual(t, mostKey, limit, "more executions of the key than its gate's limit")
	require.Greater(t, samples, 100)
	require.Positive(t, taken, "no gate lease was taken")
	require.Positive(t, leasedClaims, "no claim was made against a gate lease")
	require.GreaterOrEqual(t, expired, c.kills+c.pauses, "every faulted worker's lease expired and was removed by the reconciler")
	require.GreaterOrEqual(t, stale, c.pauses, "every pause drops at least one late outcome")
}

// Rate lanes under kills and pauses: three worker processes (4 slots each, steps of 30ms: a few
// hundred steps a second between them) run fast5 instances whose every step is under one bucket
// of 100 tokens a second, burst 10 (a tenth of the rows weigh 2). The workers start before there
// is work, with a fourth of 32 slots beside them until its first grant: a pick that asks for more
// rows than the burst holds takes the whole bucket, so the bound is reached at least once however
// loaded the machine (the crew's picks of 4 rows empty a full bucket only when three of them come
// within a few milliseconds of each other, which a busy machine does not promise; a run whose
// faults then kept demand below the rate never reached it). A runner whose last batch was full
// and all of the limit takes the next on a rate lane: all of the lane's rows in its window in one debit,
// or none. A random worker is SIGKILLed (restarted at once) or SIGSTOPped while it runs steps a
// lane granted (t_claims tells lane picks by their statement); a paused worker stays stopped
// until the others hold all its claims (their grants are spent: the reclaimed steps are charged
// again). Pass: from the grants (every claim of a limited row, stamped with its pick's transaction
// time and weighed), every window W from one grant to another holds at most burst + rate × |W|
// tokens, computed exactly in integer microseconds from the first grant; the bound is reached
// (some window comes within three tokens of it: the bucket ran dry, so an over-grant would
// show); lanes granted claims; no step result applied under a lost claim; no repeated effect but
// from a faulted process; every pause dropped a late outcome; I1 to I8. Kills and pauses: 2 and
// 1 / 20 and 8.
func TestRateLanesUnderKillsAndPauses(t *testing.T) {
	t.Parallel()
	e := fastEnv(t)
	seed, rng := oracle.Seed(t)
	kills, pauses := oracle.Size(2, 20), oracle.Size(1, 8)
	const allowed, periodMS, burst = 100, 1000, 10
	began := time.Now()
	topUp := func() {
		if e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available'`) < 15 {
			insertFast(t, e, 20, func(i int, st *fastState, o *gendurable.InsertOpts) {
				st.Limit, st.Weight = "api:t", 1+rng.IntN(10)/9
				o.RateLimit, o.Weight = st.Limit, st.Weight
			})
		}
	}
	// The workers start before there is work, and the drainer beside them: its picks ask for
	// more rows than the burst (28 of its 32 slots: a pick without a backlog leaves 4 to the
	// wakes of signals), so its first grant empties the bucket, however loaded the machine. GC
	// runs (every 100 ms); it prunes a bucket only once it has been full for a minute, so not
	// this one.
	rates := func(w *workerCfg) { w.Rates = map[string][3]int{"api": {allowed, periodMS, burst}} }
	c := newCrew(t, e, 3, named("rate"), e.fastCfg(rates))
	drain := startWorker(t, e.fastCfg(rates, func(w *workerCfg) { w.Name, w.Conc = "ratedrain", 32 }))
	// Enough rows that the drainer's first pick finds more than the bucket holds, whatever the
	// crew's 12 slots took before it; topped up while it has not picked.
	insertFast(t, e, 30, func(i int, st *fastState, o *gendurable.InsertOpts) {
		st.Limit, st.Weight = "api:t", 1+rng.IntN(10)/9
		o.RateLimit, o.Weight = st.Limit, st.Weight
	})
	eventually(t, time.Minute, "the drainer's first grant", func() bool {
		topUp()
		return e.count(t, `SELECT count(*) FROM {schema}.t_claims WHERE owner LIKE 'ratedrain:%'`) > 0
	})
	drain.term(t)
	lane := func(name string, pid int) int {
		return ownClaims(t, e, name, pid, `EXISTS (SELECT 1 FROM {schema}.t_claims c
			WHERE c.id = i.id AND c.owner = i.locked_by AND c.lane)`)
	}
	victims, kill := faultPlan(rng, len(c.workers), kills, pauses)
	for k, i := range victims {
		catch(t, c, i, "running steps a rate lane granted", lane, topUp)
		strike(t, c, i, kill[k], func(name string) bool { return executingBy(t, e, name) == 0 }, topUp)
	}
	n := e.count(t, `SELECT count(*) FROM {schema}.instances`)
	eventually(t, 3*time.Minute, "every instance done", func() bool { return doneCount(t, e) == n })
	stale := pausedStale(t, c)

	// The grants, in microseconds since the first (the database's resolution, so that the bound
	// is computed exactly: rate × time in float seconds since the epoch carries a rounding as
	// large as the excess it must find), and their weights.
	rows, err := e.side.Query(context.Background(), e.q(`SELECT (extract(epoch FROM tx_at - min(tx_at) OVER ()) * 1000000)::bigint,
		  weight, lane FROM {schema}.t_claims WHERE rkey IS NOT NULL ORDER BY tx_at`))
	require.NoError(t, err)
	var at, w []int64
	lanes := 0
	for rows.Next() {
		var x, wt int64
		var l bool
		require.NoError(t, rows.Scan(&x, &wt, &l))
		at, w = append(at, x), append(w, wt)
		if l {
			lanes++
		}
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, at)
	judge(t, e, c, n, seed, began)
	// For every window [at[i], at[j]]: w[i] + … + w[j] ≤ burst + allowed × (at[j] - at[i]) / P,
	// P the period in microseconds; with S the running sum of the weights, in integers:
	// (S[j] - burst)·P - allowed·at[j] ≤ S[i-1]·P - allowed·at[i]. The worst window ending at j
	// starts where the right side is smallest: a running minimum.
	p := int64(periodMS) * 1000
	least, worst := int64(math.MaxInt64), int64(math.MinInt64)
	var sum int64
	for j := range at {
		least = min(least, sum*p-int64(allowed)*at[j])
		sum += w[j]
		excess := (sum-burst)*p - int64(allowed)*at[j] - least
		worst = max(worst, excess)
		require.LessOrEqual(t, excess, int64(0), "grants up to %d overdraw the bucket by %.6f tokens", j, float64(excess)/float64(p))
	}
	span := float64(at[len(at)-1]) / 1e6
	t.Logf("%d instances; %d grants (%d tokens) in %.2fs, %d of them on a lane; worst window %.3f tokens under the bound; %d kills, %d pauses, %d late outcomes dropped by paused workers",
		n, len(at), sum, span, lanes, float64(-worst)/float64(p), c.kills, c.pauses, stale)
	require.GreaterOrEqual(t, worst, -3*p, "no window came within three tokens of the bound: the bucket never ran dry")
	require.Positive(t, lanes, "no claim was granted on a rate lane")
	require.GreaterOrEqual(t, stale, c.pauses, "every pause drops at least one late outcome")
}
