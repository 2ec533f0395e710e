package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// Parents spawning children whose correlation keys collide with other families' children that
// are finishing at that moment, on clients whose outcome batches mix spawns with children's
// completions. A batch that settles a parent's join and then inserts a child whose key belongs
// to a row another batch is finishing waits for that batch, while holding the parent; if that
// batch then settles the same parent, the two deadlock. In a database of its own.
func TestSpawningIntoKeysOfFinishingChildrenDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	heavy.Lock()
	defer heavy.Unlock()
	seed, _ := oracle.Seed(t)
	e := newEnv(t, 40)
	ctx := context.Background()
	kid := gendurable.Job[int]{Name: "kid", Queue: "w", Perform: func(*gendurable.Ctx, int) error { return nil }}
	type famState struct {
		Wave int `json:"wave"`
		Seed int `json:"seed"`
	}
	const waves, children, keys = 4, 20, 60
	fam := gendurable.FSM[famState]{Name: "fam", Start: "spawn", Queue: "w", Steps: map[string]gendurable.StepFunc[famState]{
		"spawn": func(ctx *gendurable.Ctx, f famState) (gendurable.Outcome, error) {
			rng := mrand.New(mrand.NewPCG(uint64(f.Seed), uint64(f.Wave)))
			kids := make([]gendurable.Child, children)
			for i := range kids {
				kids[i] = gendurable.Child{Input: kid.With(i), Opts: &gendurable.InsertOpts{CorrelationKey: fmt.Sprint("key", rng.IntN(keys))}}
			}
			return gendurable.Spawn(kids, "join", f), nil
		},
		"join": func(ctx *gendurable.Ctx, f famState) (gendurable.Outcome, error) {
			if f.Wave++; f.Wave < waves {
				return gendurable.Next("spawn", f), nil
			}
			return gendurable.Done(f), nil
		},
	}}
	machines := []gendurable.Machine{fam, kid}
	for i := range 3 {
		start(t, e.client(t, &gendurable.Config{Name: fmt.Sprint("c", i), Machines: machines, PollInterval: 20 * time.Millisecond,
			Queues: map[string]gendurable.QueueConfig{"w": {Concurrency: 24}}}))
	}
	parents := oracle.Size(60, 200)
	params := make([]gendurable.InsertManyParams, parents)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: fam.With(famState{Seed: int(seed%1000_000) + i})}
	}
	_, err := e.client(t, &gendurable.Config{Machines: machines}).InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 3*time.Minute, "every family done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'fam' AND status = 'done'`) == parents
	})
	e.check(t, oracle.Opts{}, oracle.Summary{Seed: seed, Instances: parents})
}
