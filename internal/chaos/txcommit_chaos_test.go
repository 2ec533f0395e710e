//go:build chaos

package chaos

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/stretchr/testify/require"
)

// A step's own transaction (Ctx.Tx) commits its outcome, and the engine has not yet heard so
// (held at after_step_tx_commit) while the heartbeat beats: the beats find the claim gone, as
// they must, and take it for what it is, a step that finished, not one that lost its claim (no
// heartbeat.lost, no cancelled step, the outcome reported applied). Then the same window with
// the commit's acknowledgement lost: the engine, not knowing the fate, hands the claim back,
// the hand-back finds the outcome landed and is dropped as stale, and the step's write stands
// once.
func TestChaosStepTransactionCommitWindow(t *testing.T) {
	for _, c := range []struct {
		name    string
		ackLost bool
	}{{"committed", false}, {"acknowledgement lost", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, 8)
			ctx := context.Background()
			e.exec(t, `CREATE TABLE {schema}.ledger (instance bigint)`)
			var mu sync.Mutex
			events := map[gendurable.EventName]int{}
			beats := make(chan struct{}, 100)
			job := gendurable.Job[string]{Name: "ledger", Queue: "q", Perform: func(c *gendurable.Ctx, _ string) error {
				tx, err := c.Tx()
				if err != nil {
					return err
				}
				_, err = tx.Exec(c, expand(`INSERT INTO {schema}.ledger VALUES ($1)`, e.schema), c.ID)
				return err
			}}
			cl := e.client(t, &gendurable.Config{Name: "w", Machines: []gendurable.Machine{job},
				Lease: 5 * time.Second, Heartbeat: 50 * time.Millisecond,
				Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1}},
				Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
					mu.Lock()
					events[ev.Name]++
					mu.Unlock()
					if ev.Name == gendurable.EventHeartbeatBeat {
						select {
						case beats <- struct{}{}:
						default:
						}
					}
				}}})
			held, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			t.Cleanup(fault.Set(fault.AfterStepTxCommit, func(string) error {
				once.Do(func() { close(held) })
				<-release
				if c.ackLost {
					return errors.New("test: the commit's acknowledgement was lost")
				}
				return nil
			}))
			start(t, cl)
			res, err := cl.Insert(ctx, job.With(""), nil)
			require.NoError(t, err)
			select {
			case <-held:
			case <-time.After(20 * time.Second):
				t.Fatal("the step's transaction never committed")
			}
			// Two beats that began after the commit: each sent the claim and found it gone.
			for len(beats) > 0 {
				<-beats
			}
			for range 2 {
				select {
				case <-beats:
				case <-time.After(10 * time.Second):
					t.Fatal("no heartbeat beat while the step's commit was held")
				}
			}
			close(release)
			eventually(t, 10*time.Second, "the instance done and its step settled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				settled := events[gendurable.EventStepFinished] + events[gendurable.EventOutcomeStale]
				return settled > 0 && e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND status = 'done'`, res.ID) == 1
			})
			mu.Lock()
			defer mu.Unlock()
			require.Zero(t, events[gendurable.EventHeartbeatLost], "a beat took the committed step for a lost claim")
			if c.ackLost {
				require.Equal(t, 1, events[gendurable.EventOutcomeStale], "the hand-back found the outcome landed")
				require.Zero(t, events[gendurable.EventStepFinished])
			} else {
				require.Equal(t, 1, events[gendurable.EventStepFinished])
				require.Zero(t, events[gendurable.EventOutcomeStale])
			}
			require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.ledger WHERE instance = $1`, res.ID))
		})
	}
}
