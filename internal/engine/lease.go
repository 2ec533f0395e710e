package engine

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/store"
)

// Gate leases. A runner whose batches are all of one gated key far from its limit leases a block
// of one shard's slots (store.LeaseGate) and claims that key's rows against it (a pick with the
// lease): its picks then read and write no gate counter, and an outcome that applies gives its
// slot back to the lease instead of crediting the counter. The counter holds the lease's unused
// slots meanwhile, so the gate's limit holds across every node; the reconciler leaves a counter
// alone while it lies within its leases (see maintenance.sql).
//
// The lease is the runner's loop's own, except its slot accounting (mu), which outcomes settle on
// the executors and the committer, and its renewal, which the heartbeat does.
const (
	// leaseRoomy is how many times a lease's size a shard must have free to be leased from: a
	// lease never takes a gate's last slots away from the other runners and nodes, and a key
	// near its limit is admitted claim by claim.
	leaseRoomy = 4
	// leaseRetry is how long a runner waits after a refused lease before it asks again.
	leaseRetry = time.Second
	// leaseMaxPerSlot caps a lease's size, per executor slot of its runner. A lease starts with
	// one slot per executor slot and grows by as many when its runner's picks find it empty: a
	// claim holds its gate slot from its pick until its outcome commits, after its executor slot
	// is free again, so a runner whose outcomes queue for the committer holds more gate slots
	// than executor slots.
	leaseMaxPerSlot = 8
	// leaseIdlePicks is how many picks in a row that do not use a lease end it (once its claims
	// have settled) although its key is still among their rows.
	leaseIdlePicks = 8
)

// gateLease is a runner's lease: store.Lease, the slots it has free, and the claims of the key it
// admitted against the lease whose outcomes are not settled yet.
type gateLease struct {
	store.Lease
	mu       sync.Mutex
	size     int // the slots leased (the lease row's)
	free     int
	inflight int
	// live is false once the lease is released or lost: an outcome then credits the counter as
	// an admission pick's claim does.
	live bool
}

// claimed records n claims the loop admitted against the lease.
func (l *gateLease) claimed(n int) {
	l.mu.Lock()
	l.free -= n
	l.inflight += n
	l.mu.Unlock()
}

// grew records n more slots leased.
func (l *gateLease) grew(n int) {
	l.mu.Lock()
	l.size += n
	l.free += n
	l.mu.Unlock()
}

// freeSlots returns how many rows of the key a pick may claim against the lease now (0 once it is
// no longer live).
func (l *gateLease) freeSlots() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.live {
		return 0
	}
	return l.free
}

// isLive reports whether the lease is neither released nor lost: an outcome sent now gives its
// slot back to it (and does not credit the counter), and the heartbeat renews it.
func (l *gateLease) isLive() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live
}

// settle ends one claim's hold on the lease: its slot is free again if its outcome gave it back
// and applied while the lease lives. Otherwise the slot is gone from the lease: the counter was
// credited for it (by the outcome, the reaper or a cancel), or, if an outcome that gave it back
// applied after the lease ended or its fate is unknown, the counter holds one slot too many
// until the reconciler finds it outside the range of its live leases.
func (l *gateLease) settle(gaveBack bool) {
	l.mu.Lock()
	l.inflight--
	if gaveBack && l.live {
		l.free++
	}
	l.mu.Unlock()
}

// end marks the lease released if nothing admitted against it is in flight (or if force), and
// returns its unused slots.
func (l *gateLease) end(force bool) (unused int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.live || (l.inflight > 0 && !force) {
		return 0, false
	}
	l.live = false
	return l.free, true
}

// lost marks the lease gone: the reconciler removed it, and its unused slots with it.
func (l *gateLease) lost() {
	l.mu.Lock()
	l.live = false
	l.mu.Unlock()
}

