package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/spell"
	"github.com/gendurable/gendurable/internal/store"
)

// committer applies outcomes in groups: each worker takes whatever has queued up while the
// previous statement was in flight (up to MaxCommitBatch) and applies it in one fenced statement
// (group commit). Nothing is reported (events, wakes, the await bridge) before its commit. A
// bounded queue is the executors' backpressure.
//
// The workers take turns: the one holding the turn takes outcomes off the queue and sends them,
// so one statement is in flight at a time and the next batch grows while it is, and a busy client
// sends few, large statements (two workers sending side by side split the same outcomes into
// twice as many smaller ones, which costs throughput: docs/PERFORMANCE.md). Once the
// statement in flight has taken stallAfter, a waiting worker sends what is queued beside it, so
// a statement that waits on a lock, or retries against a restarting server, never holds back the
// rest.
type committer struct {
	e    *Engine
	ch   chan *commitReq
	turn chan struct{} // holds the token while no worker is taking outcomes or sending them
	// inFlight is when the turn holder's statement was sent (Unix ns), 0 while none is; sent
	// tells a waiting worker that one was.
	inFlight atomic.Int64
	sent     chan struct{}
	quit     chan struct{}
	wg       sync.WaitGroup
}

// stallAfter is how long a worker with outcomes waits for the statement in flight before it
// sends its own beside it. An outcome statement takes a few milliseconds.
const stallAfter = 20 * time.Millisecond

type commitReq struct {
	flight  *flight
	out     store.Outcome
	release func() // frees the executor slot once the request is queued
}

func newCommitter(e *Engine) *committer {
	capacity := 64
	for _, q := range e.cfg.Queues {
		capacity += q.Concurrency
	}
	c := &committer{e: e, ch: make(chan *commitReq, capacity), turn: make(chan struct{}, 1), quit: make(chan struct{}),
		sent: make(chan struct{}, 1)}
	c.turn <- struct{}{}
	return c
}

func (c *committer) start() {
	for range c.e.cfg.Committers {
		c.wg.Add(1)
		go c.work()
	}
}

// stop lets the workers apply everything queued, then returns.
func (c *committer) stop() {
	close(c.quit)
	c.wg.Wait()
}

// submit queues an outcome; it blocks while the queue is full.
func (c *committer) submit(req *commitReq) {
	c.ch <- req
	req.release()
	c.e.sends.Done()
}

func (c *committer) work() {
	defer c.wg.Done()
	maxBatch := c.e.cfg.MaxCommitBatch
	batch := make([]*commitReq, 0, maxBatch)
	for {
		batch = batch[:0]
		held := c.awaitTurn()
		switch {
		case held:
			// Only the worker holding the turn takes outcomes off the queue as they come: a
			// worker that took one while another's statement was in flight would send it
			// nearly alone once its turn came.
			select {
			case r := <-c.ch:
				batch = c.fill(append(batch, r), maxBatch)
			case <-c.quit:
				c.turn <- struct{}{}
				c.drain(batch, maxBatch)
				return
			}
			c.inFlight.Store(time.Now().UnixNano())
			select {
			case c.sent <- struct{}{}: // a waiting worker times the statement from now
			default:
			}
			c.commit(batch, false)
			c.inFlight.Store(0)
			c.turn <- struct{}{}
		case c.stopping():
			c.drain(batch, maxBatch)
			return
		default:
			// The statement in flight has stalled: send what is queued beside it.
			if batch = c.take(batch, maxBatch); len(batch) > 0 {
				c.commit(batch, false)
			}
		}
	}
}

// drain applies everything queued, for a committer that is stopping.
func (c *committer) drain(batch []*commitReq, maxBatch int) {
	for {
		batch = c.take(batch[:0], maxBatch)
		if len(batch) == 0 {
			return
		}
		c.commit(batch, true)
	}
}

func (c *committer) stopping() bool {
	select {
	case <-c.quit:
		return true
	default:
		return false
	}
}

