package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

var noop = gendurable.Job[counter]{Name: "noop", Perform: func(*gendurable.Ctx, counter) error { return nil }}

func TestInsertOptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	ctx := context.Background()
	at := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	r, err := cl.Insert(ctx, noop.With(counter{N: 3}), &gendurable.InsertOpts{
		Queue: "mail", Priority: 2, ScheduledAt: at, MaxAttempts: 7, CorrelationKey: "k1",
	})
	require.NoError(t, err)
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, "noop", in.Machine)
	require.Equal(t, gendurable.JobStep, in.Step)
	require.Equal(t, "mail", in.Queue)
	require.Equal(t, 2, in.Priority)
	require.True(t, at.Equal(in.ScheduledAt))
	require.Equal(t, 7, in.MaxAttempts)
	require.Equal(t, "k1", in.CorrelationKey)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
	require.JSONEq(t, `{"n":3}`, string(in.State))
	// State is stored as a jsonb object, visible to ->> (not a JSON string holding JSON).
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE state->>'n' = '3'`))

	r, err = cl.Insert(ctx, noop.With(counter{}), &gendurable.InsertOpts{In: time.Hour})
	require.NoError(t, err)
	in, err = cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.DefaultQueue, in.Queue)
	require.Equal(t, 5, in.Priority)
	require.Equal(t, gendurable.DefaultMaxAttempts, in.MaxAttempts)
	require.WithinDuration(t, time.Now().Add(time.Hour), in.ScheduledAt, time.Minute)

	_, err = cl.Get(ctx, 1<<40)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
}

func TestInsertRejectsBadInputAndStoresNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop, orderFSM}, MaxPayloadBytes: 4096})
	ctx := context.Background()
	type big struct{ S string }
	bigJob := gendurable.Job[big]{Name: "big", Perform: func(*gendurable.Ctx, big) error { return nil }}
	floatJob := gendurable.Job[float64]{Name: "float", Perform: func(*gendurable.Ctx, float64) error { return nil }}
	nulJob := gendurable.Job[string]{Name: "nul", Perform: func(*gendurable.Ctx, string) error { return nil }}
	noStart := orderFSM
	noStart.Start = "nope"
	cases := []struct {
		name  string
		input gendurable.Input
		opts  *gendurable.InsertOpts
		want  []error
		field string
	}{
		{"empty queue is the default, too long is not", noop.With(counter{}), &gendurable.InsertOpts{Queue: strings.Repeat("q", 129)}, nil, "Queue"},
		{"control character in queue", noop.With(counter{}), &gendurable.InsertOpts{Queue: "a\nb"}, nil, "Queue"},
		{"priority too low", noop.With(counter{}), &gendurable.InsertOpts{Priority: -1}, nil, "Priority"},
		{"priority too high", noop.With(counter{}), &gendurable.InsertOpts{Priority: 10}, nil, "Priority"},
		{"negative max attempts", noop.With(counter{}), &gendurable.InsertOpts{MaxAttempts: -2}, nil, "MaxAttempts"},
		{"negative delay", noop.With(counter{}), &gendurable.InsertOpts{In: -time.Second}, nil, "In"},
		{"both In and ScheduledAt", noop.With(counter{}), &gendurable.InsertOpts{In: time.Second, ScheduledAt: time.Now()}, nil, "In"},
		{"overlong correlation key", noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: strings.Repeat("k", 513)}, nil, "CorrelationKey"},
		{"NUL in correlation key", noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: "a\x00"}, nil, "CorrelationKey"},
		{"bad scope", noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: "k", CorrelationScope: []gendurable.Status{"zombie"}}, nil, "CorrelationScope"},
		{"state too large", bigJob.With(big{S: strings.Repeat("x", 5000)}), nil, []error{gendurable.ErrPayloadTooLarge}, "state"},
		{"unencodable state", floatJob.With(math.Inf(1)), nil, []error{gendurable.ErrInvalidPayload}, "state"},
		{"NUL in state", nulJob.With("a\x00b"), nil, []error{gendurable.ErrInvalidPayload}, "state"},
		{"start step the machine does not have", noStart.With(order{}), nil, []error{gendurable.ErrUnknownStep}, "Input"},
		{"empty machine name", gendurable.Job[counter]{}.With(counter{}), nil, nil, "Input"},
		{"zero input", gendurable.Input{}, nil, nil, "Input"},
	}
	for _, c := range cases {
		_, err := cl.Insert(ctx, c.input, c.opts)
		require.Error(t, err, c.name)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, c.name)
		for _, w := range c.want {
			require.ErrorIs(t, err, w, c.name)
		}
		var ie *gendurable.InputError
		require.True(t, errors.As(err, &ie), c.name)
		require.Equal(t, c.field, ie.Field, c.name)
		require.Equal(t, -1, ie.Index, c.name)
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances`))

	// In a batch, one bad row rejects the whole batch and the error names it.
	params := make([]gendurable.InsertManyParams, 10000)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: noop.With(counter{N: i})}
	}
	params[6789].Opts = &gendurable.InsertOpts{Priority: 42}
	_, err := cl.InsertMany(ctx, params)
	var ie *gendurable.InputError
	require.True(t, errors.As(err, &ie))
	require.Equal(t, 6789, ie.Index)
	require.Contains(t, err.Error(), "row 6789")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances`))
}

func TestInsertManyOfOneHundredThousandRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	const n = 100_000
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: noop.With(counter{N: i})}
		if i%10 == 0 {
			params[i].Opts = &gendurable.InsertOpts{CorrelationKey: fmt.Sprintf("key-%06d", n-i)}
		}
	}
	res, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
	require.Len(t, res, n)
	require.Equal(t, n, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	// Every result points at the row inserted for that input.
	ids := make([]int64, n)
	for i, r := range res {
		require.False(t, r.Duplicate)
		ids[i] = r.ID
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, ord)
		JOIN {schema}.instances i ON i.id = u.id WHERE (i.state->>'n')::int <> u.ord - 1`, ids))
	// Keyed rows went in key order: ids ascend with the key.
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (
		SELECT id, lag(id) OVER (ORDER BY correlation_key) AS prev FROM {schema}.instances WHERE correlation_key IS NOT NULL) s
		WHERE prev > id`))
}

func TestCorrelationKeyDeduplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop, orderFSM}})
	ctx := context.Background()
	opts := &gendurable.InsertOpts{CorrelationKey: "order-1"}
	a, err := cl.Insert(ctx, noop.With(counter{N: 1}), opts)
	require.NoError(t, err)
	require.False(t, a.Duplicate)
	b, err := cl.Insert(ctx, noop.With(counter{N: 2}), opts)
	require.NoError(t, err)
	require.True(t, b.Duplicate)
	require.Equal(t, a.ID, b.ID)
	// The key is scoped by machine.
	c, err := cl.Insert(ctx, orderFSM.With(order{}), opts)
	require.NoError(t, err)
	require.False(t, c.Duplicate)

	// Duplicates inside one batch resolve to the first.
	res, err := cl.InsertMany(ctx, []gendurable.InsertManyParams{
		{Input: noop.With(counter{}), Opts: &gendurable.InsertOpts{CorrelationKey: "x"}},
		{Input: noop.With(counter{}), Opts: &gendurable.InsertOpts{CorrelationKey: "x"}},
		{Input: noop.With(counter{}), Opts: opts},
	})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.True(t, res[1].Duplicate)
	require.Equal(t, res[0].ID, res[1].ID)
	require.True(t, res[2].Duplicate)
	require.Equal(t, a.ID, res[2].ID)

	// Once finished, the key is free again, unless the scope includes finished statuses.
	e.exec(t, `UPDATE {schema}.instances SET status = 'done', finalized_at = now() WHERE id = $1`, a.ID)
	d, err := cl.Insert(ctx, noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: "order-1",
		CorrelationScope: []gendurable.Status{gendurable.StatusDone}})
	require.NoError(t, err)
	require.True(t, d.Duplicate)
	require.Equal(t, a.ID, d.ID)
	f, err := cl.Insert(ctx, noop.With(counter{}), opts)
	require.NoError(t, err)
	require.False(t, f.Duplicate)
	require.NotEqual(t, a.ID, f.ID)
	g, err := cl.Insert(ctx, noop.With(counter{}), &gendurable.InsertOpts{CorrelationKey: "order-1",
		CorrelationScope: []gendurable.Status{gendurable.StatusDone}})
	require.NoError(t, err)
	require.True(t, g.Duplicate)
	require.Equal(t, f.ID, g.ID, "the live instance wins over a finished one")
}

func TestRacingInsertsOfTheSameKeysLeaveOneLiveRowEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	ctx := context.Background()
	const keys, workers = 200, 8
	results := make([][]gendurable.InsertResult, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			order := rng.Perm(keys)
			results[w] = make([]gendurable.InsertResult, keys)
			for _, k := range order {
				r, err := cl.Insert(ctx, noop.With(counter{N: w}), &gendurable.InsertOpts{CorrelationKey: fmt.Sprint("k", k)})
				if err != nil {
					t.Error(err)
					return
				}
				results[w][k] = r
			}
		}()
	}
	wg.Wait()
	require.Equal(t, keys, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (SELECT correlation_key FROM {schema}.instances
		WHERE status IN ('available','executing','awaiting','joining') GROUP BY 1 HAVING count(*) > 1) d`))
	for k := range keys {
		created := 0
		for w := range workers {
			require.Equal(t, results[0][k].ID, results[w][k].ID, "every racer gets the surviving row's id")
			if !results[w][k].Duplicate {
				created++
			}
		}
		require.Equal(t, 1, created, "exactly one racer created key %d", k)
	}
}

