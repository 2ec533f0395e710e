//go:build chaos

package chaos

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/stretchr/testify/require"
)

// gate is one hold at a fault point: the hook reports that a worker reached the point on
// reached and waits for release.
type gate struct {
	reached chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{reached: make(chan struct{}), release: make(chan struct{})} }

// holds routes a fault point's hook to the current gate, for subjects with a given prefix; with
// no gate armed the point passes.
type holds struct {
	mu  sync.Mutex
	cur *gate
}

func (h *holds) arm() *gate {
	g := newGate()
	h.mu.Lock()
	h.cur = g
	h.mu.Unlock()
	return g
}

// hook returns the fault hook: the first worker with the prefix to reach the point while a gate
// is armed takes the gate (and disarms it) and waits for its release.
func (h *holds) hook(prefix string) fault.Hook {
	return func(subject string) error {
		if !strings.HasPrefix(subject, prefix) {
			return nil
		}
		h.mu.Lock()
		g := h.cur
		h.cur = nil
		h.mu.Unlock()
		if g != nil {
			close(g.reached)
			<-g.release
		}
		return nil
	}
}

// T5a: a signal racing a park, in every order of the delivery's two steps (its statement: the
// row lock, the wake decision and the inbox insert; then its commit) against the park's two (the
// park UPDATE, then the inbox re-check and commit). The delivery goes through SignalTx so that
// its commit is a step of its own. An order that asks a statement to go past a row lock the other
// side holds issues it, checks that it waits on the lock, and goes on: the lock decides, and the
// test checks that whatever it decides wakes the instance.
//
// Nothing but the protocol can wake it: the poll is an hour and no reaper runs; the wake's poke
// travels by LISTEN/NOTIFY (with the delivery's commit, or the park's).
func TestChaosParkVersusSignalEveryInterleavingWakes(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 12)
	ctx := context.Background()
	m := parkerFSM()
	cl := e.client(t, &gendurable.Config{Name: "t5a", Machines: []gendurable.Machine{m}, PollInterval: time.Hour,
		Poke: gendurable.PokePostgres(), Reaper: &gendurable.ReaperConfig{Disabled: true},
		GC: &gendurable.GCConfig{Disabled: true}, Queues: map[string]gendurable.QueueConfig{"park": {Concurrency: 2}}})
	var beforeOutcome, between holds
	defer fault.Set(fault.BeforeOutcome, beforeOutcome.hook("t5a:"))()
	defer fault.Set(fault.AwaitBetweenStmts, between.hook("t5a:"))()
	start(t, cl)

	// The events: a1 the delivery's statement, a2 its commit; b1 the park UPDATE (released from
	// before_outcome), b2 the re-check and commit (released from await_between_stmts).
	orders := []string{"a1 a2 b1 b2", "a1 b1 a2 b2", "a1 b1 b2 a2", "b1 a1 a2 b2", "b1 a1 b2 a2", "b1 b2 a1 a2"}
	reps := oracle.Size(20, 20)
	n := 0
	for _, order := range orders {
		var waits atomic.Int64
		for rep := range reps {
			n++
			r := &t5aRun{t: t, e: e, cl: cl, m: m, waits: &waits}
			r.run(ctx, order, &beforeOutcome, &between)
			if t.Failed() {
				t.Fatalf("order %q, repetition %d failed", order, rep)
			}
		}
		// The orders that ask one side past the other's row lock really met it.
		t.Logf("order %q: %d/%d woke; a statement waited on the other side's row lock %d times", order, reps, reps, waits.Load())
		if order != orders[0] && order != orders[len(orders)-1] {
			require.Positive(t, waits.Load(), "order %q never met the row lock", order)
		}
	}
	require.Equal(t, 0, e.stranded(t))
	e.check(t, oracle.Opts{N: n, Terminal: []string{"done"}}, oracle.Summary{Instances: n, Faults: 2 * n})
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE (result->>'woke')::bool`),
		"every instance woke with the signal it awaited")
}

type t5aRun struct {
	t     *testing.T
	e     *env
	cl    *gendurable.Client
	m     gendurable.FSM[parked]
	stop  chan struct{}
	waits *atomic.Int64 // statements seen waiting on the other side's row lock
}

func (r *t5aRun) run(ctx context.Context, order string, beforeOutcome, between *holds) {
	t, e := r.t, r.e
	r.stop = make(chan struct{})
	defer close(r.stop)
	h0, h1 := beforeOutcome.arm(), between.arm()
	res, err := r.cl.Insert(ctx, r.m.With(parked{}), nil)
	require.NoError(t, err)
	id := res.ID
	select {
	case <-h0.reached: // s0 ran; its park is not sent yet
	case <-time.After(10 * time.Second):
		t.Fatal("the step never reached before_outcome")
	}
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	a1done := make(chan error, 1)
	a2done := make(chan error, 1)
	parkDone := make(chan struct{})
	released1 := false
	for _, ev := range strings.Fields(order) {
		switch ev {
		case "a1":
			go func() {
				_, err := r.cl.SignalTx(ctx, tx, gendurable.ByID(id), "go", nil)
				a1done <- err
			}()
			r.settle(a1done, "the delivery")
		case "a2":
			// Issued: the commit follows the statement, which may be waiting for the park's
			// commit (then the commit comes after b2).
			go func() {
				err := <-a1done
				if err == nil {
					err = tx.Commit(ctx)
				}
				a2done <- err
			}()
			select {
			case err := <-a2done:
				require.NoError(t, err)
				a2done <- nil
			case <-r.blocked():
			}

		case "b1":
			close(h0.release)
			// The park either reaches the re-check or waits for the delivery's row lock.
			select {
			case <-h1.reached:
			case <-r.blocked():
				require.Equal(t, "executing", r.status(id), "the park waits for the delivery's lock")
			}
		case "b2":
			// Issued: the re-check goes as soon as the park gets there (if the park waits for
			// the delivery's lock, that is after a2).
			close(h1.release)
			released1 = true
			go func() {
				eventually(t, 10*time.Second, "the park committed", func() bool { return r.status(id) != "executing" })
				close(parkDone)
			}()
			// The park commits unless the delivery holds the row (then it waits for a2).
			select {
			case <-parkDone:
			case <-r.blocked():
			}
		}
	}
	if !released1 {
		close(h1.release)
	}
	require.NoError(t, <-a2done, "the delivery")
	eventually(t, 10*time.Second, "the instance done", func() bool { return r.status(id) == "done" })
}

// settle waits until the event finished or its statement waits on a lock.
func (r *t5aRun) settle(done chan error, what string) {
	select {
	case err := <-done:
		require.NoError(r.t, err, what)
		done <- nil // keep it for the event that waits for it
	case <-r.blocked():
	}
}

// blocked is closed once some statement of the test's schema waits on a lock (and counts it).
func (r *t5aRun) blocked() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-r.stop:
				return
			default:
			}
			var n int
			err := r.e.side.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, r.e.schema).Scan(&n)
			if err == nil && n > 0 {
				r.waits.Add(1)
				close(ch)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return ch
}

func (r *t5aRun) status(id int64) string {
	var s string
	require.NoError(r.t, r.e.side.QueryRow(context.Background(), r.e.q(`SELECT status::text FROM {schema}.instances WHERE id = $1`), id).Scan(&s))
	return s
}
