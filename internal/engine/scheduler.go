package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/gendurable/gendurable/internal/spell"
	"github.com/gendurable/gendurable/internal/store"
)

// maxPickBatch caps the rows one pick claims.
const maxPickBatch = 1000

// runner is one queue's scheduler: a demand-driven pick loop feeding executor goroutines, at most
// Concurrency at a time.
//
// When to pick: when there is demand (a free slot) and a reason to expect work: a poke (an
// insert or an outcome of this client made rows due), the poll timer, or a backlog (the last pick
// came back full). While there is a backlog the runner waits for minDemand free slots, then up to
// pickLinger more for all of them, so picks stay batches rather than a few rows each: a pick
// costs nearly as much for ten rows as for a hundred, and short steps give their slots back
// within the linger; a poke does not cut that wait short (the backlog already means another pick
// is coming). After a short pick the queue is idle: the runner waits for a poke or the poll
// timer, whose interval grows from a short cooldown to PollInterval over consecutive empty picks
// (the idle backoff); a poke-driven empty pick does not stretch it.
type runner struct {
	e     *Engine
	queue string
	// conc is how many rows the runner may hold claimed: its workers (the executor goroutines,
	// Concurrency) and, beyond them, its prefetch (rows waiting in work for an executor).
	conc      int
	workers   int
	prefetch  int
	poll      time.Duration
	minDemand int
	workerID  string
	seq       atomic.Uint64
	stop      chan struct{}
	wake      chan struct{}
	slotFreed chan struct{}
	work      chan job // claimed rows for the executor goroutines
	mu        sync.Mutex
	busy      int
	closed    bool // work is closed (Stop): no reservations, and a reserved row is not sent
	// stopping refuses new reservations once Stop has begun; inserting counts the reservations
	// whose Insert is still in flight, which Stop waits for before it closes work, so that the
	// rows they claim run (or are handed back) instead of waiting for their lease.
	stopping    bool
	inserting   sync.WaitGroup
	pickTimeout time.Duration
	// hint names the gate and rate-limit keys of the last batch, which the next admission pick
	// reads once each instead of once per candidate row (the loop's own).
	hint store.Hint
	// lease is the runner's gate lease, if it holds one (see lease.go); leaseNext says the next
	// pick may use it (the last batch was full and all of its key), and leaseRetryAt when a
	// refused or lost lease may be asked for again (the loop's own).
	lease        atomic.Pointer[gateLease]
	leaseNext    bool
	leaseIdle    int // picks in a row that did not use the lease
	leaseRetryAt time.Time
	// rateLane is the rate limit the next pick may take as a lane (store.Lane): the last batch
	// was full and all of it (the loop's own).
	rateLane string
	// quietUntil is when an idle runner's next timed pick is due (unix ns; 0 while it picks or
	// is about to): for tests that must insert while no pick is in flight (QuietFor).
	quietUntil atomic.Int64
	// pickSpell keeps the log of picks failing one after another short (spell.Log).
	pickSpell spell.Log
}

// job is a claimed row for an executor: its flight (tracked from the moment the row is handed
// over, so that the heartbeat keeps its lease while it waits for an executor) and the context
// its step runs under. The row points into its pick's batch (one allocation per pick, not one
// copy per row).
type job struct {
	row   *store.Claimed
	lease *gateLease
	f     *flight
	ctx   context.Context
}

func newRunner(e *Engine, queue string, qc QueueConfig) *runner {
	conc := qc.Concurrency + qc.Prefetch
	md := conc / 10
	if md < 1 {
		md = 1
	}
	return &runner{
		e: e, queue: queue, conc: conc, workers: qc.Concurrency, prefetch: qc.Prefetch, poll: qc.PollInterval, minDemand: md,
		workerID:    e.workerPrefix(queue) + e.uniq,
		stop:        make(chan struct{}),
		wake:        make(chan struct{}, 1),
		slotFreed:   make(chan struct{}, 1),
		work:        make(chan job, conc),
		pickTimeout: StatementTimeout(e.cfg.Lease),
	}
}

// startWorkers starts the queue's executor goroutines: Concurrency long-lived goroutines (their
// stacks stay grown, nothing is spawned per step). They exit once work is closed and drained.
func (r *runner) startWorkers() {
	r.e.steps.Add(r.workers)
	for range r.workers {
		go func() {
			defer r.e.steps.Done()
			for j := range r.work {
				r.e.runStep(r.queue, j, r.prefetch > 0, r.release)
			}
		}()
	}
}

