package gendurable_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// stallTracer stops its pool's client before the at-th savepoint statement it sends, until resume
// is closed: a process stopped in the middle of a transaction, as the server sees it.
type stallTracer struct {
	at              int32
	n               atomic.Int32
	stalled, resume chan struct{}
	once            sync.Once
}

// release lets the stopped client go on.
func (s *stallTracer) release() { s.once.Do(func() { close(s.resume) }) }

func (s *stallTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "savepoint") && s.n.Add(1) == s.at {
		close(s.stalled)
		<-s.resume
	}
	return ctx
}

func (s *stallTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A Bulk batch whose client stops in the middle of its transaction (a CLI suspended in its
// terminal) does not keep the rows it changed so far locked: the server ends the session once it
// has sat idle for the bound, another session's update of such a row goes through, and the batch
// rolls back whole and is reported untouched. Without the bound, that update waited for as long
// as the client stayed stopped (here: its 60 s lock timeout, and the test fails).
func TestBulkBatchOfAStoppedClientEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	job := gendurable.Job[int]{Name: "order", Queue: "nowhere", Perform: func(*gendurable.Ctx, int) error { return nil }}
	params := make([]gendurable.InsertManyParams, 30)
	for i := range params {
		params[i] = gendurable.InsertManyParams{Input: job.With(i)}
	}
	res, err := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{job}}).InsertMany(ctx, params)
	require.NoError(t, err)
	first := res[0].ID
	for _, r := range res {
		first = min(first, r.ID)
	}

	stall := &stallTracer{at: 10, stalled: make(chan struct{}), resume: make(chan struct{})}
	pool := durabledbtest.Pool(t, 4, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = stall })
	t.Cleanup(stall.release) // before the pool's cleanup, which waits for the stopped connection
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: e.schema, Machines: []gendurable.Machine{job}})
	require.NoError(t, err)
	gendurable.SetOwnTxIdleTimeout(cl, 2*time.Second) // longer than a busy machine's stall between two statements
	done := make(chan error, 1)
	go func() {
		_, err := cl.Bulk(ctx, gendurable.BulkCancel, gendurable.BulkFilter{Machine: "order"}, &gendurable.BulkOpts{BatchSize: 30})
		done <- err
	}()
	select {
	case <-stall.stalled:
	case err := <-done:
		t.Fatalf("the bulk ended before its tenth instance: %v", err)
	}
	// The batch has cancelled its first nine instances, in id order, and holds their rows.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '60s'`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, expand(`UPDATE {schema}.instances SET priority = 3 WHERE id = $1`, e.schema), first)
	require.NoError(t, err, "the stopped client's batch still held the row")
	require.NoError(t, tx.Commit(ctx))

	stall.release()
	err = <-done
	require.ErrorContains(t, err, "batch 1")
	require.ErrorContains(t, err, "untouched")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status <> 'available'`), "the batch rolled back whole")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE id = $1 AND priority = 3`, first))
}
