package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A role's statement_timeout (here 300ms) shorter than the outcome statement of a large spawn
// (30,000 children, and a trigger of the test's that makes the statement last at least 500ms on
// any machine) cancelled it at every try: the committer retried it for half an hour, the
// parent stayed executing, its lease extended by the heartbeat, and after that the reaper ran the
// step again, for ever. The engine's own statements (picks, outcome batches) carry a timeout of
// their own, the ceiling of the deadline the client gives them: the spawn commits, and the
// other work of the client goes on beside it.
func TestSpawnOutlastsTheRolesStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, e := slowSpawns(t)
	kid := gendurable.Job[int]{Name: "kid", Queue: "kids", Perform: func(*gendurable.Ctx, int) error { return nil }}
	other := gendurable.Job[int]{Name: "other", Perform: func(*gendurable.Ctx, int) error { return nil }}
	parent := bigSpawner(kid, nil)
	machines := []gendurable.Machine{kid, other, parent}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: machines,
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}}})
	require.NoError(t, err)
	start(t, cl)
	side := e.client(t, &gendurable.Config{Machines: machines})
	p, err := side.Insert(ctx, parent.With(0), nil)
	require.NoError(t, err)
	var ids []int64
	for i := range 20 {
		r, err := side.Insert(ctx, other.With(i), nil)
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	eventually(t, 20*time.Second, "the other jobs done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'done'`, ids) == len(ids)
	})
	spawned(t, side, e, p.ID)
}

// The same spawn from a step that also wrote through Ctx.Tx: its outcome commits in the step's
// transaction, on the caller's pool, whose role cancels statements after 300ms. The step's
// writes and its spawn commit together, once.
func TestSpawnInStepTxOutlastsTheRolesStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, e := slowSpawns(t)
	e.exec(t, `CREATE TABLE {schema}.spawn_effects (at timestamptz NOT NULL DEFAULT now())`)
	kid := gendurable.Job[int]{Name: "kid", Queue: "kids", Perform: func(*gendurable.Ctx, int) error { return nil }}
	parent := bigSpawner(kid, func(c *gendurable.Ctx) error {
		tx, err := c.Tx()
		if err != nil {
			return err
		}
		_, err = tx.Exec(c, expand(`INSERT INTO {schema}.spawn_effects DEFAULT VALUES`, e.schema))
		return err
	})
	machines := []gendurable.Machine{kid, parent}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: machines,
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}}})
	require.NoError(t, err)
	start(t, cl)
	side := e.client(t, &gendurable.Config{Machines: machines})
	p, err := side.Insert(ctx, parent.With(0), nil)
	require.NoError(t, err)
	spawned(t, side, e, p.ID)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.spawn_effects`), "the step's write committed once, with its spawn")
}

// spawned waits for the parent id to leave executing (30 s at most) and requires that it went to
// joining, its spawn committed at the first try, with its 30,000 children.
func spawned(t *testing.T, cl *gendurable.Client, e *env, id int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		in, err := cl.Get(context.Background(), id)
		require.NoError(t, err)
		if in.Status != gendurable.StatusExecuting && in.Status != gendurable.StatusAvailable {
			require.Equal(t, gendurable.StatusJoining, in.Status)
			require.Empty(t, in.Errors)
			require.Equal(t, 30000, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE parent_id = $1`, id))
			return
		}
		require.True(t, time.Now().Before(deadline), "parent still %s, errors %v", in.Status, in.Errors)
		time.Sleep(100 * time.Millisecond)
	}
}

// bigSpawner is a machine whose first step spawns 30,000 children of kid (after before, if set)
// and whose join finishes with their count.
func bigSpawner(kid gendurable.Job[int], before func(*gendurable.Ctx) error) gendurable.FSM[int] {
	return gendurable.FSM[int]{Name: "parent", Start: "spawn", Steps: map[string]gendurable.StepFunc[int]{
		"spawn": func(c *gendurable.Ctx, _ int) (gendurable.Outcome, error) {
			if before != nil {
				if err := before(c); err != nil {
					return gendurable.Outcome{}, err
				}
			}
			kids := make([]gendurable.Child, 30000)
			for i := range kids {
				kids[i] = gendurable.Child{Input: kid.With(i)}
			}
			return gendurable.Spawn(kids, "join", 0), nil
		},
		"join": func(c *gendurable.Ctx, _ int) (gendurable.Outcome, error) {
			return gendurable.Done(len(c.Children)), nil
		},
	}}
}

// slowSpawns returns a pool whose sessions cancel statements after 300ms, for the working
// client; and an env whose pool has no such timeout, for the test's own inserts, reads and counts
// (the role's timeout is to bound only the working client's statements: a caller's are the
// caller's to bound, and on a loaded machine an insert or a count of 30,000 rows can take
// longer), with a schema in which every statement that inserts children lasts at least 500ms (a
// trigger of the test's), however fast the machine.
func slowSpawns(t *testing.T) (pool *pgxpool.Pool, e *env) {
	t.Helper()
	checks := durabledbtest.Pool(t, 2)
	e = &env{pool: checks, schema: durabledbtest.Schema(t, checks)}
	pool = durabledbtest.Pool(t, 8, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["statement_timeout"] = "300ms" })
	e.exec(t, `
		CREATE FUNCTION {schema}.t_slow_children() RETURNS trigger LANGUAGE plpgsql AS $fn$
		BEGIN
		  IF EXISTS (SELECT 1 FROM new_rows WHERE parent_id IS NOT NULL) THEN PERFORM pg_sleep(0.5); END IF;
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_slow_children AFTER INSERT ON {schema}.instances REFERENCING NEW TABLE AS new_rows
		FOR EACH STATEMENT EXECUTE FUNCTION {schema}.t_slow_children()`)
	return pool, e
}