// awaitTurn waits until no other worker holds the turn (true: the caller now holds it and must
// give it back), or until outcomes are queued while the statement in flight has taken
// stallAfter, or the committer stops (false). While no statement is in flight it only waits: an
// idle client's committers never wake.
func (c *committer) awaitTurn() bool {
	select {
	case <-c.turn:
		return true
	default:
	}
	t := time.NewTimer(stallAfter)
	defer t.Stop()
	var check <-chan time.Time // armed while a statement is in flight: when it would count as stalled
	arm := func() {
		check = nil
		if since := c.inFlight.Load(); since != 0 {
			t.Reset(max(stallAfter-time.Since(time.Unix(0, since)), stallAfter/4))
			check = t.C
		}
	}
	arm()
	for {
		select {
		case <-c.turn:
			return true
		case <-c.quit:
			return false
		case <-c.sent:
			arm()
		case <-check:
			if since := c.inFlight.Load(); since != 0 && time.Since(time.Unix(0, since)) >= stallAfter && len(c.ch) > 0 {
				return false
			}
			arm()
		}
	}
}

// take adds to batch what is queued now, without waiting.
func (c *committer) take(batch []*commitReq, maxBatch int) []*commitReq {
	for len(batch) < maxBatch {
		select {
		case r := <-c.ch:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// rejected handles a batch the database refused for its content. Retrying it as is would fail
// forever, and one bad outcome must not hold back the others: each outcome is applied on its
// own, and one that is still refused fails its instance with the database's error recorded
// (the state is left as it was), like an outcome that could not be encoded. Only if even that is
// refused is the outcome dropped; the claim's lease then runs out and the reaper releases it.
func (c *committer) rejected(batch []*commitReq, err error) {
	e := c.e
	if len(batch) > 1 {
		for _, r := range batch {
			c.commit([]*commitReq{r}, true)
		}
		return
	}
	r := batch[0]
	if r.out.Kind == store.KindFailed && r.out.ErrKind == errRejected {
		e.log.Error("gendurable: the database refused an outcome; dropped it", "client", e.cfg.Name,
			"queue", r.flight.queue, "id", r.out.Claim.ID, "error", err)
		e.finish(r.flight, &r.out, false, err)
		return
	}
	r.out = r.out.FailInstead(errRejected, "the database refused the outcome "+r.out.Kind.String()+": "+err.Error(), err)
	e.log.Error("gendurable: the database refused an outcome; failing the instance with the error",
		"client", e.cfg.Name, "queue", r.flight.queue, "id", r.out.Claim.ID, "error", err)
	c.commit([]*commitReq{r}, true)
}

// errRejected is the error kind of an outcome that fails its instance because the database
// refused the step's own outcome.
const errRejected = "rejected"

// linger is the longest a committer waits for more outcomes of steps that are still running
// before it commits what it has: steps dispatched by one pick finish close together, and one
// statement for all of them costs far less than one each.
const linger = time.Millisecond

// fill adds to batch what is queued, then, while steps are still running (their outcomes are on
// their way) and the batch is not full, waits up to linger for them. With nothing running (an
// idle queue, a single insert) it commits at once: latency is never traded away for nothing.
func (c *committer) fill(batch []*commitReq, maxBatch int) []*commitReq {
	var deadline <-chan time.Time
	for len(batch) < maxBatch {
		select {
		case r := <-c.ch:
			batch = append(batch, r)
			continue
		default:
		}
		if c.e.inFlight.Load() == 0 {
			return batch
		}
		if deadline == nil {
			t := time.NewTimer(linger)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case r := <-c.ch:
			batch = append(batch, r)
		case <-deadline:
			return batch
		}
	}
	return batch
}

// commit applies a batch, retrying failures (a lost connection, a restarting server, a try that
// ran past StatementTimeout on a hung connection) with backoff: the outcomes are still owned until their leases run out, and the fence makes a
// retry of a statement that did commit harmless (its rows then report as stale). While
// stopping, it gives up after a few tries; the reaper then re-runs those steps.
func (c *committer) commit(batch []*commitReq, stopping bool) {
	if spawns, rest := splitKeyedSpawns(batch); len(spawns) > 0 && len(rest) > 0 {
		c.commit(rest, stopping)
		c.commit(spawns, stopping)
		return
	}
	e := c.e
	outs := make([]store.Outcome, len(batch))
	for i, r := range batch {
		outs[i] = r.out
	}
	backoff := 50 * time.Millisecond
	// The batch's own spell: committers run side by side (a second beside a stalled statement),
	// and one's success says nothing of another's retries.
	var failing spell.Log
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), StatementTimeout(e.cfg.Lease))
		// The rows this node's Await callers wait on are read back in the commit's round trip:
		// they are answered as it returns, without a read of their own.
		applied, woken, probes, err := e.store.ApplyOutcomesProbing(ctx, e.pool, outs, e.awaits.want(outs))
		cancel()
		err = e.committed(err)
		if err == nil {
			failing.Succeeded(e.log, "gendurable: outcomes commit again", "client", e.cfg.Name)
			e.awaits.answer(probes)
			for _, r := range batch {
				_, ok := applied[r.out.Claim]
				e.finish(r.flight, &r.out, ok, nil)
			}
			e.wakeAll(woken)
			return
		}
		e.Emit(durabletype.Event{Name: durabletype.EventCommitFailed, Count: len(batch), Err: err})
		if !store.Retryable(err) {
			c.rejected(batch, err)
			return
		}
		if (stopping && try >= 3) || try >= 1000 {
			for _, r := range batch {
				e.finish(r.flight, &r.out, false, err)
			}
			return
		}
		failing.Failed(e.log, "gendurable: outcome commit failed; retrying", "client", e.cfg.Name, "outcomes", len(batch),
			"try", try, "error", err)
		if stopping {
			time.Sleep(backoff)
		} else {
			select {
			case <-time.After(backoff):
			case <-c.quit:
				stopping = true
			}
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// splitKeyedSpawns separates, in a batch that also finishes instances, the outcomes that spawn
// children with correlation keys; they are applied in a transaction of their own, after the
// rest. A child's insert waits for any transaction that is finishing a live instance with the
// child's key (until it commits, the key may still be taken), and a finishing outcome takes its
// key out of the live scope at its row's update. Two transactions that each finish one keyed row
// and insert a child with the other's key (or an InsertMany inserting both keys) would wait on
// each other: inserts take keys in key order, a batch finishes rows in no key order. A
// transaction that inserts keyed children therefore finishes nothing.
func splitKeyedSpawns(batch []*commitReq) (spawns, rest []*commitReq) {
	finishes := false
	for _, r := range batch {
		keyed := false
		if r.out.Kind == store.KindSpawn {
			for i := range r.out.Children {
				if r.out.Children[i].CorrelationKey != "" {
					keyed = true
					break
				}
			}
		}
		if keyed {
			spawns = append(spawns, r)
		} else {
			rest = append(rest, r)
			finishes = finishes || r.out.Kind.Terminal()
		}
	}
	if !finishes {
		return nil, batch
	}
	return spawns, rest
}

// committed sorts an error of an outcome statement applied to the pool: an
// *store.InboxPurgeError says that the outcomes committed and only the follow-up clearing of some
// finished instances' inboxes failed. Those outcomes are reported as applied (retrying them would
// find them stale and lose their wakes), the clearing is retried in the background, and nil is
// returned. Any other error is returned as it is.
func (e *Engine) committed(err error) error {
	var pe *store.InboxPurgeError
	if !errors.As(err, &pe) {
		return err
	}
	e.log.Warn("gendurable: outcomes committed; clearing the inboxes of finished instances failed",
		"client", e.cfg.Name, "instances", len(pe.IDs), "error", pe.Err)
	if e.bgCtx != nil && e.bgCtx.Err() == nil { // else a drain without Start, or stopping: left to GC
		e.bg.Add(1)
		go func() {
			defer e.bg.Done()
			e.purgeInboxes(pe.IDs)
		}()
	}
	return nil
}

// purgeInboxes clears the inboxes of finished instances, retrying with backoff for about a
// minute, or until the client stops. Should it give up, the signals stay in the inboxes of
// finished instances, where nothing consumes them, until GC deletes the instances.
func (e *Engine) purgeInboxes(ids []int64) {
	backoff := 50 * time.Millisecond
	var err error
	for try := 0; try < 40; try++ {
		ctx, cancel := context.WithTimeout(e.bgCtx, StatementTimeout(e.cfg.Lease))
		err = e.store.PurgeTerminalInboxes(ctx, e.pool, ids)
		cancel()
		if err == nil || e.bgCtx.Err() != nil {
			return
		}
		select {
		case <-time.After(backoff):
		case <-e.bgCtx.Done():
			return
		}
		backoff = min(backoff*2, 2*time.Second)
	}
	e.log.Error("gendurable: could not clear the inboxes of finished instances; GC deletes them with the instances",
		"client", e.cfg.Name, "instances", len(ids), "error", err)
}
