// Package engine is gendurable's runtime: per-queue schedulers that claim batches, the executor
// that runs one claimed step, the committer that applies outcomes in groups, the heartbeat that
// keeps leases alive, and the inline drain the test kit uses. It works on type-erased machines
// (MachineDef); the root package gives it typed ones.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Pool is the database the engine runs on (a *pgxpool.Pool).
type Pool interface {
	store.DB
}

// QueueConfig configures one queue's workers on this client.
type QueueConfig struct {
	Concurrency  int
	PollInterval time.Duration
}

// Config is the engine's validated configuration; the root package fills every field.
type Config struct {
	Name           string
	Machines       map[string]*MachineDef
	Queues         map[string]QueueConfig
	Lease          time.Duration
	Heartbeat      time.Duration
	ReaperInterval time.Duration // 0: this node runs no reaper
	// GCInterval is the time between GC sweeps (0: this node runs no GC); GCRetention how long a
	// finished instance is kept; GCBatch how many one statement deletes.
	GCInterval  time.Duration
	GCRetention time.Duration
	GCBatch     int
	MaxPayload  int
	MaxChildren int
	// Gates is the concurrency-gate configuration (nil or empty: every key is K = 1).
	Gates *store.Gates
	// Rates is the rate-limit configuration (nil or empty: none).
	Rates  *store.Rates
	Logger *slog.Logger
	Hooks  []func(durabletype.Event)
	// Committers is how many outcome statements may be in flight at once: they take turns, and
	// a second is sent beside the first only while that one stalls (see committer).
	Committers int
	// MaxCommitBatch caps the outcomes one statement applies.
	MaxCommitBatch int
	// OpenPoke opens the poke transport at Start (nil: local pokes only).
	OpenPoke OpenPoke
	// AwaitTick is how often the await watcher probes for the settled instances its waiters
	// wait on.
	AwaitTick time.Duration
}

// StatementTimeout bounds each statement of the engine's background work whose delay holds up
// claims (a pick, an outcome commit, a startup reclaim, a reaper sweep): a lease, at least 5s and
// at most 30s. A statement stuck longer than a lease is on a dead or half-open connection (its
// claims are presumed lost by then anyway): it fails, its connection is closed, and the work is
// retried on a fresh one, so a hung connection never holds a worker much past its leases. The
// floor keeps healthy statements of a loaded database from being cut with short leases.
func StatementTimeout(lease time.Duration) time.Duration {
	return min(max(lease, 5*time.Second), 30*time.Second)
}

// unknownDelay is how long a row whose machine or step this node does not know is put back
// before any node may claim it again: long enough that a node lacking the code does not spin
// on it, short enough that a node that has it (after a deploy) is not kept waiting.
const unknownDelay = 5 * time.Second

// Engine is one client's runtime.
type Engine struct {
	cfg    Config
	pool   Pool
	store  *store.Store
	log    *slog.Logger
	events *dispatcher
	host   string
	uniq   string

	mu      sync.Mutex
	flights map[int64]*flight
	running bool
	stopped bool

	// inFlight counts steps executing now (dispatched, outcome not yet handed off).
	inFlight atomic.Int64

	runners   map[string]*runner // one per configured queue; written only by New
	poker     atomic.Pointer[PokeConn]
	awaits    *awaiter
	committer *committer
	lastBeat  time.Time

	baseCtx    context.Context
	baseCancel context.CancelCauseFunc
	stepParent context.Context // the start context's values, never cancelled: steps cancel one by one
	steps      sync.WaitGroup  // step goroutines
	sends      sync.WaitGroup  // outcomes being handed to the committer
	loops      sync.WaitGroup  // schedulers
	bg         sync.WaitGroup  // heartbeat, reaper
	bgStop     chan struct{}
}

// flight is a claim this client holds: from the pick until its outcome commits (or is dropped).
type flight struct {
	id    int64
	owner string
	// ckey and shard are the concurrency key and gate shard the claim held (the outcome
	// credits the shard; any outcome of a keyed row may let another row of its key run).
	ckey  *string
	shard *int16
	// lease is the gate lease the claim took its slot from (nil: none, or settled); gaveBack
	// says its outcome was sent to give the slot back to it rather than credit the counter.
	lease    atomic.Pointer[gateLease]
	gaveBack bool
	queue    string
	machine  string
	step     string
	attempt  int
	started  time.Time
	cancel   context.CancelCauseFunc
	state    flightState
}

type flightState int

const (
	flightRunning   flightState = iota // the step is running
	flightHanded                       // the outcome is with the committer
	flightAbandoned                    // released at shutdown; a late outcome is dropped
)