// oneRateLimit returns the rate limit of a batch whose rows have no key and are all of that one
// limit or of none, with at least one of it, or "".
func oneRateLimit(rows []store.Claimed) string {
	limit := ""
	for i := range rows {
		c := &rows[i]
		if c.ConcurrencyKey != nil {
			return ""
		}
		if c.RateLimit == nil {
			continue
		}
		if limit != "" && *c.RateLimit != limit {
			return ""
		}
		limit = *c.RateLimit
	}
	return limit
}

// gateOf returns the limit and shard count of the gate that owns key.
func (e *Engine) gateOf(key string) (limit, shards int32, ok bool) {
	name, _, _ := strings.Cut(key, ":")
	for i, n := range e.cfg.Gates.Names {
		if n == name {
			return e.cfg.Gates.Limits[i], e.cfg.Gates.Shards[i], true
		}
	}
	return 0, 0, false
}

// oneGatedKey returns the gated key of a full batch whose keyed rows are all of that one gated
// key, or "" (a batch with a row of any other key, or with no keyed row).
func oneGatedKey(rows []store.Claimed) string {
	key := ""
	for i := range rows {
		c := &rows[i]
		if c.ConcurrencyKey == nil {
			continue
		}
		if c.ConcurrencyShard == nil || (key != "" && *c.ConcurrencyKey != key) {
			return ""
		}
		key = *c.ConcurrencyKey
	}
	return key
}

// isLeased reports whether c, claimed by a pick under gl, took its slot from gl: every row of
// the leased key did (such a pick never debits the counter).
func isLeased(c *store.Claimed, gl *gateLease) bool {
	return c.ConcurrencyKey != nil && *c.ConcurrencyKey == gl.Key && c.ConcurrencyShard != nil
}

// countLeased returns how many rows of a pick under gl took their slots from it.
func countLeased(rows []store.Claimed, gl *gateLease) int {
	n := 0
	for i := range rows {
		if isLeased(&rows[i], gl) {
			n++
		}
	}
	return n
}

// holdsKey reports whether rows has a row of key.
func holdsKey(rows []store.Claimed, key string) bool {
	for i := range rows {
		if k := rows[i].ConcurrencyKey; k != nil && *k == key {
			return true
		}
	}
	return false
}

// afterPick keeps the runner's lease after a pick that asked for asked rows and claimed rows
// (some of them against gl, the lease the pick used, if any): it counts the lease's claims,
// leases a block for a key that filled the batch alone, ends a lease whose key the pick no longer
// found, and decides whether the next pick may use the lease.
func (r *runner) afterPick(asked int, rows []store.Claimed, gl *gateLease) {
	if gl != nil {
		gl.claimed(countLeased(rows, gl))
	}
	if gl != nil && len(rows) < asked {
		// A short batch under the lease: rows of other keys may have been left in the window,
		// or the lease may be gone. An admission pick follows at once.
		r.poke()
	}
	key := ""
	if len(rows) == asked {
		key = oneGatedKey(rows)
	}
	r.leaseNext = false
	if cur := r.lease.Load(); cur != nil {
		switch {
		case !cur.isLive():
			// Lost (the heartbeat found it gone): its claims in flight credit the counter.
			r.lease.CompareAndSwap(cur, nil)
			r.leaseRetryAt = time.Now().Add(leaseRetry)
		case key == cur.Key:
			r.leaseNext, r.leaseIdle = true, 0
		default:
			// The key has gone quiet, or shares the batches with other keys (then the picks
			// are admission picks and the lease's slots sit unused): the lease ends once its
			// claims have settled.
			r.leaseIdle++
			if !holdsKey(rows, cur.Key) || r.leaseIdle >= leaseIdlePicks {
				r.endLease(cur, false)
			}
		}
		return
	}
	if key == "" || time.Now().Before(r.leaseRetryAt) {
		return
	}
	limit, shards, ok := r.e.gateOf(key)
	size := r.conc
	if !ok || int(limit/shards) < leaseRoomy*size {
		r.leaseRetryAt = time.Now().Add(leaseRetry)
		return
	}
	ctx, cancel := context.WithTimeout(r.e.baseCtx, r.pickTimeout)
	defer cancel()
	// Every lease has an owner of its own: a lease this runner lost track of (an error whose
	// outcome it could not know) is never merged into a new one, nor renewed with it.
	l := store.Lease{Key: key, Owner: r.workerID + "/L" + strconv.FormatUint(r.seq.Add(1), 10)}
	shard, ok, err := r.e.store.LeaseGate(ctx, r.e.pool, key, limit, shards, l.Owner, size, leaseRoomy, r.e.cfg.Lease)
	if err != nil || !ok {
		if err != nil && r.e.baseCtx.Err() == nil {
			r.e.log.Warn("gendurable: gate lease failed", "client", r.e.cfg.Name, "queue", r.queue, "key", key, "error", err)
		}
		r.leaseRetryAt = time.Now().Add(leaseRetry)
		return
	}
	l.Shard = shard
	r.lease.Store(&gateLease{Lease: l, size: size, free: size, live: true})
	r.leaseNext, r.leaseIdle = true, 0
	r.e.log.Debug("gendurable: leased gate slots", "client", r.e.cfg.Name, "queue", r.queue, "key", key,
		"shard", shard, "slots", size)
}