// handBackWaiting hands back, once Stop has ended the pick loop, the prefetched rows still
// waiting for an executor, in one statement, and pokes their queue: none has begun, and another
// node (or the next start) can run them now instead of after the running steps. An executor
// that takes one first hands it back through the committer (begin).
func (r *runner) handBackWaiting() error {
	if r.prefetch == 0 {
		return nil
	}
	var jobs []job
	for taking := true; taking; {
		select {
		case j := <-r.work:
			jobs = append(jobs, j)
		default:
			taking = false
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	rows := r.e.giveUpWaiting(jobs)
	var err error
	if len(rows) > 0 {
		if err = r.e.handBackAtStop(rows); err == nil {
			r.e.log.Info("gendurable: stopping: handed back the prefetched claims no step had begun",
				"client", r.e.cfg.Name, "queue", r.queue, "claims", len(rows))
			r.e.Poke(r.queue)
		}
	}
	for range jobs {
		r.e.inFlight.Add(-1)
		r.release()
	}
	return err
}

// handOver tracks a claimed row as in flight and makes it an executor's job.
func (r *runner) handOver(c *store.Claimed, gl *gateLease) job {
	f, ctx := r.e.track(r.queue, c.Owner, c, gl)
	return job{row: c, lease: gl, f: f, ctx: ctx}
}

func (r *runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *runner) free() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conc - r.busy
}

func (r *runner) take(n int) {
	r.mu.Lock()
	r.busy += n
	r.mu.Unlock()
}

// token is a new claim token of this runner's: its worker id and a sequence number, unique to
// one pick or one reservation.
func (r *runner) token() string { return r.workerID + "#" + strconv.FormatUint(r.seq.Add(1), 10) }

// takeUpTo takes up to n slots, as many as are free now, and returns how many it took: a
// reservation (an Insert's, a Signal's) may have taken some since the loop read free().
func (r *runner) takeUpTo(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = min(n, r.conc-r.busy)
	if n > 0 {
		r.busy += n
	}
	return n
}

// reserve takes a free slot for a row this client inserts already claimed; false once the runner
// stops, or while every slot is busy.
func (r *runner) reserve() bool { return r.reserveLeaving(0) }

// reserveLeaving reserves a slot if more than spare are free: a reservation that may come to
// nothing (a signal's, in every queue) leaves a queue's last slot to its picks. A reservation's
// row starts as its call returns, so it takes an executor's slot, never a prefetched one: busy
// counts every claimed row, waiting or running.
func (r *runner) reserveLeaving(spare int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.stopping || r.busy >= r.workers-spare {
		return false
	}
	r.busy++
	r.inserting.Add(1) // under mu, before stopping is set: Stop's Wait comes after every Add
	return true
}

// beginStop refuses new reservations; the ones taken end in RunInserted (waitInserts).
func (r *runner) beginStop() {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	close(r.stop)
}

// closeWork closes work once the loop has ended; a reserved row that arrives later is not run.
func (r *runner) closeWork() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	close(r.work)
}

func (r *runner) release() {
	r.mu.Lock()
	r.busy--
	r.mu.Unlock()
	select {
	case r.slotFreed <- struct{}{}:
	default:
	}
}