// New builds an engine. It does nothing until Start.
func New(pool Pool, st *store.Store, cfg Config) *Engine {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &Engine{
		cfg:     cfg,
		pool:    pool,
		store:   st,
		log:     cfg.Logger,
		host:    host,
		uniq:    hex.EncodeToString(b[:]),
		flights: map[int64]*flight{},
		runners: map[string]*runner{},
	}
	e.events = newDispatcher(cfg.Name, cfg.Hooks, cfg.Logger)
	e.awaits = newAwaiter(e)
	// The runners exist from the start (idle until Start), so that the map is never written
	// while an insert reads it to wake a queue.
	for name, qc := range cfg.Queues {
		e.runners[name] = newRunner(e, name, qc)
	}
	return e
}

// Store returns the engine's statements.
func (e *Engine) Store() *store.Store { return e.store }

// Lease is how long a claim stays valid without a heartbeat.
func (e *Engine) Lease() time.Duration { return e.cfg.Lease }

// Machine returns the registered machine of that name, or nil.
func (e *Engine) Machine(name string) *MachineDef { return e.cfg.Machines[name] }

// Config returns the engine's configuration.
func (e *Engine) Config() *Config { return &e.cfg }

// Emit sends an event to the hooks.
func (e *Engine) Emit(ev durabletype.Event) { e.events.emit(ev) }

// workerPrefix is the part of a worker id shared by every incarnation of this client's
// scheduler of queue on this host: <client>:<queue>@<host>-.
func (e *Engine) workerPrefix(queue string) string {
	return e.cfg.Name + ":" + queue + "@" + e.host + "-"
}

// Start reclaims what dead predecessors left, then starts the schedulers, the committer, the
// heartbeat and (unless disabled on this node) the reaper and GC. A component this node does not
// run logs one line.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	if e.running || e.stopped {
		e.mu.Unlock()
		return errors.New("gendurable: client already started (a client starts once)")
	}
	e.running = true
	e.mu.Unlock()

	e.events.start()
	e.stepParent = context.WithoutCancel(ctx)
	e.baseCtx, e.baseCancel = context.WithCancelCause(e.stepParent)
	e.bgStop = make(chan struct{})
	e.lastBeat = time.Now()
	e.committer = newCommitter(e)
	e.committer.start()

	for name := range e.runners {
		if err := e.reclaim(ctx, name); err != nil {
			e.abortStart()
			return err
		}
	}
	if e.cfg.OpenPoke != nil {
		pc, err := e.cfg.OpenPoke(ctx, e.Origin(), e.queueNames(), e.Wake)
		if err != nil {
			e.abortStart()
			return fmt.Errorf("gendurable: start: open the poke transport: %w", err)
		}
		if pc != nil {
			e.poker.Store(&pc)
		}
	}
	for _, r := range e.runners {
		r.startWorkers()
		e.loops.Add(1)
		go r.loop()
	}
	e.bg.Add(1)
	go func() { defer e.bg.Done(); e.awaits.watch(e.bgStop) }()
	if len(e.cfg.Queues) == 0 {
		e.log.Info("gendurable: no queues configured: this node runs no workers", "client", e.cfg.Name)
	}
	e.bg.Add(1)
	go e.heartbeatLoop()
	if e.cfg.ReaperInterval > 0 {
		reaper := &maintenance.Reaper{
			Store: e.store, DB: e.pool, Interval: e.cfg.ReaperInterval, Timeout: StatementTimeout(e.cfg.Lease), Logger: e.log,
			Emit: e.Emit, Wake: e.Wake, Rates: e.cfg.Rates, ReportStalls: len(e.cfg.Queues) > 0,
		}
		e.bg.Add(1)
		go func() { defer e.bg.Done(); reaper.Run(e.bgStop) }()
	} else {
		e.log.Info("gendurable: reaper disabled on this node", "client", e.cfg.Name)
	}
	if e.cfg.GCInterval > 0 {
		gc := &maintenance.GC{
			Store: e.store, DB: e.pool, Interval: e.cfg.GCInterval, Retention: e.cfg.GCRetention,
			Batch: e.cfg.GCBatch, Logger: e.log, Emit: e.Emit, Gates: e.cfg.Gates, Rates: e.cfg.Rates,
		}
		e.bg.Add(1)
		go func() { defer e.bg.Done(); gc.Run(e.bgStop) }()
	} else {
		e.log.Info("gendurable: GC disabled on this node", "client", e.cfg.Name)
	}
	return nil
}

func (e *Engine) abortStart() {
	e.committer.stop()
	e.baseCancel(durabletype.ErrClientStopped)
	e.events.stop()
	e.mu.Lock()
	e.running, e.stopped = false, true
	e.mu.Unlock()
}