// leaseSlots returns how many rows of its key the next pick may claim against the runner's lease
// (0: the pick goes without it), growing the lease once it is empty.
func (r *runner) leaseSlots(gl *gateLease) int {
	if free := gl.freeSlots(); free > 0 || !gl.isLive() {
		return free
	}
	gl.mu.Lock()
	size := gl.size
	gl.mu.Unlock()
	if size+r.conc > leaseMaxPerSlot*r.conc || time.Now().Before(r.leaseRetryAt) {
		return 0
	}
	ctx, cancel := context.WithTimeout(r.e.baseCtx, r.pickTimeout)
	defer cancel()
	ok, err := r.e.store.GrowLease(ctx, r.e.pool, gl.Lease, r.conc, leaseRoomy)
	if err != nil || !ok {
		if err != nil && r.e.baseCtx.Err() == nil {
			r.e.log.Warn("gendurable: gate lease growth failed", "client", r.e.cfg.Name, "queue", r.queue, "key", gl.Key, "error", err)
		}
		r.leaseRetryAt = time.Now().Add(leaseRetry)
		return 0
	}
	gl.grew(r.conc)
	return gl.freeSlots()
}

// afterRatePick decides, after a pick that asked for asked rows and claimed rows (on the rate
// lane lane, if not ""), whether the next pick takes a rate lane: if this batch was full and all
// of one limit.
func (r *runner) afterRatePick(asked int, rows []store.Claimed, lane string) {
	r.rateLane = ""
	if len(rows) == asked {
		r.rateLane = oneRateLimit(rows)
	}
	if lane != "" && len(rows) < asked {
		// Rows of other limits or keys may have been left in the window, or the bucket could
		// not afford the lane's: an admission pick follows at once.
		r.poke()
	}
}

// endLease releases the runner's lease once nothing admitted against it is in flight (or at
// once, with force: the runner has stopped), giving its unused slots back to the counter. A lease
// that is lost, or that still has claims in flight, is just dropped or kept.
func (r *runner) endLease(gl *gateLease, force bool) {
	unused, ok := gl.end(force)
	if !ok {
		if !gl.isLive() {
			r.lease.CompareAndSwap(gl, nil)
		}
		return
	}
	r.lease.CompareAndSwap(gl, nil)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.e.baseCtx), r.pickTimeout)
	defer cancel()
	if err := r.e.store.ReleaseLease(ctx, r.e.pool, gl.Lease, unused); err != nil {
		// The lease expires unrenewed, and the reconciler removes it with its slots.
		r.e.log.Warn("gendurable: gate lease release failed; it expires", "client", r.e.cfg.Name, "queue", r.queue,
			"key", gl.Key, "error", err)
	}
}
