// Package engine is gendurable's runtime. It works on type-erased machines (MachineDef); the root
// package gives it typed ones, and the store (internal/store) runs every statement. Each file has
// one role:
//
//   - engine.go: a client's lifecycle: Start (startup reclaim, then every loop) and Stop (drain).
//   - scheduler.go: per queue, the pick loop (demand, batches, idle backoff, pokes) and the
//     executor goroutines it feeds; an Insert that claims its own row joins here too.
//   - executor.go: one claimed step: run it, turn what it returns into one store.Outcome fenced
//     by the claim, hand it to the committer, and report what follows its commit.
//   - upgrade.go: machine versions: whether a claimed row runs as it stands, is brought forward
//     to this client's version of its machine, or is handed back; bulk upgrades.
//   - nodes.go: the node registry: this client's row saying what it runs, and who runs what.
//   - committer.go: group commit: the outcomes that finish close together, in one statement.
//   - flight.go: the claims this client holds, from the pick until their outcome is settled.
//   - heartbeat.go: the leases' upkeep: every claim's lease and every gate lease, one statement
//     each per interval.
//   - lease.go: gate leases and rate lanes, the state behind the scheduler's lean picks.
//   - await.go: the await bridge behind Client.Await.
//   - drain.go: the test kit's inline drain, through the same pick, executor and outcome.
//   - txwatch.go: the commit watcher, which starts an InsertTx's rows once the caller commits.
//   - machine.go (MachineDef, Call), poke.go (transports), events.go (hooks), ops.go.
//
// docs/architecture.md follows one row through these files.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/spell"
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
	// Prefetch is how many claimed rows may wait in the client beyond its Concurrency executors.
	Prefetch int
}

