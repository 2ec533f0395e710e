package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// heartbeatLoop extends the leases of every claim in flight, once per interval, in one
// statement; it cancels the steps whose claims are gone. A beat that failed at once is tried
// again an eighth of an interval later, not a whole one: the leases are at stake; one that waits
// (for a connection, say) may wait as long as the claims live, and at least half a lease. If it
// cannot reach the database for a whole lease, every running step is cancelled: its claim is
// presumed lost (a step that fails for it is handed back as a lost lease: runStep).
func (e *Engine) heartbeatLoop() {
	defer e.bg.Done()
	defer e.dropBeatConn()
	if len(e.runners) > 0 {
		e.dialBeatConn() // ready before the first claims need a beat
	}
	t := time.NewTicker(e.cfg.Heartbeat)
	defer t.Stop()
	var retry <-chan time.Time
	for {
		select {
		case <-e.bgStop:
			return
		case <-t.C:
		case <-retry:
		}
		retry = nil
		began := time.Now()
		if !e.beat() && time.Since(began) < e.cfg.Heartbeat/2 {
			// It failed at once (a refused or reset connection), not by running out of time
			// (a partition, where trying more often only piles up connection attempts).
			retry = time.After(max(e.cfg.Heartbeat/8, 10*time.Millisecond))
		}
	}
}

// beat sends one heartbeat and reports whether it reached the database (true also when there
// was nothing to send).
func (e *Engine) beat() bool {
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
		return true
	}
	if fault.Enabled {
		// A beat about to extend the leases: a hook holding it here is a stalled heartbeat;
		// an error is a failed one.
		if err := fault.PointFor(fault.Heartbeat, e.cfg.Name); err != nil {
			e.beatFailed(len(ids), 0, err)
			if time.Since(e.lastBeat) >= e.cfg.Lease {
				e.cancelAll(ids, owners)
			}
			return false
		}
	}
	// The beat may take as long as the claims it extends live (until the last beat plus a lease),
	// and at least half a lease: one that waits for a connection (a pool rebuilding every
	// connection after a database restart, a server starting dozens of backends at once) is
	// better served late than given up at the next tick, behind every other waiter again. (A
	// beat after the lease ran out still extends the claims no reaper has released yet.)
	ctx, cancel := context.WithTimeout(e.bgCtx, max(e.cfg.Heartbeat, e.cfg.Lease/2, time.Until(e.lastBeat.Add(e.cfg.Lease))))
	began := time.Now()
	// Extending leases is idempotent: a beat whose connection was lost (a restarted database's
	// stale pool connections) is sent again at once on another.
	var lost, paused []int64
	err := store.RetryConnLost(ctx, func() error {
		return e.onBeatConn(func(db store.DB) (err error) {
			if lost, paused, err = e.store.Heartbeat(ctx, db, ids, owners, e.cfg.Lease); err == nil && len(lost) > 0 {
				// Cancelling steps on this server's word needs a write its standbys
				// acknowledged (store.ConfirmLost): a beat that held none of its claims wrote
				// nothing, and an old primary restarted read-write would say they are lost.
				err = e.store.ConfirmLost(ctx, db, e.Origin())
			}
			return err
		})
	})
	cancel()
	if err != nil && e.bgCtx.Err() != nil {
		return false // Stop cancelled it: nothing is left to extend
	}
	if err != nil {
		e.beatFailed(len(ids), time.Since(began), err)
		if time.Since(e.lastBeat) >= e.cfg.Lease {
			e.cancelAll(ids, owners)
		}
		return false
	}
	e.lastBeat = time.Now()
	e.spells.beat.Succeeded(e.log, "gendurable: the heartbeat reaches the database again", "client", e.cfg.Name)
	e.markPaused(ids, owners, paused) // before the beat's event, which thus says the pauses are seen
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
	return true
}

