//go:build chaos

package fault

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"
)

// Enabled is true in a chaos build: the engine reaches its fault points.
const Enabled = true

// ErrInjected is the error a point returns when the random mode injects one.
var ErrInjected = errors.New("fault: injected error")

// Hook is a test's callback at a point. It runs in the goroutine that reached the point, with
// the point's subject; it may block, and a non-nil error is returned from the point.
type Hook func(subject string) error

// recovers says whether the callers of the point name recover from an error by themselves, soon
// and with no help from another component: a failed heartbeat is retried at the next beat (a
// lease outlasts three), a failed reaper or GC sweep at the next sweep, a failed inbox purge after
// a committed outcome by the engine's retry of it. The random mode injects
// errors only there; everywhere else it only delays. (A starting scheduler's reclaim reaches
// the reaper's point too, with its worker-id prefix as the subject; an error there fails the
// client's Start, so it is not injected.)
func recovers(name, subject string) bool {
	switch name {
	case Heartbeat, GCBetweenSelectDelete:
		return true
	case InboxPurge:
		return subject == ""
	case ReaperBetweenSelectUpdate:
		return subject == ""
	}
	return false
}

// registry is the process's fault state (see the package comment for why it is global).
var registry = struct {
	mu       sync.Mutex
	hooks    map[string]map[int]Hook
	next     int
	rng      *rand.Rand
	p        float64
	seed     uint64
	quiet    int
	hits     map[string]int64
	injected map[string]int64
}{hooks: map[string]map[int]Hook{}, hits: map[string]int64{}, injected: map[string]int64{}}

func init() {
	p, _ := strconv.ParseFloat(os.Getenv("GD_FAULT_P"), 64)
	seed := uint64(time.Now().UnixNano())
	for _, k := range []string{"GD_FAULT_SEED", "GD_SEED"} {
		if v, err := strconv.ParseUint(os.Getenv(k), 10, 64); err == nil {
			seed = v
			break
		}
	}
	registry.p, registry.seed = p, seed
	registry.rng = rand.New(rand.NewPCG(seed, 0xfa17))
	if p > 0 {
		fmt.Fprintf(os.Stderr, "fault: chaos build, GD_FAULT_P=%g fault_seed=%d\n", p, seed)
	}
}

// Point is PointFor with no subject.
func Point(name string) error { return PointFor(name, "") }

// PointFor runs the hooks registered for name with subject, then, in the random mode, perhaps
// delays or fails.
func PointFor(name, subject string) error {
	r := &registry
	r.mu.Lock()
	r.hits[name]++
	hooks := make([]Hook, 0, len(r.hooks[name]))
	for _, h := range r.hooks[name] {
		hooks = append(hooks, h)
	}
	var delay time.Duration
	inject := false
	if r.p > 0 && r.quiet == 0 && r.rng.Float64() < r.p {
		if recovers(name, subject) && r.rng.IntN(2) == 0 {
			inject = true
			r.injected[name]++
		} else {
			delay = time.Duration(r.rng.Int64N(int64(20 * time.Millisecond)))
		}
	}
	r.mu.Unlock()
	for _, h := range hooks {
		if err := h(subject); err != nil {
			return err
		}
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	if inject {
		return fmt.Errorf("%w at %s", ErrInjected, name)
	}
	return nil
}

// Set registers hook at the point name until the returned function removes it. Several hooks
// may be registered at one point (tests running side by side); each should act only on its own
// subjects.
func Set(name string, hook Hook) (remove func()) {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	id := r.next
	if r.hooks[name] == nil {
		r.hooks[name] = map[int]Hook{}
	}
	r.hooks[name][id] = hook
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.hooks[name], id)
	}
}

// Quiet suspends the random mode until the returned function is called (a deterministic test
// that counts exact events). Nested calls stack.
func Quiet() (resume func()) {
	r := &registry
	r.mu.Lock()
	r.quiet++
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.quiet--
			r.mu.Unlock()
		})
	}
}

// Hits returns how many times the point name was reached since the process started.
func Hits(name string) int64 {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits[name]
}

// Injected returns how many errors the random mode injected at the point name.
func Injected(name string) int64 {
	r := &registry
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.injected[name]
}

// Probability returns GD_FAULT_P and the random mode's seed.
func Probability() (p float64, seed uint64) {
	return registry.p, registry.seed
}
