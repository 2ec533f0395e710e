package gendurable_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// countsDisagree compares, in one statement (one snapshot), the finished counts QueueStats reads
// with the rows themselves, and returns the (queue, status) pairs where they differ.
const countsDisagree = `
SELECT coalesce(string_agg(format('%s/%s: counted %s, rows %s', queue, status, c, r), '; '), '')
FROM (SELECT coalesce(c.queue, r.queue) AS queue, coalesce(c.status, r.status) AS status,
             coalesce(c.n, 0) AS c, coalesce(r.n, 0) AS r
      FROM (SELECT queue, status::text AS status, sum(n) AS n FROM {schema}.finished_counts GROUP BY 1, 2) AS c
      FULL JOIN (SELECT queue, status::text AS status, count(*) AS n FROM {schema}.instances
                 WHERE status IN ('done', 'failed', 'cancelled') GROUP BY 1, 2) AS r
        ON c.queue = r.queue AND c.status = r.status) AS d
WHERE c <> r`

// The finished counts equal the finished rows in every snapshot while two nodes work, fail and
// finish instances, an operator cancels live ones and retries failed ones, both nodes' GC deletes
// expired ones and folds the counts at once, and raw SQL deletes some: every path that moves a
// row into or out of a finished status is counted in the transaction that moves it.
func TestFinishedCountsMatchTheRowsInEverySnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	perform := func(_ *gendurable.Ctx, c chore) error {
		if c.Fails {
			return fmt.Errorf("chore %d failed", c.N)
		}
		return nil
	}
	a := gendurable.Job[chore]{Name: "a", Queue: "a", MaxAttempts: 1, Perform: perform, Retention: time.Second}
	b := gendurable.Job[chore]{Name: "b", Queue: "b", MaxAttempts: 1, Perform: perform}
	var nodes []*gendurable.Client
	for i := range 2 {
		cl := e.client(t, &gendurable.Config{Name: fmt.Sprintf("node%d", i), Machines: []gendurable.Machine{a, b},
			Queues: map[string]gendurable.QueueConfig{"a": {}, "b": {}}, Lease: time.Second,
			GC: &gendurable.GCConfig{Interval: 20 * time.Millisecond, Retention: time.Hour}})
		start(t, cl)
		nodes = append(nodes, cl)
	}
	op := nodes[0]

	const total = 3000
	var inserted atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	loop := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := f(); err != nil {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
			}
		}()
	}
	loop("insert", func() error {
		if inserted.Load() >= total {
			time.Sleep(time.Millisecond)
			return nil
		}
		params := make([]gendurable.InsertManyParams, 50)
		for i := range params {
			n := int(inserted.Load()) + i
			job := a
			if n%3 == 0 {
				job = b
			}
			params[i] = gendurable.InsertManyParams{Input: job.With(chore{N: n, Fails: n%5 == 0})}
			if n%7 == 0 {
				params[i].Opts = &gendurable.InsertOpts{In: 50 * time.Millisecond}
			}
		}
		_, err := op.InsertMany(ctx, params)
		inserted.Add(int64(len(params)))
		return err
	})
	// pick returns a random instance in status, while the inserts go on (0: none, or done).
	pick := func(status string) int64 {
		time.Sleep(2 * time.Millisecond)
		var id int64
		if inserted.Load() < total {
			_ = e.pool.QueryRow(ctx, expand(`SELECT id FROM {schema}.instances WHERE status = $1::text::{schema}.status
				ORDER BY random() LIMIT 1`, e.schema), status).Scan(&id)
		}
		return id
	}
	// Either may lose a race with a worker or the GC: ErrWrongStatus and ErrNotFound are answers.
	loop("cancel", func() error {
		if id := pick("available"); id != 0 {
			_ = op.Cancel(ctx, id, "test")
		}
		return nil
	})
	loop("retry", func() error {
		if id := pick([]string{"failed", "cancelled"}[rand.IntN(2)]); id != 0 {
			_ = op.Retry(ctx, id, nil)
		}
		return nil
	})
	loop("delete", func() error {
		time.Sleep(5 * time.Millisecond)
		_, err := e.pool.Exec(ctx, expand(`DELETE FROM {schema}.instances WHERE id IN
			(SELECT id FROM {schema}.instances WHERE queue = 'b' AND status = 'done' ORDER BY random() LIMIT 5)`, e.schema))
		return err
	})
	var checks atomic.Int64
	loop("check", func() error {
		var diff string
		if err := e.pool.QueryRow(ctx, expand(countsDisagree, e.schema)).Scan(&diff); err != nil {
			return err
		}
		if diff != "" {
			return fmt.Errorf("counts differ from the rows: %s", diff)
		}
		checks.Add(1)
		return nil
	})

	// Run until everything inserted has finished and GC has deleted some of queue a's.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var live, gone int
		require.NoError(t, e.pool.QueryRow(ctx, expand(`SELECT
			(SELECT count(*) FROM {schema}.instances WHERE status NOT IN ('done', 'failed', 'cancelled')),
			$1 - (SELECT count(*) FROM {schema}.instances)`, e.schema), total).Scan(&live, &gone))
		if inserted.Load() >= total && live == 0 && gone > total/3 {
			break
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "not settled: %d live, %d gone", live, gone)
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	require.Positive(t, checks.Load())
	t.Logf("%d snapshots compared", checks.Load())

	// Once GC has deleted every finished instance of a (retention 1s) nothing changes any more:
	// QueueStats reads the same counts as the rows say (a's all gone), and folding keeps them.
	eventually(t, 20*time.Second, "a's finished instances deleted", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE queue = 'a'`) == 0
	})
	want := map[string]map[gendurable.Status]int64{"b": {}}
	for _, s := range []gendurable.Status{gendurable.StatusDone, gendurable.StatusFailed, gendurable.StatusCancelled} {
		want["b"][s] = int64(e.count(t, `SELECT count(*) FROM {schema}.instances WHERE queue = 'b' AND status = $1::text::{schema}.status`, string(s)))
	}
	require.Positive(t, want["b"][gendurable.StatusDone])
	require.Positive(t, want["b"][gendurable.StatusFailed])
	for range 2 {
		stats, err := op.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: []gendurable.Status{
			gendurable.StatusDone, gendurable.StatusFailed, gendurable.StatusCancelled}})
		require.NoError(t, err)
		got := map[string]map[gendurable.Status]int64{}
		for _, s := range stats {
			got[s.Queue] = s.Counts
		}
		require.Equal(t, want, got)
		e.exec(t, `WITH f AS (DELETE FROM {schema}.finished_counts RETURNING queue, status, n)
			INSERT INTO {schema}.finished_counts (queue, status, n) SELECT queue, status, sum(n) FROM f GROUP BY 1, 2`)
	}
	// GC's folds leave at most one row per queue and status once nothing changes.
	eventually(t, 10*time.Second, "counts folded", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.finished_counts`) <= 3
	})
}