// markPaused records, on the flights of the claims a beat sent (ids[i] under token owners[i]),
// whether their instances are paused on their own (paused, as the beat found): one that still
// waits for an executor (prefetched) is handed back when an executor takes it (begin), and one
// resumed by the next beat is not; a step already begun runs on. A flight is matched by its
// token, as in cancelAll.
func (e *Engine) markPaused(ids []int64, owners []string, paused []int64) {
	var now map[int64]bool
	if len(paused) > 0 {
		now = make(map[int64]bool, len(paused))
		for _, id := range paused {
			now[id] = true
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, id := range ids {
		if f, ok := e.flights[id]; ok && f.owner == owners[i] {
			f.paused = now[id]
		}
	}
}

// beatFailed reports a beat of n claims that failed after took: an event each time, a log line
// per spell of failures (see spell.Log).
func (e *Engine) beatFailed(n int, took time.Duration, err error) {
	e.spells.beat.Failed(e.log, "gendurable: heartbeat failed", "client", e.cfg.Name, "claims", n, "error", err)
	e.Emit(durabletype.Event{Name: durabletype.EventHeartbeatFailed, Count: n, Duration: took, Err: err})
}

// cancelAll cancels the running steps of the given claims (ids[i] under token owners[i]). A
// claim is matched by its token, not by its row alone: by the time a beat reports a claim lost,
// this client may hold a new claim of the same row (the reaper released the old one, and this
// client's scheduler picked the row again while the old claim's late outcome was still on its
// way), and that new claim is not lost.
func (e *Engine) cancelAll(ids []int64, owners []string) {
	e.mu.Lock()
	n := 0
	var some []string // the first few, for the log
	for i, id := range ids {
		if f, ok := e.flights[id]; ok && f.owner == owners[i] && f.state == flightRunning {
			f.cancel(durabletype.ErrLeaseLost)
			n++
			if len(some) < 10 {
				some = append(some, fmt.Sprintf("%d (%s)", id, owners[i]))
			}
		}
	}
	e.mu.Unlock()
	if n > 0 {
		e.log.Warn("gendurable: lost claims; their steps are cancelled, and an outcome commits only if the database still shows its claim",
			"client", e.cfg.Name, "claims", n, "ids", strings.Join(some, ", "))
		e.Emit(durabletype.Event{Name: durabletype.EventHeartbeatLost, Count: n})
	}
}

// renewLeases is the heartbeat's renewal of every runner's lease; a lease it finds gone is lost.
func (e *Engine) renewLeases() {
	var held []*gateLease
	var leases []store.Lease
	for _, r := range e.runners {
		if gl := r.lease.Load(); gl != nil && gl.isLive() {
			held = append(held, gl)
			leases = append(leases, gl.Lease)
		}
	}
	if len(leases) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(e.baseCtx, e.cfg.Heartbeat)
	var renewed []store.Lease
	err := e.onBeatConn(func(db store.DB) (err error) {
		renewed, err = e.store.RenewLeases(ctx, db, leases, e.cfg.Lease)
		return err
	})
	cancel()
	if err != nil {
		// The picks check the lease themselves: one that expired admits nothing.
		e.spells.leases.Failed(e.log, "gendurable: gate lease renewal failed", "client", e.cfg.Name, "error", err)
		return
	}
	e.spells.leases.Succeeded(e.log, "gendurable: gate leases are renewed again", "client", e.cfg.Name)
	for _, gl := range held {
		found := false
		for _, l := range renewed {
			if l == gl.Lease {
				found = true
				break
			}
		}
		if !found && gl.isLive() { // (not one its runner released meanwhile)
			gl.lost()
			e.log.Warn("gendurable: a gate lease expired before it was renewed; its key is admitted claim by claim again",
				"client", e.cfg.Name, "key", gl.Key, "shard", gl.Shard)
		}
	}
}

// onBeatConn runs a heartbeat statement on the heartbeat's connection (beatDB), and again on
// the pool if that connection was refused it for good (beatDone).
func (e *Engine) onBeatConn(run func(db store.DB) error) error {
	db := e.beatDB()
	err := run(db)
	if e.beatDone(db, err) {
		err = run(e.pool)
	}
	return err
}

// beatDB is where the heartbeat extends leases: a connection of its own, outside the pool, so
// that steps holding every connection of the pool (each in its transaction, say) cannot keep the
// leases of their own claims from being extended, and have them presumed lost and cancelled.
// It is dialled in the background (at Start on a node that runs queues, and again after it
// broke); a beat waits up to beatDialWait for a dial in flight, and goes through the pool while
// there is none.
func (e *Engine) beatDB() store.DB {
	if e.beatConn != nil && !e.beatConn.IsClosed() {
		return e.beatConn
	}
	e.closeBeatConn()
	if e.beatDialing == nil {
		e.dialBeatConn()
	}
	if e.beatDialing != nil {
		t := time.NewTimer(beatDialWait)
		defer t.Stop()
		select {
		case conn := <-e.beatDialing:
			e.beatDialing = nil
			if conn != nil {
				e.beatConn, e.beatDialAfter = conn, time.Time{}
				return conn
			}
		case <-t.C:
		}
	}
	return e.pool
}

// dialBeatConn starts opening the heartbeat's connection, unless the pool is not a pgxpool (a
// test's), the connection was refused for good, or the last dial failed less than
// beatDialBackoff ago.
func (e *Engine) dialBeatConn() {
	pool, ok := e.pool.(*pgxpool.Pool)
	if !ok || e.beatOnPool || e.bgCtx == nil || time.Now().Before(e.beatDialAfter) {
		return
	}
	e.beatDialAfter = time.Now().Add(beatDialBackoff)
	dialed := make(chan *pgx.Conn, 1)
	e.beatDialing = dialed
	go func() {
		ctx, cancel := context.WithTimeout(e.bgCtx, beatDialTimeout)
		defer cancel()
		conn, err := store.Dial(ctx, pool, "gendurable heartbeat "+e.cfg.Name)
		if err != nil {
			e.log.Debug("gendurable: the heartbeat's connection could not be opened; beating through the pool",
				"client", e.cfg.Name, "error", err)
		}
		dialed <- conn
	}()
}

// beatDialTimeout bounds the opening of the heartbeat's connection; beatDialBackoff is the least
// time between two dials; beatDialWait is how long a beat waits for a dial in flight.
const (
	beatDialTimeout = 10 * time.Second
	beatDialBackoff = 5 * time.Second
	beatDialWait    = 500 * time.Millisecond
)

// beatDone drops the heartbeat's connection after a statement on it failed with the connection
// (closed, lost, or timed out and so closed by pgx): the next beat dials again. A transient
// failure (a statement cancelled, a lock not granted, a server taking no writes for a while)
// keeps it. A statement the server refused there for good (a session set up unlike the pool's,
// by a hook pgx runs at each acquire: no privilege, no such schema) sends this client's beats
// through the pool from then on; it reports that, and the caller sends the statement again there.
func (e *Engine) beatDone(db store.DB, err error) (again bool) {
	if err == nil || e.beatConn == nil || db != store.DB(e.beatConn) {
		return false
	}
	if e.beatConn.IsClosed() || store.ConnLost(err) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		e.closeBeatConn()
		return false
	}
	if store.Retryable(err) {
		return false
	}
	e.log.Warn("gendurable: the heartbeat's own connection was refused a statement; beating through the pool",
		"client", e.cfg.Name, "error", err)
	e.closeBeatConn()
	e.beatOnPool = true
	return true
}

func (e *Engine) closeBeatConn() {
	if e.beatConn != nil {
		closeConn(e.beatConn)
		e.beatConn = nil
	}
}

// closeConn closes conn, waiting at most a second for the server to hear of it.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(ctx)
	cancel()
}

// dropBeatConn closes the heartbeat's connection, and one being dialled (Stop has cancelled the
// dial's context, so it ends at once).
func (e *Engine) dropBeatConn() {
	e.closeBeatConn()
	if e.beatDialing != nil {
		if conn := <-e.beatDialing; conn != nil {
			closeConn(conn)
		}
		e.beatDialing = nil
	}
}