func (r *runner) loop() {
	defer r.e.loops.Done()
	cooldown := min(r.poll, 10*time.Millisecond)
	idle := cooldown
	timer := time.NewTimer(0)
	defer timer.Stop()
	want := true     // there may be due work
	backlog := false // the last pick came back full
	urgent := true   // a poke or the timer asked for this pick: take any free slot
	for {
		select {
		case <-r.stop:
			return
		case <-r.wake:
			// With a backlog the runner picks again as soon as slots free anyway: a poke
			// (an outcome that freed a key, say) must not turn that into a pick of one slot.
			want, urgent = true, urgent || !backlog
		case <-timer.C:
			want, urgent = true, true
			if !backlog {
				idle = min(idle*2, r.poll)
			}
		case <-r.slotFreed:
		}
		if !want {
			continue
		}
		if r.e.QueuePaused(r.queue) {
			// Resuming wakes the runner; the poll timer is the floor if that wake is missed.
			want, backlog = false, false
			resetTimer(timer, r.poll)
			continue
		}
		free := r.free()
		if free <= 0 || (backlog && !urgent && free < r.minDemand) {
			continue // a freed slot brings us back
		}
		if backlog && !urgent && free < min(r.conc, maxPickBatch) {
			if free = r.gather(min(r.conc, maxPickBatch)); free <= 0 {
				continue
			}
		}
		n := min(free, maxPickBatch)
		// A pick holds the slots it asks for until it returns. One made without a backlog
		// (few rows are likely due) leaves a few to the signals that claim what they wake
		// (ReserveWake) meanwhile, on a queue with slots to spare; if it comes back full, the
		// runner picks again at once for what is free.
		spared := !backlog && n >= 4*wakeSpare
		if spared {
			n -= wakeSpare
		}
		// The pick's slots are taken before it is sent: an Insert or Signal that claims its row
		// meanwhile (reserve) must not count them as free, and a reservation made since free()
		// was read is not counted twice. What the pick did not fill goes back.
		if n = r.takeUpTo(n); n <= 0 {
			continue // a freed slot brings us back
		}
		r.quietUntil.Store(0)
		rows, gl, asked, err := r.pick(n)
		r.take(len(rows) - n)
		if err != nil {
			if r.e.baseCtx.Err() == nil {
				r.pickSpell.Failed(r.e.log, "gendurable: pick failed", "client", r.e.cfg.Name, "queue", r.queue, "error", err)
			}
			want, backlog = false, false
			resetTimer(timer, r.poll)
			continue
		}
		r.pickSpell.Succeeded(r.e.log, "gendurable: picks succeed again", "client", r.e.cfg.Name, "queue", r.queue)
		r.dispatch(rows, gl)
		urgent = false
		switch {
		case len(rows) == asked:
			backlog, idle = true, cooldown
			if free > maxPickBatch || spared { // the batch cap or the spare, not the slots, limited this pick
				urgent = true
				r.poke()
			}
			resetTimer(timer, r.poll)
		case len(rows) > 0:
			want, backlog, idle = false, false, cooldown
			resetTimer(timer, idle)
		default:
			want, backlog = false, false
			resetTimer(timer, idle)
			r.quietUntil.Store(time.Now().Add(idle).UnixNano())
		}
	}
}

// wakeSpare is how many of its free slots a pick without a backlog leaves to signals' wakes.
const wakeSpare = 4

// pickLinger is the longest a runner with a backlog waits for more free slots before it picks
// for the ones it has.
const pickLinger = time.Millisecond

