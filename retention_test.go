package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// A machine's Retention is its own: GC deletes its finished instances after it, while another
// machine's, under the GC's default, stay. A maintenance node that registers neither machine
// sweeps by what the workers recorded.
func TestEachMachineKeepsItsFinishedInstancesForItsOwnRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	noop := func(*gendurable.Ctx, string) error { return nil }
	brief := gendurable.Job[string]{Name: "brief", Queue: "r", Perform: noop, Retention: time.Second}
	kept := gendurable.Job[string]{Name: "kept", Queue: "r", Perform: noop}
	worker := e.client(t, &gendurable.Config{Name: "worker", Machines: []gendurable.Machine{brief, kept},
		Queues: map[string]gendurable.QueueConfig{"r": {}}, Lease: time.Second,
		GC: &gendurable.GCConfig{Disabled: true}})
	start(t, worker)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.retention WHERE machine = 'brief' AND retention_ms = 1000`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.retention WHERE machine = 'kept'`))
	var params []gendurable.InsertManyParams
	for range 50 {
		params = append(params, gendurable.InsertManyParams{Input: brief.With("b")}, gendurable.InsertManyParams{Input: kept.With("k")})
	}
	_, err := worker.InsertMany(ctx, params)
	require.NoError(t, err)
	eventually(t, 20*time.Second, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == 100
	})
	// The maintenance node: GC every 50ms, default retention an hour, no machines of its own.
	maint := e.client(t, &gendurable.Config{Name: "maint", Lease: time.Second,
		GC: &gendurable.GCConfig{Interval: 50 * time.Millisecond, Retention: time.Hour}})
	start(t, maint)
	eventually(t, 20*time.Second, "brief's instances gone", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'brief'`) == 0
	})
	require.Equal(t, 50, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE machine = 'kept'`))

	_, err = gendurable.NewClient(e.pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{
		gendurable.Job[string]{Name: "bad", Perform: noop, Retention: time.Millisecond}}})
	require.ErrorContains(t, err, `job "bad": Retention 1ms: at least 1s`)
}