// Config is the engine's validated configuration; the root package fills every field.
type Config struct {
	Name           string
	Machines       map[string]*MachineDef
	Queues         map[string]QueueConfig
	Lease          time.Duration
	Heartbeat      time.Duration
	ReaperInterval time.Duration // 0: this node runs no reaper
	// MaxRecoveries is how many lost claims of one step a release forgives (the reaper's and the
	// startup reclaim's) before it fails the instance.
	MaxRecoveries int
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
	Rates *store.Rates
	// Fair are the fairness weights (nil: every key weighs 1).
	Fair   *store.FairWeights
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
	// CheckSchema says whether this library runs against a schema at version with readers (nil:
	// not checked); the registry's refreshes read them, so that a migration that leaves a
	// running client's schema behind is logged as such.
	CheckSchema func(version, readers int) error
	// NodeRefresh is how often the registry row is refreshed (0: NodeRefresh).
	NodeRefresh time.Duration
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

// FairWeight returns the weight the configuration gives a fairness key.
func (e *Engine) FairWeight(key string) float64 { return e.cfg.Fair.Of(key) }

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

	runners map[string]*runner // one per configured queue; written only by New
	// fairOrder holds, per queue picked, whether it is picked with the fair scan (*atomic.Bool;
	// see pickOnce).
	fairOrder sync.Map
	versions  *store.Versions // the machines registered at a version above 1 (the picks claim up to it)
	// machineNames and machineVersions are every registered machine and its version (a signal's
	// claim runs only these); workedQueues the queues this client works, sorted.
	machineNames    []string
	machineVersions []int32
	workedQueues    []string
	upgrading       atomic.Bool // a bulk-upgrade request is being worked (serveUpgrades)
	poker           atomic.Pointer[PokeConn]
	awaits          *awaiter
	commits         *commitWatch // rows of InsertTx waiting for their transaction's commit
	// firer fires due schedules (nodes that run the reaper); nil elsewhere.
	firer *maintenance.Firer
	// retentionsSet says the machines' retentions were recorded (by register at Start, else by
	// the registry loop, which owns it once started).
	retentionsSet bool
	committer     *committer
	lastBeat      time.Time
	// spells keep the logs of the background loops' repeating failures short: one per loop
	// (the queues' picks have theirs in their runners, each outcome batch its own).
	spells struct {
		beat, leases, registry, retentions, pauses, upgrades spell.Log
		awaitTicks, awaitHot                                 spell.Log // the await probes of every waiter, and of the pushed ids
	}
	// beatConn is the heartbeat's own connection (heartbeatLoop's alone; nil until dialled);
	// beatOnPool says it was refused a statement, and the beats go through the pool.
	beatConn      *pgx.Conn
	beatDialing   chan *pgx.Conn // a dial in flight, its connection (nil: it failed) when done
	beatDialAfter time.Time      // no dial before then
	beatOnPool    bool
	// paused is what this node last read of the pauses table (nil before Start's read).
	paused atomic.Pointer[pauseSet]

	baseCtx    context.Context
	baseCancel context.CancelCauseFunc
	stepParent context.Context // the start context's values, never cancelled: steps cancel one by one
	steps      sync.WaitGroup  // step goroutines
	sends      sync.WaitGroup  // outcomes being handed to the committer
	loops      sync.WaitGroup  // schedulers
	bg         sync.WaitGroup  // heartbeat, reaper
	bgStop     chan struct{}
	// bgCtx is cancelled as Stop stops the background loops: a heartbeat still waiting then (for
	// a connection, say) has nothing left to extend.
	bgCtx    context.Context
	bgCancel context.CancelFunc
}

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
	e.versions = &store.Versions{}
	for _, name := range slices.Sorted(maps.Keys(cfg.Machines)) {
		e.machineNames = append(e.machineNames, name)
		e.machineVersions = append(e.machineVersions, int32(max(1, cfg.Machines[name].Version)))
		if v := cfg.Machines[name].Version; v > 1 {
			e.versions.Names = append(e.versions.Names, name)
			e.versions.Versions = append(e.versions.Versions, int32(v))
		}
	}
	e.awaits = newAwaiter(e)
	e.commits = newCommitWatch(e)
	if cfg.ReaperInterval > 0 {
		e.firer = maintenance.NewFirer()
	}
	// The runners exist from the start (idle until Start), so that the map is never written
	// while an insert reads it to wake a queue.
	for name, qc := range cfg.Queues {
		e.runners[name] = newRunner(e, name, qc)
	}
	e.workedQueues = slices.Sorted(maps.Keys(e.runners))
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
	e.bgCtx, e.bgCancel = context.WithCancel(e.baseCtx)
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
	if err := e.register(ctx); err != nil {
		e.abortStart()
		return err
	}
	if err := e.loadPauses(ctx); err != nil {
		e.abortStart()
		return err
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
	if len(e.runners) > 0 {
		e.bg.Add(1)
		go func() { defer e.bg.Done(); e.commits.run(e.bgCtx, e.bgStop) }()
	}
	if len(e.cfg.Queues) == 0 {
		e.log.Info("gendurable: no queues configured: this node runs no workers", "client", e.cfg.Name)
	}
	e.bg.Add(1)
	go e.heartbeatLoop()
	e.bg.Add(1)
	go e.registryLoop()
	if len(e.runners) > 0 {
		e.bg.Add(1)
		go e.pauseLoop()
	}
	if e.cfg.ReaperInterval > 0 {
		reaper := &maintenance.Reaper{
			Store: e.store, DB: e.pool, Interval: e.cfg.ReaperInterval, Timeout: StatementTimeout(e.cfg.Lease), Logger: e.log,
			Emit: e.Emit, Wake: e.Wake, Rates: e.cfg.Rates, ReportStalls: len(e.cfg.Queues) > 0, MaxRecoveries: e.cfg.MaxRecoveries,
		}
		e.bg.Add(1)
		go func() { defer e.bg.Done(); reaper.Run(e.bgStop) }()
	} else {
		e.log.Info("gendurable: reaper disabled on this node", "client", e.cfg.Name)
	}
	if e.firer != nil {
		e.firer.Store, e.firer.DB, e.firer.Logger, e.firer.Emit, e.firer.Poke = e.store, e.pool, e.log, e.Emit, e.Poke
		e.firer.Cancelled = e.Cancelled
		e.firer.Timeout = StatementTimeout(e.cfg.Lease)
		e.bg.Add(1)
		go func() { defer e.bg.Done(); e.firer.Run(e.bgStop) }()
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
	// A start that failed after registering leaves no row saying this node runs.
	ctx, cancel := context.WithTimeout(context.Background(), StatementTimeout(e.cfg.Lease))
	_ = e.store.DeleteNode(ctx, e.pool, e.Origin())
	cancel()
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
		var rows []store.Released
		err := e.startTry(ctx, func(ctx context.Context) (err error) {
			rows, _, err = e.store.ReleaseExpired(ctx, e.pool, 1000, e.workerPrefix(queue), slack, e.cfg.MaxRecoveries)
			return err
		})
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

// startTry runs one of Start's statements (fn, under a statement deadline of its own) and runs
// it again while it fails in a way worth retrying (store.Retryable: a lost or refused connection,
// a server starting up or shutting down, a statement the server cancelled or that gave up on a
// lock, a deadline of its own) for up to two statement deadlines in all, backing off from 50ms to
// 1s: a database busy or briefly locked does not fail Start, one that stays out of reach does.
// A refused login or a database that does not exist fails at once, as does ctx's end.
func (e *Engine) startTry(ctx context.Context, fn func(ctx context.Context) error) error {
	until := time.Now().Add(2 * StatementTimeout(e.cfg.Lease))
	backoff := 50 * time.Millisecond
	for {
		sctx, cancel := context.WithTimeout(ctx, StatementTimeout(e.cfg.Lease))
		err := fn(sctx)
		cancel()
		if err == nil || ctx.Err() != nil || !store.Retryable(err) || store.Misconfigured(err) || time.Now().Add(backoff).After(until) {
			return err
		}
		e.log.Warn("gendurable: start: a statement failed; trying again", "client", e.cfg.Name, "error", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
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

// QuietFor is how long the idle runner of queue will not pick unless woken (0 while a pick is
// in flight, due, or the runner is not idle): tests that need an Insert to find no pick in
// flight wait for it.
func (e *Engine) QuietFor(queue string) time.Duration {
	r, ok := e.runners[queue]
	if !ok {
		return 0
	}
	at := r.quietUntil.Load()
	if at == 0 {
		return 0
	}
	return max(time.Until(time.Unix(0, at)), 0)
}

// KickSchedules makes this node's schedule firer look for due schedules now (a schedule was
// set, resumed or declared here). Other nodes see the change within a second.
func (e *Engine) KickSchedules() {
	if e.firer != nil {
		e.firer.Kick()
	}
}

// Running reports whether Start succeeded and Stop has not begun.
func (e *Engine) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running && !e.stopped
}

// Stop drains: the schedulers stop claiming, prefetched rows not yet begun are handed back,
// running steps get until ctx is done to finish (their outcomes commit), then the rest have
// their contexts cancelled and their claims handed back. Outcomes that arrive after that are
// dropped as stale.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	if !e.running || e.stopped {
		e.mu.Unlock()
		return nil
	}
	e.stopped = true
	e.mu.Unlock()

	for _, r := range e.runners {
		r.beginStop()
	}
	e.loops.Wait()
	var waitErr error
	for _, r := range e.runners {
		waitErr = errors.Join(waitErr, r.handBackWaiting())
	}
	e.waitInserts(ctx)
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
	err = errors.Join(waitErr, err)
	e.sends.Wait()
	e.committer.stop()
	for _, r := range e.runners {
		// Every outcome is settled: a lease gives its unused slots back.
		if gl := r.lease.Load(); gl != nil {
			r.endLease(gl, true)
		}
	}
	close(e.bgStop)
	e.bgCancel()
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

// waitInserts waits, at most until ctx ends, for the Inserts that reserved a slot to claim their
// row (ReserveInsert) to hand it to their runner: their rows then run in the drain like the
// picked ones. A row whose Insert returns later is handed back (RunInserted).
func (e *Engine) waitInserts(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		for _, r := range e.runners {
			r.inserting.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// beginner returns a function that begins a transaction on db.
func beginner(db store.DB) func(ctx context.Context) (pgx.Tx, error) {
	return func(ctx context.Context) (pgx.Tx, error) { return db.Begin(ctx) }
}
