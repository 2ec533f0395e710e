package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// T7: 16 callers insert the same correlation key at once, each in a transaction of its own that
// then rolls back with probability 0.5 (every eighth round, all of them) (the oban#1087 shape: a rolled-back holder of the key
// must not leave the others with an id and no row). Per round: exactly one live instance with the
// key if any caller committed, else none; every caller that committed holds that instance's id;
// a signal by the key reaches it (or ErrNoTarget when none lives).
func TestDedupUnderRacingRolledBackInserts(t *testing.T) {
	t.Parallel()
	seed, _ := oracle.Seed(t)
	e := newEnv(t, 20)
	ctx := context.Background()
	m := gendurable.FSM[path]{Name: "dedup", Start: "s0", Queue: "idle", Steps: map[string]gendurable.StepFunc[path]{
		"s0": func(*gendurable.Ctx, path) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	cl := e.client(t, &gendurable.Config{Name: "t7", Machines: []gendurable.Machine{m}})
	const callers = 16
	rounds := oracle.Size(100, 500)
	type result struct {
		id        int64
		dup       bool
		committed bool
		err       error
	}
	committedRounds := 0
	for round := range rounds {
		key := fmt.Sprint("order-", round)
		results := make([]result, callers)
		var wg sync.WaitGroup
		startGun := make(chan struct{})
		for i := range callers {
			rng := rand.New(rand.NewPCG(seed, uint64(round*callers+i)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := &results[i]
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					r.err = err
					return
				}
				defer func() { _ = tx.Rollback(ctx) }()
				<-startGun
				res, err := cl.InsertTx(ctx, tx, m.With(path{}), &gendurable.InsertOpts{CorrelationKey: key})
				if err != nil {
					r.err = err
					return
				}
				r.id, r.dup = res.ID, res.Duplicate
				time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
				if round%8 != 7 && rng.IntN(2) == 0 { // every 8th round, all roll back
					r.err = tx.Commit(ctx)
					r.committed = r.err == nil
				}
			}()
		}
		close(startGun)
		wg.Wait()
		var live []int64
		rows, err := e.side.Query(ctx, e.q(`SELECT id FROM {schema}.instances WHERE machine = 'dedup' AND correlation_key = $1`), key)
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			live = append(live, id)
		}
		require.NoError(t, rows.Err())
		anyCommitted := false
		for i, r := range results {
			require.NoError(t, r.err, "round %d caller %d", round, i)
			anyCommitted = anyCommitted || r.committed
		}
		if !anyCommitted {
			require.Empty(t, live, "round %d: no caller committed, yet an instance lives", round)
			_, err := cl.Signal(ctx, gendurable.ByKey("dedup", key), "x", nil)
			require.ErrorIs(t, err, gendurable.ErrNoTarget)
			continue
		}
		committedRounds++
		require.Len(t, live, 1, "round %d: exactly one instance per key", round)
		for i, r := range results {
			if r.committed {
				require.Equal(t, live[0], r.id, "round %d caller %d committed and holds another id (duplicate=%v)", round, i, r.dup)
			}
		}
		sig, err := cl.Signal(ctx, gendurable.ByKey("dedup", key), "x", nil)
		require.NoError(t, err)
		require.Equal(t, live[0], sig.InstanceID, "round %d: the signal by key reached another instance", round)
	}
	t.Logf("%d rounds, %d with a committed insert", rounds, committedRounds)
	require.Positive(t, committedRounds)
	e.check(t, oracle.Opts{Terminal: []string{"available"}}, oracle.Summary{Seed: seed, Instances: committedRounds})
}