// gather waits until want slots are free, at most pickLinger, and returns how many are (0 once
// the runner stops).
func (r *runner) gather(want int) int {
	t := time.NewTimer(pickLinger)
	defer t.Stop()
	for {
		if free := r.free(); free >= want {
			return free
		}
		select {
		case <-r.slotFreed:
		case <-t.C:
			return r.free()
		case <-r.stop:
			return 0 // no pick: the loop sees the stop next
		}
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(d)
}

// pick claims up to n rows with a fresh claim token; with the runner's gate lease (gl, then
// asked is at most its free slots), or without (gl nil, asked is n).
func (r *runner) pick(n int) (rows []store.Claimed, gl *gateLease, asked int, err error) {
	owner := r.token()
	ctx, cancel := context.WithTimeout(r.e.baseCtx, r.pickTimeout)
	defer cancel()
	start := time.Now()
	asked = n
	var lane store.Lane
	if cur := r.lease.Load(); cur != nil && r.leaseNext {
		if free := r.leaseSlots(cur); free > 0 {
			gl, lane.Gate, asked = cur, &cur.Lease, min(n, free)
		}
	} else {
		lane.Rate = r.rateLane
	}
	rows, err = r.e.pickOnce(ctx, r.e.pool, r.queue, asked, owner, 0, r.hint, lane)
	if err != nil {
		if gl != nil {
			// The pick may have committed claims against the lease that this runner will never
			// count: it stops using the lease (its claims in flight credit the counter), and the
			// lease, no longer renewed, expires; the reconciler then takes back what is unused.
			gl.lost()
			r.lease.CompareAndSwap(gl, nil)
			r.leaseRetryAt = time.Now().Add(leaseRetry)
		}
		if r.e.baseCtx.Err() == nil { // (not a pick that Stop cancelled)
			r.e.Emit(durabletype.Event{Name: durabletype.EventSchedulerFailed, Queue: r.queue, Duration: time.Since(start), Err: err})
		}
		return nil, nil, 0, err
	}
	if store.Admits(r.e.cfg.Gates, r.e.cfg.Rates) {
		if len(rows) > 0 {
			r.hint = store.HintFrom(rows)
		}
		switch {
		case store.LeasesGates(r.e.cfg.Gates, r.e.cfg.Rates):
			r.afterPick(asked, rows, gl)
		case store.RatesLanes(r.e.cfg.Gates, r.e.cfg.Rates):
			r.afterRatePick(asked, rows, lane.Rate)
		}
	}
	if fault.Enabled && len(rows) > 0 {
		// The claims are committed; nothing runs them yet. An error here loses them to this
		// worker (as a lost reply to the pick would): their leases run out and the reaper
		// releases them.
		if err := fault.PointFor(fault.AfterClaimCommit, owner); err != nil {
			if gl != nil {
				// As lost as the claims: nothing will settle them on the lease.
				for range countLeased(rows, gl) {
					gl.settle(false)
				}
			}
			return nil, nil, 0, err
		}
	}
	if len(rows) > 0 {
		r.e.Emit(durabletype.Event{Name: durabletype.EventSchedulerPicked, Queue: r.queue, Count: len(rows),
			Duration: time.Since(start)})
	}
	return rows, gl, asked, nil
}

// pickContentionRetries bounds the retries of a pick that lost a race for a concurrency key to
// another pick.
const pickContentionRetries = 10

// pickOnce runs the pick, retrying a lost race for a concurrency key or gate slot a few times
// (concurrency.contended), and reports throttling (concurrency.throttled).
//
// A queue is picked with the plain scan until a pick that does not fill its batch finds that the
// queue holds rows with a fair tag (a plain pick claims nothing from such a queue); then with the
// fair scan, until a fair pick that claims no row with a fairness key finds none (store:
// pick.sql).
func (e *Engine) pickOnce(ctx context.Context, db store.DB, queue string, n int, owner string, horizon time.Duration, hint store.Hint, lane store.Lane) ([]store.Claimed, error) {
	mode := e.fairMode(queue)
	claimRows := 0 // the Store's
	for try := 1; ; try++ {
		fair := mode.Load()
		res, err := e.store.Pick(ctx, db, queue, n, owner, store.PickOpts{Lease: e.cfg.Lease, Horizon: horizon,
			Gates: e.cfg.Gates, Rates: e.cfg.Rates, Versions: e.versions, PausedMachines: e.pausedMachines(),
			Fair: e.cfg.Fair, FairOrder: fair, Hint: hint, Lane: lane, ClaimRows: claimRows})
		if err != nil {
			if store.ValueTooLarge(err) && claimRows != 1 {
				// A claimed row's first signals or children did not fit one jsonb value (their
				// payloads are larger than this client's MaxPayloadBytes: another client wrote
				// them). Pick again loading one of each per row; the executor reads the rest.
				claimRows = 1
				continue
			}
			if store.GateContention(err) && try <= pickContentionRetries {
				e.Emit(durabletype.Event{Name: durabletype.EventConcurrencyContended, Queue: queue, Err: err})
				// The winner commits within milliseconds; a short, jittered pause lets it, and
				// keeps racing pickers from colliding again in lockstep.
				time.Sleep(time.Duration(1+rand.IntN(2*try)) * time.Millisecond)
				continue
			}
			return nil, err
		}
		if res.RateDenied > 0 {
			e.Emit(durabletype.Event{Name: durabletype.EventRateLimitThrottled, Queue: queue, Count: res.RateDenied})
		}
		if res.Refused > 0 {
			e.Emit(durabletype.Event{Name: durabletype.EventRateLimitContended, Queue: queue, Count: res.Refused})
		}
		// (A pick on a lane leaves admissible rows of other keys and limits for the next pick:
		// they were not denied.)
		if denied := res.Considered - len(res.Rows) - res.RateDenied; denied > 0 && lane == (store.Lane{}) {
			e.Emit(durabletype.Event{Name: durabletype.EventConcurrencyThrottled, Queue: queue, Count: denied})
		}
		for i := range res.Rows {
			res.Rows[i].Owner = owner
		}
		// Whether the queue holds tagged rows comes back with every pick (res.Tagged, read as it
		// began). The mode follows it after a plain pick that did not fill its batch (a plain
		// pick claims nothing while tagged rows are there), and after a fair pick that claimed
		// no row with a key (it claimed no tagged row: tagged rows that cannot run now, a paused
		// one or a full key's, keep the queue fair).
		if (!fair && len(res.Rows) < n) || (fair && !slices.ContainsFunc(res.Rows, func(c store.Claimed) bool { return c.FairKey != nil })) {
			mode.Store(res.Tagged)
			if res.Tagged && !fair && len(res.Rows) == 0 {
				continue // the plain scan claimed nothing: pick fairly at once
			}
		}
		return res.Rows, nil
	}
}

// fairMode returns whether queue is picked with the fair scan (see pickOnce).
func (e *Engine) fairMode(queue string) *atomic.Bool {
	if m, ok := e.fairOrder.Load(queue); ok {
		return m.(*atomic.Bool)
	}
	m, _ := e.fairOrder.LoadOrStore(queue, new(atomic.Bool))
	return m.(*atomic.Bool)
}

// dispatch hands a pick's rows to the executors; their slots were taken before the pick. The
// rows of gl's key took their gate slots from gl.
func (r *runner) dispatch(rows []store.Claimed, gl *gateLease) {
	if len(rows) == 0 {
		return
	}
	r.e.inFlight.Add(int64(len(rows)))
	for i := range rows {
		var leased *gateLease
		if gl != nil && isLeased(&rows[i], gl) {
			leased = gl
		}
		r.work <- r.handOver(&rows[i], leased) // never blocks: each row has its slot, and work holds them all
	}
}

// ReserveInsert takes an executor slot of queue for an Insert that this client claims as it
// inserts the row (store.InsertClaim), and returns the claim token for it. ok is false when the
// client is not running, does not work the queue or know the machine, the queue or machine is
// paused, or the client has no free slot; the
// Insert then goes the ordinary way. Every reservation ends in RunInserted.
func (e *Engine) ReserveInsert(queue, machine string) (owner string, ok bool) {
	r, found := e.runners[queue]
	if !found || e.Machine(machine) == nil || !e.Running() || e.paused.Load().queuePaused(queue) ||
		e.paused.Load().machinePaused(machine) || !r.reserve() {
		return "", false
	}
	return r.token(), true
}

// ReserveWake takes an executor slot in each queue this client works that has two or more free,
// for a Signal whose wake may claim the instance it wakes (store.DeliverSignalClaim): the
// signal's target may be in any of them, and in all but one the slot comes back unused as the
// call returns. A queue's last free slot is left to its picks, so that a stream of signals
// cannot keep a small queue's only slot reserved. nil when the client is not running or has no
// such slot. Every reservation ends in RunWoken.
func (e *Engine) ReserveWake() *store.WakeSlots {
	if !e.Running() {
		return nil
	}
	var w *store.WakeSlots
	for _, name := range e.workedQueues {
		r := e.runners[name]
		if e.paused.Load().queuePaused(name) || !r.reserveLeaving(1) {
			continue
		}
		if w == nil {
			w = &store.WakeSlots{Machines: e.machineNames, Versions: e.machineVersions,
				Paused: e.pausedMachines(), Lease: e.cfg.Lease}
		}
		w.Queues = append(w.Queues, name)
		w.Owners = append(w.Owners, r.token())
	}
	return w
}

// RunWoken ends the reservations of w: the claimed row (nil: none) runs in its queue's slot, the
// other slots are given back. took is the signal's round trip, reported as a pick's would be.
func (e *Engine) RunWoken(w *store.WakeSlots, c *store.Claimed, took time.Duration) {
	for _, q := range w.Queues {
		var row *store.Claimed
		if c != nil && c.Queue == q {
			row = c
		}
		e.RunInserted(q, row, took)
	}
}

// RunInserted ends a reservation: it hands the claimed row to the queue's executors, or, with c
// nil (the row went in available, or the insert failed), gives the slot back. took is the
// insert's round trip, reported as the pick's would be.
func (e *Engine) RunInserted(queue string, c *store.Claimed, took time.Duration) {
	r := e.runners[queue]
	defer r.inserting.Done()
	r.mu.Lock()
	if c != nil && !r.closed {
		e.inFlight.Add(1)
		r.work <- r.handOver(c, nil) // never blocks: the reserved slot is this row's, and work holds every slot
		r.mu.Unlock()
		e.Emit(durabletype.Event{Name: durabletype.EventSchedulerPicked, Queue: queue, Count: 1, Duration: took})
		return
	}
	r.mu.Unlock()
	if c != nil {
		// Stop gave up waiting for this insert (its context ended first): the claim is handed
		// back, untouched, for another node or the next start to run.
		ctx, cancel := context.WithTimeout(context.Background(), StatementTimeout(e.cfg.Lease))
		err := e.handBack(ctx, e.pool, c)
		cancel()
		if err != nil {
			e.log.Warn("gendurable: stopping: could not hand back an instance inserted for this client; it runs after its lease",
				"client", e.cfg.Name, "queue", queue, "id", c.ID, "error", err)
		}
	}
	r.release()
}
