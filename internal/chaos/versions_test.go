package chaos

// A rolling deploy of a new machine version, across processes: two workers run version 1 of the
// doc machine, a third starts with version 2, and the version-1 workers are stopped one by one.

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// doc is the state of the doc machine; Words is the field version 2 adds.
type doc struct {
	N     int      `json:"n"`
	Words *int     `json:"words,omitempty"`
	Path  []string `json:"path"`
}

// docMachine is version 1 or 2 of the doc machine (queue "docs"), whose every step records, on
// pool, which instance ran which step under which version of the code, and when.
//
//	version 1: draft → edit, parked on "go" → review → publish → done; every 250th instance is
//	           parked on "never" after draft, at legacy (those a version-1 worker drafts).
//	version 2: draft → proof (added), parked on "go" → review → ship → done. edit is removed
//	           (mapped to proof), publish renamed ship, legacy removed with no mapping (its
//	           instances are blocked), and the state gains Words, which ship requires.
func docMachine(version int, pool *pgxpool.Pool, schema string, pid int) gendurable.FSM[doc] {
	record := expand(`INSERT INTO {schema}.t_doc_steps (id, step, code, pid) VALUES ($1, $2, $3, $4)`, schema)
	step := func(next string, park ...string) gendurable.StepFunc[doc] {
		return func(ctx *gendurable.Ctx, d doc) (gendurable.Outcome, error) {
			if _, err := pool.Exec(ctx, record, ctx.ID, ctx.Step, version, pid); err != nil {
				return gendurable.Outcome{}, err
			}
			d.Path = append(d.Path, ctx.Step)
			switch {
			case next == "":
				if version == 2 && d.Words == nil {
					return gendurable.Stop(fmt.Errorf("%s: no word count", ctx.Step)), nil
				}
				return gendurable.Done(d), nil
			case version == 1 && d.N%250 == 1 && ctx.Step == "draft":
				return gendurable.Await([]string{"never"}, "legacy", d), nil
			case len(park) > 0:
				return gendurable.Await(park, next, d), nil
			}
			return gendurable.Next(next, d), nil
		}
	}
	backoff := func(int) time.Duration { return 20 * time.Millisecond }
	if version == 1 {
		return gendurable.FSM[doc]{Name: "doc", Start: "draft", Queue: "docs", MaxAttempts: 1000, Backoff: backoff,
			Steps: map[string]gendurable.StepFunc[doc]{
				"draft":   step("edit"),
				"legacy":  step(""),
				"edit":    step("review", "go"),
				"review":  step("publish"),
				"publish": step(""),
			}}
	}
	proof := step("review", "go")
	return gendurable.FSM[doc]{Name: "doc", Start: "draft", Queue: "docs", MaxAttempts: 1000, Backoff: backoff, Version: 2,
		Steps: map[string]gendurable.StepFunc[doc]{
			"draft": step("proof"),
			"proof": func(ctx *gendurable.Ctx, d doc) (gendurable.Outcome, error) {
				w := 100 * len(d.Path)
				d.Words = &w
				return proof(ctx, d)
			},
			"review": step("ship"),
			"ship":   step(""),
		},
		Upgrades: []gendurable.Upgrade{{
			From:  1,
			Steps: map[string]string{"edit": "proof", "publish": "ship"},
			State: func(step string, state json.RawMessage) (json.RawMessage, error) {
				var m map[string]any
				if err := json.Unmarshal(state, &m); err != nil {
					return nil, err
				}
				if m["words"] == nil {
					m["words"] = 0
				}
				return json.Marshal(m)
			},
		}},
	}
}

func TestRollingDeployOfAMachineVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE {schema}.t_doc_steps (id bigint, step text, code int, pid int, at timestamptz DEFAULT clock_timestamp())`)
	n := oracle.Size(2500, 5000)
	v1 := docMachine(1, nil, e.schema, 0)
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{v1}})
	params := make([]gendurable.InsertManyParams, n)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: v1.With(doc{N: i + 1})}
		if i%5 == 4 { // a fifth scheduled for later: they start after the deploy began
			params[i].Opts = &gendurable.InsertOpts{In: 3 * time.Second}
		}
	}
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)

	cfg := func(name, set string) workerCfg {
		return workerCfg{URL: e.url, Schema: e.schema, Name: name, Machines: set, Queues: []string{"docs"}, Conc: 8,
			LeaseMS: 5000, HeartbeatMS: 1000, PollMS: 100, ReaperMS: 250, StepMS: 1, Quiet: true}
	}
	old1 := startWorker(t, cfg("old1", machinesDocsV1))
	old2 := startWorker(t, cfg("old2", machinesDocsV1))
	// Instances spread over every step: some parked at review, some not started yet.
	eventually(t, 60*time.Second, "a first wave parked at review", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting' AND step = 'review'`) >= n/4
	})
	signalParked := func() int {
		ids := []int64{}
		rows, err := e.side.Query(ctx, e.q(`SELECT id FROM {schema}.instances WHERE status = 'awaiting' AND step = 'review'`))
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		for _, id := range ids {
			_, err := cl.Signal(ctx, gendurable.ByID(id), "go", nil)
			require.NoError(t, err)
		}
		return len(ids)
	}
	signalParked() // a first wave goes on to publish under version 1, or to ship under version 2

	deployed := time.Now()
	updated := startWorker(t, cfg("new", machinesDocsV2))
	time.Sleep(200 * time.Millisecond) // the new version runs beside the old one a while (pacing: no work may be left for it yet)
	rep1 := old1.term(t)
	signalParked()
	rep2 := old2.term(t)
	require.Zero(t, rep1.Events[string(gendurable.EventFSMUnknown)], "a version-1 worker claimed a row it cannot run")
	require.Zero(t, rep2.Events[string(gendurable.EventFSMUnknown)], "a version-1 worker claimed a row it cannot run")
	// Only version 1's code parks at legacy: with the version-1 workers gone, these are all.
	legacy := e.count(t, `SELECT count(*) FROM {schema}.instances WHERE step = 'legacy'`)
	require.Positive(t, legacy)
	eventually(t, 120*time.Second, "every instance done but the blocked ones", func() bool {
		signalParked()
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n-legacy
	})

	// Every instance finished along a path its versions allow, upgraded at most once.
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done' AND NOT (
		result -> 'path' IN ('["draft","edit","review","publish"]', '["draft","edit","review","ship"]',
		                     '["draft","proof","review","ship"]'))`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE coalesce(jsonb_array_length(upgrades), 0) > 1`))
	upgraded := e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine_version = 2 AND jsonb_array_length(upgrades) = 1
		AND upgrades -> 0 ->> 'from' = '1' AND upgrades -> 0 ->> 'to' = '2'`)
	require.Positive(t, upgraded)
	require.Equal(t, upgraded, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE upgrades IS NOT NULL`))
	require.Equal(t, n-legacy, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done' AND
		((machine_version = 1 AND result ->> 'words' IS NULL) OR (machine_version = 2 AND result ->> 'words' IS NOT NULL))`))
	// No step of an instance ran under version 1's code once the instance was at version 2, and
	// version 2's code never ran an instance still at version 1.
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_doc_steps s JOIN {schema}.instances i USING (id)
		WHERE s.code = 1 AND i.upgrades IS NOT NULL AND s.at > (i.upgrades -> 0 ->> 'at')::timestamptz`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_doc_steps s JOIN {schema}.instances i USING (id)
		WHERE s.code = 2 AND (i.upgrades IS NULL AND i.machine_version = 1)`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.t_doc_steps s WHERE s.code = 2 AND s.at < $1`, deployed))

	// The legacy instances, parked at a step version 2 removed without a mapping: untouched, at
	// version 1, and shown as blocked with the reason.
	require.Equal(t, legacy, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting'
		AND step = 'legacy' AND machine_version = 1 AND upgrades IS NULL`))
	groups, err := cl.Stuck(ctx)
	require.NoError(t, err)
	var blocked []gendurable.StuckGroup
	for _, g := range groups {
		if g.Kind == gendurable.StuckBlocked {
			blocked = append(blocked, g)
		}
	}
	require.Len(t, blocked, 1, "%+v", groups)
	require.Equal(t, [4]any{"doc", "legacy", 1, int64(legacy)}, [4]any{blocked[0].Machine, blocked[0].Step, blocked[0].Version, blocked[0].Count})
	require.Contains(t, blocked[0].Reason, `take step "legacy" of version 1 to "legacy", which version 2 lacks`)
	updated.term(t)
	t.Logf("%d instances, %d brought forward to version 2, %d blocked", n, upgraded, legacy)
}
