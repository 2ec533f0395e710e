//go:build chaos

package chaos

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/stretchr/testify/require"
)

// A gate slot's credit racing the GC's reconciler, in both orders, with and without a leaked
// slot on the counter (a crash's leak is what the reconciler exists to repair):
//
//   - credit first: the outcome is held at gate_before_credit (its step is over, its row still
//     executing); the reconciler runs whole and must count that execution (the counter holds 1,
//     or is repaired from 2 to 1); then the credit brings it to 0.
//   - reconciler first: it is held at gc_between_select_delete with the counter locked; the
//     outcome's statement updates its row and then waits for the counter; the reconciler reads
//     the truth (the execution is not committed as over: 1) and commits; the credit brings it
//     to 0.
//
// Pass: the counter is 0 after every repetition (never negative, never a slot lost or
// duplicated), and the outcome always commits.
func TestChaosGateCreditVersusReconcile(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 12)
	ctx := context.Background()
	st, err := store.New(e.schema)
	require.NoError(t, err)
	gates := &store.Gates{Names: []string{"g"}, Limits: []int32{2}, Shards: []int32{1}}
	var steps sync.Map // id -> chan struct{}: the step waits for it
	job := gendurable.Job[string]{Name: "gj", Queue: "g", Perform: func(ctx *gendurable.Ctx, _ string) error {
		if ch, ok := steps.Load(ctx.ID); ok {
			<-ch.(chan struct{})
		}
		return nil
	}}
	cl := e.client(t, &gendurable.Config{Name: "gc", Machines: []gendurable.Machine{job}, PollInterval: time.Hour,
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"g": {Limit: 2, Shards: 1}},
		GC:                &gendurable.GCConfig{Disabled: true}, Reaper: &gendurable.ReaperConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"g": {Concurrency: 4}}})
	var credit, reconcile holds
	defer fault.Set(fault.GateBeforeCredit, credit.hook("g:"))()
	defer fault.Set(fault.GCBetweenSelectDelete, reconcile.hook(""))()
	start(t, cl)
	held := func() int { return e.count(t, `SELECT coalesce(sum(held), 0) FROM {schema}.gates WHERE key = 'g:1'`) }
	reps := oracle.Size(20, 100)
	n := 0
	for _, order := range []string{"credit first", "reconciler first"} {
		for _, leak := range []bool{false, true} {
			if order == "reconciler first" && !leak {
				continue // with nothing wrong, the reconciler locks nothing and has no window
			}
			for rep := range reps {
				n++
				release := make(chan struct{})
				res, err := cl.Insert(ctx, job.With("x"), &gendurable.InsertOpts{ConcurrencyKey: "g:1"})
				require.NoError(t, err)
				steps.Store(res.ID, release)
				eventually(t, 10*time.Second, "the step running", func() bool {
					return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'executing'`, res.ID) == 1
				})
				require.Equal(t, 1, held())
				if leak {
					e.exec(t, `UPDATE {schema}.gates SET held = held + 1 WHERE key = 'g:1'`)
				}
				done := func() bool {
					return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, res.ID) == 1
				}
				switch order {
				case "credit first":
					g := credit.arm()
					close(release)
					<-g.reached
					_, _, err := st.ReconcileGates(ctx, e.pool, gates)
					require.NoError(t, err)
					require.Equal(t, 1, held(), "%s, leak %v, rep %d: the reconciler counts the execution whose credit is on its way", order, leak, rep)
					close(g.release)
				case "reconciler first":
					g := reconcile.arm()
					errc := make(chan error, 1)
					go func() { _, _, err := st.ReconcileGates(ctx, e.pool, gates); errc <- err }()
					<-g.reached // the counter is locked
					close(release)
					e.waitLockWait(t, "the outcome's credit")
					require.False(t, done(), "the outcome committed past the reconciler's lock")
					close(g.release)
					require.NoError(t, <-errc)
				}
				eventually(t, 10*time.Second, "the instance done", done)
				require.Equal(t, 0, held(), "%s, leak %v, rep %d: the counter ends at 0", order, leak, rep)
			}
			t.Logf("%s, leaked slot %v: %d/%d repetitions end with the counter at 0", order, leak, reps, reps)
		}
	}
	e.check(t, oracle.Opts{N: n}, oracle.Summary{Instances: n, Faults: n})
}
