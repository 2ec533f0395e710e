// Package spell keeps the log of a failure that repeats readable. The engine's loops (the
// heartbeat, each queue's pick, the reaper, GC, …) try again after every failure, and while the
// database refuses them (a restart, a full disk, a partition) each try fails: logged one line
// per try, a minute's outage is thousands of lines from every node. A Log turns each run of
// failures of one loop (a spell) into its first failure, a reminder at most once a minute with
// the count of the failures it did not log, and one line when the loop succeeds again. Counting
// every failure is the events' job, not the log's.
package spell

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEvery is the shortest time between two lines of one spell.
const DefaultEvery = time.Minute

// Log is the spell state of one loop. The zero value is ready to use; a Log is safe for
// concurrent use.
type Log struct {
	// Every is the shortest time between two lines of one spell (0: DefaultEvery).
	Every time.Duration
	// Now is the clock (nil: time.Now); tests set it.
	Now func() time.Time

	on       atomic.Bool // a spell is on (read without the lock by Succeeded)
	mu       sync.Mutex
	failures int // in the spell so far
	unlogged int // since the spell's last line
	began    time.Time
	logged   time.Time
	last     time.Time // the latest failure
}

// Failed records a failure of the loop. The first failure of a spell is logged as msg at Warn
// with args; a later one only once the spell's last line is Every old, with "unlogged" (the
// failures since that line that were not logged) and "failing_for" added. Every other failure
// is counted. A failure more than Every after the last one begins a new spell: a loop with
// nothing to do (no claims to beat for, no waiters to probe) has no success to end the last.
func (s *Log) Failed(log *slog.Logger, msg string, args ...any) {
	now := s.now()
	s.mu.Lock()
	if s.failures > 0 && now.Sub(s.last) > s.every() {
		s.failures, s.unlogged = 0, 0
	}
	if now.After(s.last) { // (a racing caller may have read the clock before this one)
		s.last = now
	}
	s.failures++
	first := s.failures == 1
	if first {
		s.on.Store(true)
		s.began = now
	} else if now.Sub(s.logged) < s.every() {
		s.unlogged++
		s.mu.Unlock()
		return
	}
	unlogged, began := s.unlogged, s.began
	s.unlogged, s.logged = 0, now
	s.mu.Unlock()
	if !first {
		args = append(args[:len(args):len(args)], "unlogged", unlogged, "failing_for", now.Sub(began).Round(time.Millisecond))
	}
	log.Warn(msg, args...)
}

// Succeeded ends the spell, if one is on: it logs msg at Info with args, "failures" (every
// failure of the spell, logged or not) and "failed_for" (from its first failure to now). Without
// a spell it logs nothing.
func (s *Log) Succeeded(log *slog.Logger, msg string, args ...any) {
	if !s.on.Load() {
		return // the common case, on every success of a loop: one atomic read
	}
	now := s.now()
	s.mu.Lock()
	failures, began := s.failures, s.began
	s.failures, s.unlogged = 0, 0
	s.on.Store(false)
	s.mu.Unlock()
	if failures == 0 {
		return
	}
	log.Info(msg, append(args[:len(args):len(args)], "failures", failures, "failed_for", now.Sub(began).Round(time.Millisecond))...)
}

func (s *Log) every() time.Duration {
	if s.Every > 0 {
		return s.Every
	}
	return DefaultEvery
}

func (s *Log) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}