// reclaim releases the claims a dead predecessor of this scheduler left behind: same client,
// queue and host, and a lease that has not been extended for staleAfter. A live process with the
// same prefix (identical host names) keeps its leases fresher than that, so its claims are never
// touched.
func (e *Engine) reclaim(ctx context.Context, queue string) error {
	slack := e.cfg.Lease - e.staleAfter()
	total := 0
	for {
		sctx, cancel := context.WithTimeout(ctx, StatementTimeout(e.cfg.Lease))
		rows, _, err := e.store.ReleaseExpired(sctx, e.pool, 1000, e.workerPrefix(queue), slack)
		cancel()
		if err != nil {
			return fmt.Errorf("gendurable: startup reclaim of queue %q: %w", queue, err)
		}
		total += len(rows)
		if len(rows) < 1000 {
			break
		}
	}
	if total > 0 {
		e.log.Info("gendurable: reclaimed claims of a dead predecessor", "client", e.cfg.Name, "queue", queue, "rows", total)
		e.Emit(durabletype.Event{Name: durabletype.EventSchedulerReclaimed, Queue: queue, Count: total})
	}
	return nil
}

// FireAwaitDeadlines wakes the parked instances whose await deadline is within horizon (the test
// kit fires them all; the reaper fires those due).
func (e *Engine) FireAwaitDeadlines(ctx context.Context, db store.DB, horizon time.Duration) (int, error) {
	return maintenance.FireAwaitDeadlines(ctx, e.store, db, horizon, e.Emit, e.Wake)
}

// staleAfter is how long since its last heartbeat a claim must be before startup reclaim takes
// it: three heartbeat intervals or half the lease, whichever is longer, so that a live process
// whose heartbeat runs late under load keeps its claims.
func (e *Engine) staleAfter() time.Duration {
	return max(3*e.cfg.Heartbeat, e.cfg.Lease/2)
}

// Wake nudges the local scheduler of queue, if this client runs it.
func (e *Engine) Wake(queue string) {
	if r, ok := e.runners[queue]; ok {
		r.poke()
	}
}

// Running reports whether Start succeeded and Stop has not begun.
func (e *Engine) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running && !e.stopped
}

// Stop drains: the schedulers stop claiming, running steps get until ctx is done to finish
// (their outcomes commit), then the rest have their contexts cancelled and their claims handed
// back. Outcomes that arrive after that are dropped as stale.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	if !e.running || e.stopped {
		e.mu.Unlock()
		return nil
	}
	e.stopped = true
	e.mu.Unlock()

	for _, r := range e.runners {
		close(r.stop)
	}
	e.loops.Wait()
	for _, r := range e.runners {
		r.closeWork() // the executor goroutines finish what they hold, then exit
	}

	done := make(chan struct{})
	go func() { e.steps.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = e.abandon()
	}
	e.sends.Wait()
	e.committer.stop()
	for _, r := range e.runners {
		// Every outcome is settled: a lease gives its unused slots back.
		if gl := r.lease.Load(); gl != nil {
			r.endLease(gl, true)
		}
	}
	close(e.bgStop)
	e.bg.Wait()
	if p := e.poker.Swap(nil); p != nil {
		if cerr := (*p).Close(); cerr != nil {
			e.log.Warn("gendurable: closing the poke transport failed", "client", e.cfg.Name, "error", cerr)
		}
	}
	e.baseCancel(durabletype.ErrClientStopped)
	e.events.stop()
	return err
}

// abandon cancels the steps still running at the end of the drain and hands their claims back.
func (e *Engine) abandon() error {
	e.mu.Lock()
	var rows []store.OutcomeRow
	for _, f := range e.flights {
		if f.state != flightRunning {
			continue
		}
		f.state = flightAbandoned
		f.cancel(durabletype.ErrClientStopped)
		// The hand-back credits the counter, leased slot or not.
		if gl := f.lease.Swap(nil); gl != nil {
			gl.settle(false)
		}
		rows = append(rows, store.OutcomeRow{ID: f.id, Owner: f.owner, Kind: store.KindReleased,
			CreditKey: f.ckey, CreditShard: f.shard})
		delete(e.flights, f.id)
	}
	e.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := e.store.ApplyOutcomes(ctx, e.pool, rows); err != nil {
		e.log.Error("gendurable: could not hand back claims at shutdown; they will be reclaimed when their lease expires",
			"client", e.cfg.Name, "claims", len(rows), "error", err)
		return fmt.Errorf("gendurable: stop: release %d claims: %w", len(rows), err)
	}
	e.log.Info("gendurable: stop deadline reached; running steps cancelled and their claims released",
		"client", e.cfg.Name, "claims", len(rows))
	return nil
}

