package gendurable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// Bulk actions by filter, each after its dry run: cancel by key prefix, retry by error text,
// delete by machine and status; a filter that matches everything needs All.
func TestBulkCancelRetryAndDeleteByFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "order", Queue: "nowhere", Perform: func(*gendurable.Ctx, int) error { return nil }}
	other := gendurable.Job[int]{Name: "other", Queue: "nowhere", Perform: func(*gendurable.Ctx, int) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job, other}})
	var params []gendurable.InsertManyParams
	for i := range 30 {
		key := fmt.Sprintf("order-%d", i)
		if i < 10 {
			key = fmt.Sprintf("vip-%d", i)
		}
		params = append(params, gendurable.InsertManyParams{Input: job.With(i), Opts: &gendurable.InsertOpts{CorrelationKey: key}})
	}
	params = append(params, gendurable.InsertManyParams{Input: other.With(0), Opts: &gendurable.InsertOpts{CorrelationKey: "vip-other"}})
	_, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	count := func(q string) int { return e.count(t, q) }

	// A filter that matches everything is refused without All; with All it counts all.
	_, err = cl.Bulk(ctx, gendurable.BulkCancel, gendurable.BulkFilter{}, nil)
	var in *gendurable.InputError
	require.ErrorAs(t, err, &in)
	require.Contains(t, err.Error(), "set All")
	res, err := cl.Bulk(ctx, gendurable.BulkCancel, gendurable.BulkFilter{All: true}, &gendurable.BulkOpts{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(31), res.Matched)
	_, err = cl.Bulk(ctx, "explode", gendurable.BulkFilter{Machine: "order"}, nil)
	require.ErrorAs(t, err, &in)
	_, err = cl.Bulk(ctx, gendurable.BulkRetry, gendurable.BulkFilter{Statuses: []gendurable.Status{gendurable.StatusAvailable}}, nil)
	require.ErrorAs(t, err, &in, "retry applies to failed and cancelled instances only")

	// Cancel by machine and key prefix: the dry run says 10, the run cancels 10, in batches of 3.
	f := gendurable.BulkFilter{Machine: "order", KeyPrefix: "vip-"}
	res, err = cl.Bulk(ctx, gendurable.BulkCancel, f, &gendurable.BulkOpts{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Matched)
	require.Zero(t, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'cancelled'`), "a dry run changes nothing")
	var progress []gendurable.BulkResult
	res, err = cl.Bulk(ctx, gendurable.BulkCancel, f, &gendurable.BulkOpts{Reason: "Fraud check", BatchSize: 3,
		Progress: func(r gendurable.BulkResult) { progress = append(progress, r) }})
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 10, Changed: 10, Batches: 4}, *res)
	require.Len(t, progress, 4)
	require.Equal(t, 10, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'cancelled' AND correlation_key LIKE 'vip-%'
		AND machine = 'order' AND errors -> -1 ->> 'error' = 'Fraud check'`))
	require.Equal(t, 21, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'available'`))
	// Cancelling them again: they no longer match (cancel applies to live instances).
	res, err = cl.Bulk(ctx, gendurable.BulkCancel, f, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{}, *res)

	// Retry by the error's text, case-insensitively; one of them has had its key taken since, and
	// is skipped, untouched.
	_, err = cl.Insert(ctx, job.With(99), &gendurable.InsertOpts{CorrelationKey: "vip-3"})
	require.NoError(t, err)
	res, err = cl.Bulk(ctx, gendurable.BulkRetry, gendurable.BulkFilter{ErrorContains: "FRAUD"}, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 10, Changed: 9, Skipped: 1, Batches: 1}, *res)
	require.Equal(t, 1, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'cancelled'`))

	// Delete finished instances of one machine, inserted in a time range; their inboxes go too.
	res, err = cl.Bulk(ctx, gendurable.BulkCancel, gendurable.BulkFilter{Machine: "order", Since: time.Now().Add(-time.Hour)},
		&gendurable.BulkOpts{BatchSize: 7})
	require.NoError(t, err)
	require.Equal(t, int64(30), res.Changed) // 20 never cancelled, 9 retried, the new vip-3; the old one is finished
	res, err = cl.Bulk(ctx, gendurable.BulkDelete, gendurable.BulkFilter{Machine: "order", Until: time.Now().Add(time.Hour)}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(31), res.Changed) // the 30 just cancelled and the old vip-3
	require.Zero(t, count(`SELECT count(*) FROM {schema}.instances WHERE machine = 'order'`))
	require.Equal(t, 1, count(`SELECT count(*) FROM {schema}.instances WHERE machine = 'other' AND status = 'available'`))
}

// A bulk action that fails halfway through a batch leaves every instance of that batch
// untouched and every earlier batch applied; run again, it finishes. The failure is a trigger
// that refuses one row's cancel in the second batch, after the batch has already cancelled
// dozens of rows in its transaction.
func TestBulkInterruptedLeavesEveryInstanceChangedOrUntouched(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "j", Queue: "nowhere", Perform: func(*gendurable.Ctx, int) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}})
	params := make([]gendurable.InsertManyParams, 500)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(i)}
	}
	ins, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	poison := ins[150].ID // the 51st row of the second batch of 100
	e.exec(t, `CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by a test trigger'; END $$`)
	e.exec(t, fmt.Sprintf(`CREATE TRIGGER refuse BEFORE UPDATE ON {schema}.instances FOR EACH ROW
		WHEN (NEW.id = %d AND NEW.status = 'cancelled') EXECUTE FUNCTION {schema}.refuse()`, poison))

	res, err := cl.Bulk(ctx, gendurable.BulkCancel, gendurable.BulkFilter{Machine: "j"}, nil)
	require.ErrorContains(t, err, "refused by a test trigger")
	require.ErrorContains(t, err, "batch 2")
	require.Equal(t, gendurable.BulkResult{Matched: 100, Changed: 100, Batches: 1}, *res)
	// The database's rows: the first batch cancelled whole, every other row untouched.
	require.Equal(t, 100, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'cancelled'
		AND id <= $1 AND finalized_at IS NOT NULL AND errors -> -1 ->> 'kind' = 'cancel'`, ins[99].ID))
	require.Equal(t, 400, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'available'
		AND id > $1 AND finalized_at IS NULL AND coalesce(jsonb_array_length(errors), 0) = 0`, ins[99].ID))

	e.exec(t, `DROP TRIGGER refuse ON {schema}.instances`)
	res, err = cl.Bulk(ctx, gendurable.BulkCancel, gendurable.BulkFilter{Machine: "j"}, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.BulkResult{Matched: 400, Changed: 400, Batches: 4}, *res)
	require.Equal(t, 500, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'cancelled'`))
}
