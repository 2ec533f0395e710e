package chaos

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/logrecord"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// T28 of the reliability plan: the server's NOTIFY queue fills up. A session that LISTENs and
// then sits in a transaction reads no notification until it ends, and every notification the
// server takes meanwhile stays queued behind it (8 GB on Postgres 15). Once the queue is full,
// every transaction that notified fails at its commit: with PokePostgres, an InsertTx's poke
// rides the caller's transaction, so the caller's own writes would be lost with it. On a
// private cluster, such a session holds the queue while batches of notifications (160 MB each)
// fill it past half, 4.3 GB on the cluster's disk (full size: until the server refuses them, 8 GB); then callers' transactions each write
// a row of their own and InsertTx an instance. Every one commits, with its row and its instance;
// the worker, which works the queue on another client, runs every instance (its poll finds
// them); the inserting client says once why its pokes no longer ride. At the full size a
// transaction that notifies by itself fails at its commit, so the fault bites. The session's
// session ends, and pokes ride transactions again.
func TestNotifyQueueFullLosesNothing(t *testing.T) {
	cluster, db := privateCluster(t, nil)
	ctx := context.Background()
	_, err := db.pool.Exec(ctx, expand(`CREATE TABLE {schema}.t_orders (id int PRIMARY KEY)`, db.schema))
	require.NoError(t, err)
	job := gendurable.Job[int]{Name: "t28", Queue: "t28", Perform: func(*gendurable.Ctx, int) error { return nil }}
	worker, err := gendurable.NewClient(db.pool, &gendurable.Config{Name: "worker", Schema: db.schema,
		Machines: []gendurable.Machine{job}, Poke: gendurable.PokePostgres(), PollInterval: 200 * time.Millisecond,
		Queues: map[string]gendurable.QueueConfig{"t28": {Concurrency: 8}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	start(t, worker)
	logs := &logrecord.Recorder{}
	web, err := gendurable.NewClient(db.pool, &gendurable.Config{Name: "web", Schema: db.schema,
		Machines: []gendurable.Machine{job}, Poke: gendurable.PokePostgres(), Logger: slog.New(logs)})
	require.NoError(t, err)
	start(t, web)

	order := 0
	// insertTx is a caller's transaction: a row of its own, and an instance inserted with it.
	insertTx := func() (int64, error) {
		order++
		tx, err := db.pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, expand(`INSERT INTO {schema}.t_orders VALUES ($1)`, db.schema), order); err != nil {
			return 0, err
		}
		res, err := web.InsertTx(ctx, tx, job.With(order), nil)
		if err != nil {
			return 0, err
		}
		return res.ID, tx.Commit(ctx)
	}
	usage := func() float64 {
		var u float64
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT pg_notification_queue_usage()`).Scan(&u))
		return u
	}
	var ids []int64
	id, err := insertTx()
	require.NoError(t, err)
	ids = append(ids, id)

	// The stuck session: it listens, then sits in a transaction.
	stuck, err := pgx.Connect(ctx, cluster.URL)
	require.NoError(t, err)
	defer func() { _ = stuck.Close(context.Background()) }()
	_, err = stuck.Exec(ctx, "LISTEN t28_stuck")
	require.NoError(t, err)
	stx, err := stuck.Begin(ctx)
	require.NoError(t, err)
	_, err = stx.Exec(ctx, "SELECT 1") // the transaction ends with the session, below
	require.NoError(t, err)
	// Each batch is 20,000 notifications of 7,968 bytes, all different (a transaction sends
	// identical ones once, and keeps them in memory until it commits): 1/52 of the queue.
	began := time.Now()
	for batch := 1; ; batch++ {
		_, err := db.pool.Exec(ctx, `SELECT count(pg_notify('t28_stuck', repeat(md5(($1::int * 1000000 + g)::text), 249)))
			FROM generate_series(1, 20000) AS g`, batch)
		if err != nil {
			require.ErrorContains(t, err, "too many notifications in the NOTIFY queue", "batch %d", batch)
			break
		}
		if !oracle.Full() && usage() >= 0.5 {
			break
		}
	}
	filled := usage()
	t.Logf("the NOTIFY queue is %.4f full after %v", filled, time.Since(began).Round(time.Millisecond))
	require.GreaterOrEqual(t, filled, 0.5)
	if oracle.Full() {
		// The fault bites: a transaction that notifies fails at its commit, and its writes are lost.
		tx, err := db.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, expand(`INSERT INTO {schema}.t_orders VALUES (-1)`, db.schema))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT pg_notify('t28_other', 'x')`)
		require.NoError(t, err)
		require.ErrorContains(t, tx.Commit(ctx), "too many notifications in the NOTIFY queue")
	}

	n := oracle.Size(20, 200)
	for range n {
		id, err := insertTx()
		require.NoError(t, err, "a caller's transaction failed while the NOTIFY queue was %.4f full", filled)
		ids = append(ids, id)
	}
	said := func(prefix string) int {
		n := 0
		for _, r := range logs.Records() {
			if strings.HasPrefix(r.Message, prefix) {
				n++
			}
		}
		return n
	}
	require.Equal(t, 1, said("gendurable: the server's NOTIFY queue is filling up"),
		"the inserting client says once why its pokes no longer ride")

	// The session ends (read, the queue would be gigabytes to take in): the queue's tail moves
	// past what it held once the other listeners have read as far (reading the usage moves it),
	// and pokes ride again.
	require.NoError(t, stuck.Close(ctx))
	eventually(t, oracle.Size(time.Minute, 5*time.Minute), "the queue read", func() bool { return usage() < 0.5 })
	// The client reads the usage again within half a second of its last reading.
	for said("gendurable: pokes ride callers' transactions again") == 0 {
		require.Less(t, order, 1000, "the inserting client never read the emptied queue")
		id, err = insertTx()
		require.NoError(t, err)
		ids = append(ids, id)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 1, said("gendurable: pokes ride callers' transactions again"))

	var rows, done int
	eventually(t, time.Minute, "every instance done", func() bool {
		require.NoError(t, db.pool.QueryRow(ctx, expand(`SELECT (SELECT count(*) FROM {schema}.t_orders),
			(SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'done')`, db.schema), ids).Scan(&rows, &done))
		return done == len(ids)
	})
	require.Equal(t, order, rows, "every caller's row committed")
	require.Equal(t, len(ids), done)
}