// track registers a claim as in flight, with the context its step runs under.
func (e *Engine) track(queue, owner string, c *store.Claimed, gl *gateLease) (*flight, context.Context) {
	ctx, cancel := context.WithCancelCause(e.stepParent)
	f := &flight{id: c.ID, owner: owner, queue: queue, machine: c.Machine, step: c.Step,
		attempt: c.Attempt, started: time.Now(), cancel: cancel, ckey: c.ConcurrencyKey, shard: c.ConcurrencyShard}
	if gl != nil {
		f.lease.Store(gl)
	}
	e.mu.Lock()
	e.flights[c.ID] = f
	e.mu.Unlock()
	return f, ctx
}

// handOff moves a flight from running to handed, unless it was abandoned.
func (e *Engine) handOff(f *flight) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f.state == flightAbandoned {
		return false
	}
	f.state = flightHanded
	e.sends.Add(1)
	return true
}

// settle forgets a flight whose outcome committed or was dropped.
func (e *Engine) settle(f *flight) {
	e.mu.Lock()
	if cur, ok := e.flights[f.id]; ok && cur == f {
		delete(e.flights, f.id)
	}
	e.mu.Unlock()
	f.cancel(nil)
}

// heartbeatLoop extends the leases of every claim in flight, once per interval, in one
// statement; it cancels the steps whose claims are gone. If it cannot reach the database for a
// whole lease, every running step is cancelled: its claim is presumed lost.
func (e *Engine) heartbeatLoop() {
	defer e.bg.Done()
	t := time.NewTicker(e.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-e.bgStop:
			return
		case <-t.C:
			e.beat()
		}
	}
}

func (e *Engine) beat() {
	// The gate leases after the claims: a slow renewal must not hold up the claims' beat.
	defer e.renewLeases()
	e.mu.Lock()
	ids := make([]int64, 0, len(e.flights))
	owners := make([]string, 0, len(e.flights))
	for _, f := range e.flights {
		ids = append(ids, f.id)
		owners = append(owners, f.owner)
	}
	e.mu.Unlock()
	if len(ids) == 0 {
		e.lastBeat = time.Now()
		return
	}
	if fault.Enabled {
		// A beat about to extend the leases: a hook holding it here is a stalled heartbeat;
		// an error is a failed one.
		if err := fault.PointFor(fault.Heartbeat, e.cfg.Name); err != nil {
			e.log.Warn("gendurable: heartbeat failed", "client", e.cfg.Name, "claims", len(ids), "error", err)
			if time.Since(e.lastBeat) > e.cfg.Lease {
				e.cancelAll(ids, owners)
			}
			return
		}
	}
	ctx, cancel := context.WithTimeout(e.baseCtx, e.cfg.Heartbeat)
	began := time.Now()
	lost, err := e.store.Heartbeat(ctx, e.pool, ids, owners, e.cfg.Lease)
	cancel()
	if err != nil {
		e.log.Warn("gendurable: heartbeat failed", "client", e.cfg.Name, "claims", len(ids), "error", err)
		if time.Since(e.lastBeat) > e.cfg.Lease {
			e.cancelAll(ids, owners)
		}
		return
	}
	e.lastBeat = time.Now()
	e.Emit(durabletype.Event{Name: durabletype.EventHeartbeatBeat, Count: len(ids), Duration: e.lastBeat.Sub(began)})
	if len(lost) > 0 {
		// The statement names lost claims by row id; the claim is the one this beat sent for
		// that id (one per id: flights holds one claim per row).
		sent := make(map[int64]string, len(ids))
		for i, id := range ids {
			sent[id] = owners[i]
		}
		lostOwners := make([]string, len(lost))
		for i, id := range lost {
			lostOwners[i] = sent[id]
		}
		e.cancelAll(lost, lostOwners)
	}
}

// cancelAll cancels the running steps of the given claims (ids[i] under token owners[i]). A
// claim is matched by its token, not by its row alone: by the time a beat reports a claim lost,
// this client may hold a new claim of the same row (the reaper released the old one, and this
// client's scheduler picked the row again while the old claim's late outcome was still on its
// way), and that new claim is not lost.
func (e *Engine) cancelAll(ids []int64, owners []string) {
	e.mu.Lock()
	n := 0
	for i, id := range ids {
		if f, ok := e.flights[id]; ok && f.owner == owners[i] && f.state == flightRunning {
			f.cancel(durabletype.ErrLeaseLost)
			n++
		}
	}
	e.mu.Unlock()
	if n > 0 {
		e.log.Warn("gendurable: lost claims; their steps are cancelled and their outcomes will be dropped",
			"client", e.cfg.Name, "claims", n)
		e.Emit(durabletype.Event{Name: durabletype.EventHeartbeatLost, Count: n})
	}
}

// beginner returns a function that begins a transaction on db.
func beginner(db store.DB) func(ctx context.Context) (pgx.Tx, error) {
	return func(ctx context.Context) (pgx.Tx, error) { return db.Begin(ctx) }
}
