//go:build chaos

package chaos

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/stretchr/testify/require"
)

// A child that receives its first signal while its step runs, then finishes, has its inbox
// cleared by a statement that follows its outcome's commit. When that statement fails, the
// outcome stands: it is reported applied (never stale), its commit is not retried, the parent
// it made runnable is woken at once (the poll here is an hour), and the inbox is cleared by the
// retry of that statement alone.
func TestChaosFailedInboxPurgeLosesNothing(t *testing.T) {
	defer fault.Quiet()()
	e := newEnv(t, 12)
	ctx := context.Background()
	type famState struct {
		Done int `json:"done"`
	}
	running := make(chan int64, 1)
	release := make(chan struct{})
	kid := gendurable.FSM[kidState]{Name: "kid", Start: "work", Queue: "q", Steps: map[string]gendurable.StepFunc[kidState]{
		"work": func(ctx *gendurable.Ctx, k kidState) (gendurable.Outcome, error) {
			running <- ctx.ID
			<-release
			return gendurable.Done(k), nil
		},
	}}
	fam := gendurable.FSM[famState]{Name: "fam", Start: "spawn", Queue: "p", Steps: map[string]gendurable.StepFunc[famState]{
		"spawn": func(*gendurable.Ctx, famState) (gendurable.Outcome, error) {
			return gendurable.Spawn([]gendurable.Child{{Input: kid.With(kidState{})}}, "join", famState{}), nil
		},
		"join": func(ctx *gendurable.Ctx, f famState) (gendurable.Outcome, error) {
			for _, c := range ctx.Children {
				if c.Status == gendurable.StatusDone {
					f.Done++
				}
			}
			return gendurable.Done(f), nil
		},
	}}
	var mu sync.Mutex
	events := map[gendurable.EventName]int{}
	var purges, failed atomic.Int64
	defer fault.Set(fault.InboxPurge, func(subject string) error {
		purges.Add(1)
		if subject == "" && failed.CompareAndSwap(0, 1) {
			return errors.New("injected: the inbox purge failed")
		}
		return nil
	})()
	c := e.client(t, &gendurable.Config{Name: "c", Machines: []gendurable.Machine{fam, kid}, PollInterval: time.Hour,
		Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Queues: map[string]gendurable.QueueConfig{"p": {Concurrency: 2}, "q": {Concurrency: 2}},
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			mu.Lock()
			events[ev.Name]++
			mu.Unlock()
		}}})
	start(t, c)
	res, err := c.Insert(ctx, fam.With(famState{}), nil)
	require.NoError(t, err)
	var kidID int64
	select {
	case kidID = <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not start")
	}
	// The child's first signal arrives while its step runs: the pick saw no inbox, so the
	// purge of its Done is the late one, after the commit.
	_, err = c.Signal(ctx, gendurable.ByID(kidID), "extra", map[string]int{"n": 1})
	require.NoError(t, err)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, kidID))
	close(release)

	eventually(t, 15*time.Second, "the parent woken and done (its poll is an hour away)", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, res.ID) == 1
	})
	require.JSONEq(t, `{"done": 1}`, string(must(c.Get(ctx, res.ID)).Result))
	eventually(t, 15*time.Second, "the child's inbox cleared by the purge's retry", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, kidID) == 0
	})
	require.Equal(t, int64(1), failed.Load(), "the purge failed once")
	require.GreaterOrEqual(t, purges.Load(), int64(2), "the purge ran again")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, kidID))
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, events[gendurable.EventOutcomeStale], "an outcome that committed was reported stale")
	require.Zero(t, events[gendurable.EventCommitFailed], "the committed batch was retried")
	require.Equal(t, 3, events[gendurable.EventStepFinished], "spawn, the child's step and the join each finished once")
}
