//go:build chaos

package chaos

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
)

// linear5 is the oracle's test machine: each step records its effect (on the side pool, in
// autocommit), runs body (nil: nothing), and moves on; s4 finishes.
func linear5(e *env, queue, by string, body func(ctx *gendurable.Ctx) error) gendurable.FSM[path] {
	steps := map[string]gendurable.StepFunc[path]{}
	for i, s := range linearPath {
		steps[s] = func(ctx *gendurable.Ctx, p path) (gendurable.Outcome, error) {
			if err := oracle.Effect(ctx, e.side, e.schema, ctx.ID, ctx.Step, ctx.Attempt, os.Getpid()); err != nil {
				return gendurable.Outcome{}, err
			}
			if body != nil {
				if err := body(ctx); err != nil {
					return gendurable.Outcome{}, err
				}
			}
			p.I++
			p.Path = append(p.Path, s)
			p.By = by
			if i == len(linearPath)-1 {
				return gendurable.Done(p), nil
			}
			return gendurable.Next(linearPath[i+1], p), nil
		}
	}
	return gendurable.FSM[path]{Name: "linear5", Start: "s0", Steps: steps, Queue: queue}
}

// waitLockWait waits until some backend running a statement in the env's schema waits on a lock
// (a statement the test expects to block has reached its lock).
func (e *env) waitLockWait(t testing.TB, what string) {
	t.Helper()
	eventually(t, 10*time.Second, what+" waiting on a lock", func() bool {
		return e.lockWaits(t) > 0
	})
}

// must returns v, panicking on err (test set-up that cannot fail).
func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("races: %v", err))
	}
	return v
}
