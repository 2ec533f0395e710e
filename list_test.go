package gendurable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// fill inserts n rows directly (a fixture for read paths): machine m<i%3>, queue q<i%2>, status
// from statusOf(i), correlation key k<i> for every tenth row.
func fill(t *testing.T, e *env, n int, statusOf string) {
	t.Helper()
	e.exec(t, fmt.Sprintf(`INSERT INTO {schema}.instances (machine, step, queue, status, max_attempts, state, correlation_key,
		finalized_at, errors)
		SELECT 'm' || (i %% 3), 's', 'q' || (i %% 2), (%s)::{schema}.status, 3, '{}',
		       CASE WHEN i %% 10 = 0 THEN 'k' || i END,
		       CASE WHEN (%s) IN ('done', 'failed', 'cancelled') THEN now() END,
		       CASE WHEN (%s) = 'failed' THEN jsonb_build_array(jsonb_build_object('error', 'boom ' || i)) END
		FROM generate_series(1, %d) AS i`, statusOf, statusOf, statusOf, n))
}

func TestListFiltersAndPages(t *testing.T) {
	e := newEnv(t)
	fill(t, e, 250, `CASE WHEN i % 50 = 0 THEN 'failed' WHEN i % 7 = 0 THEN 'awaiting' ELSE 'done' END`)
	cl := e.client(t, nil)
	ctx := context.Background()

	// Paging: every row once, newest first, in pages of 100.
	var ids []int64
	before, pages := int64(0), 0
	for {
		p, err := cl.List(ctx, &gendurable.ListOpts{Limit: 100, Before: before})
		require.NoError(t, err)
		pages++
		for _, in := range p.Instances {
			ids = append(ids, in.ID)
		}
		if p.Next == 0 {
			break
		}
		before = p.Next
	}
	require.Equal(t, 3, pages)
	require.Len(t, ids, 250)
	for i := 1; i < len(ids); i++ {
		require.Less(t, ids[i], ids[i-1])
	}

	count := func(o gendurable.ListOpts) int {
		o.Limit = 1000
		p, err := cl.List(ctx, &o)
		require.NoError(t, err)
		return len(p.Instances)
	}
	require.Equal(t, 125, count(gendurable.ListOpts{Queue: "q0"}))
	require.Equal(t, 83, count(gendurable.ListOpts{Machine: "m0"}))
	require.Equal(t, 5, count(gendurable.ListOpts{Statuses: []gendurable.Status{gendurable.StatusFailed}}))
	require.Equal(t, 5+e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting'`),
		count(gendurable.ListOpts{Statuses: []gendurable.Status{gendurable.StatusFailed, gendurable.StatusAwaiting}}))
	require.Equal(t, 1, count(gendurable.ListOpts{Machine: "m1", CorrelationKey: "k10"}))
	require.Equal(t, 0, count(gendurable.ListOpts{Machine: "m0", CorrelationKey: "k10"}))
	require.Equal(t, 250, count(gendurable.ListOpts{Since: time.Now().Add(-time.Hour)}))
	require.Equal(t, 0, count(gendurable.ListOpts{Since: time.Now().Add(time.Hour)}))

	p, err := cl.List(ctx, &gendurable.ListOpts{Statuses: []gendurable.Status{gendurable.StatusFailed}, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, "boom 250", p.Instances[0].LastError)

	for _, tc := range []struct {
		opts  gendurable.ListOpts
		field string
	}{
		{gendurable.ListOpts{Limit: -1}, "Limit"},
		{gendurable.ListOpts{Limit: 1001}, "Limit"},
		{gendurable.ListOpts{Before: -3}, "Before"},
		{gendurable.ListOpts{Statuses: []gendurable.Status{"sleeping"}}, "Statuses"},
		{gendurable.ListOpts{Queue: string(make([]byte, 200))}, "Queue"},
		{gendurable.ListOpts{Machine: "bad\x00name"}, "Machine"},
		{gendurable.ListOpts{CorrelationKey: string(make([]byte, 600))}, "CorrelationKey"},
	} {
		_, err := cl.List(ctx, &tc.opts)
		var ie *gendurable.InputError
		require.ErrorAs(t, err, &ie, "%+v", tc.opts)
		require.Equal(t, tc.field, ie.Field)
	}
}