// Batches with overlapping correlation keys, in shuffled and opposite orders, race each other:
// no duplicate key, and no deadlock in the test's own database (counted once its connections
// have closed: newDeadlockFreeEnv).
func TestRacingOverlappingBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	e := newDeadlockFreeEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	ctx := context.Background()
	rounds := oracle.Size(5, 10)
	const workers, batch, keyspace = 6, 500, 1500
	for round := range rounds {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				params := make([]gendurable.InsertManyParams, batch)
				for i := range params {
					// Overlapping keys in shuffled, opposite orders across racers.
					params[i] = gendurable.InsertManyParams{Input: noop.With(counter{}),
						Opts: &gendurable.InsertOpts{CorrelationKey: fmt.Sprintf("r%d-%d", round, rng.IntN(keyspace))}}
				}
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				defer tx.Rollback(ctx)
				if _, err := cl.InsertManyTx(ctx, tx, params); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // hold the keys a while
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (SELECT correlation_key FROM {schema}.instances
		GROUP BY 1 HAVING count(*) > 1) d`))
}

func TestInsertTxIsInvisibleUntilCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{noop}})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	r, err := cl.InsertTx(ctx, tx, noop.With(counter{}), nil)
	require.NoError(t, err)
	_, err = cl.Get(ctx, r.ID)
	require.ErrorIs(t, err, gendurable.ErrNotFound)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances`))
	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	r, err = cl.InsertTx(ctx, tx, noop.With(counter{}), nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	in, err := cl.Get(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
}

// InsertMany answers each row with the id of that row, whatever the mix of machines and keys:
// unkeyed rows of several machines, given in an order that is not the machines' order, among
// keyed ones.
func TestInsertManyReturnsEachRowsOwnID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	zeta := gendurable.Job[counter]{Name: "zeta", Perform: func(*gendurable.Ctx, counter) error { return nil }}
	alpha := gendurable.Job[counter]{Name: "alpha", Perform: func(*gendurable.Ctx, counter) error { return nil }}
	cl := e.client(t, nil)
	var params []gendurable.InsertManyParams
	for i := range 12 {
		job, opts := zeta, (*gendurable.InsertOpts)(nil)
		if i%3 == 1 {
			job = alpha
		}
		if i%4 == 0 {
			opts = &gendurable.InsertOpts{CorrelationKey: fmt.Sprintf("k%02d", 20-i)}
		}
		params = append(params, gendurable.InsertManyParams{Input: job.With(counter{N: i}), Opts: opts})
	}
	res, err := cl.InsertMany(context.Background(), params)
	require.NoError(t, err)
	for i, r := range res {
		in, err := cl.Get(context.Background(), r.ID)
		require.NoError(t, err)
		var c counter
		require.NoError(t, jsonUnmarshal(in.State, &c))
		require.Equal(t, i, c.N, "row %d got the id of row %d", i, c.N)
	}
}
