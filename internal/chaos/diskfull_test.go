package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// T21 of the reliability plan: the disk fills up. On a private cluster whose engine tables and
// indexes live on a small disk of their own (a tmpfs tablespace; the WAL and the oracle's tables
// stay on the cluster's main disk), two worker processes run linear5 instances (CI 1,000; full
// 5,000) while an inserter adds one every 20ms. At 20% of the steps a ballast file takes every
// free byte of that disk and keeps it for 5s (full: 60s); then the ballast goes. Pass: the fault
// bit (the server logged writes that found no space, and some Inserts failed); each failed
// Insert failed with disk_full (53100) and inserted nothing; everything inserted is done within
// 60s of the space coming back, with no worker process restarted; I1-I8.
func TestDiskFullLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	seed, _ := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	cluster, db := privateCluster(t, nil)
	disk := smallDisk(t, cluster, db, 64<<20)
	n := oracle.Size(1000, 5000)
	full := time.Duration(oracle.Size(5, 60)) * time.Second
	db.insert(t, n, 5)

	cfg := func(name string) workerCfg {
		return chaosCfg(cluster.URL, cluster.URL, db.schema, name, func(c *workerCfg) {
			c.StepMS, c.Conc, c.Seed, c.Quiet, c.App = 10, 8, seed, true, "gd-t21-"+name
		})
	}
	workers := []*worker{startWorker(t, cfg("w0")), startWorker(t, cfg("w1"))}

	// The inserter: one Insert every 20ms from the test's client, until stopped.
	cl, err := gendurable.NewClient(db.pool, &gendurable.Config{Schema: db.schema})
	require.NoError(t, err)
	m := chaosMachine(nil, db.schema, 0, 0, 0)
	var (
		mu       sync.Mutex
		inserted []int64
		refused  []error
	)
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r, err := cl.Insert(ctx, m.With(path{}), nil)
			mu.Lock()
			if err != nil {
				refused = append(refused, err)
			} else {
				inserted = append(inserted, r.ID)
			}
			mu.Unlock()
		}
	}()

	db.waitProgress(t, n, 0.2, 2*time.Minute)
	wrote, err := disk.Fill()
	require.NoError(t, err)
	left, err := disk.Available()
	require.NoError(t, err)
	t.Logf("20%%: the disk is full (ballast %d kB, %d bytes left); it stays full for %v", wrote/1024, left, full)
	time.Sleep(full)
	mu.Lock()
	refusedWhileFull := len(refused)
	mu.Unlock()
	require.NoError(t, disk.Free())
	freed := time.Now()
	t.Log("the ballast is gone")

	// Some more arrivals on the freed disk, then the inserter stops.
	time.Sleep(time.Second)
	close(quit)
	<-stopped
	total := n + len(inserted)
	db.waitDone(t, total, 60*time.Second)
	t.Logf("all %d done %v after the space came back; %d Inserts refused while the disk was full, %d accepted in all",
		total, time.Since(freed).Round(time.Millisecond), refusedWhileFull, len(inserted))

	// The fault bit: Postgres refused writes for want of space, inserts among them.
	log, err := cluster.ServerLog()
	require.NoError(t, err)
	noSpace := strings.Count(log, "No space left on device")
	t.Logf("the server logged %d writes that found no space", noSpace)
	require.Positive(t, noSpace, "the disk never refused a write: the fault did not bite")
	require.Positive(t, refusedWhileFull, "no Insert failed while the disk was full")
	t.Logf("an Insert refused: %v", refused[0])
	for _, err := range refused {
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr) && pgErr.Code == "53100", "an Insert failed, but not for want of space: %v", err)
	}
	// A refused Insert inserted nothing: the table holds exactly the accepted ones.
	require.Equal(t, total, db.count(t, `SELECT count(*) FROM {schema}.instances`), "a refused Insert left a row")

	var reports []workerReport
	for _, w := range workers {
		reports = append(reports, w.term(t))
	}
	st := sum(reports...)
	violations, dup := db.check(t, total)
	oracle.Report(t, oracle.Summary{Test: "T21", Seed: seed, Instances: total, Faults: 1, Violations: violations,
		Lost: total - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(st.steps()) / time.Since(began).Seconds(), Seconds: time.Since(began).Seconds()})
	t.Logf("stale outcomes %d, failed commit tries %d (unknown outcome %d)", st.stale(), st.CommitFailed, st.Unknown)
}

// smallDisk gives the cluster a disk of size bytes (a tmpfs tablespace) and moves the engine's
// tables and indexes in db's schema onto it; the oracle's (t_*) stay where they are. Mounting
// needs root: elsewhere the test skips, except under CI=true, where .ci/run runs it as root.
func smallDisk(t *testing.T, cluster *devdb.DB, db *chaosDB, size int64) *devdb.Disk {
	t.Helper()
	ctx := context.Background()
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("a disk of the cluster's own is a tmpfs, and mounting one needs root")
	}
	disk, err := cluster.AddDisk(ctx, "small", size)
	require.NoError(t, err)
	rows, err := db.pool.Query(ctx, `SELECT CASE c.relkind WHEN 'i' THEN 'INDEX' ELSE 'TABLE' END, c.relname
		FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
		LEFT JOIN pg_index x ON x.indexrelid = c.oid
		LEFT JOIN pg_class tbl ON tbl.oid = x.indrelid
		WHERE s.nspname = $1 AND c.relkind IN ('r', 'i') AND coalesce(tbl.relname, c.relname) NOT LIKE 't\_%'`, db.schema)
	require.NoError(t, err)
	type rel struct{ Kind, Name string }
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rel])
	require.NoError(t, err)
	moved := map[string]int{}
	for _, r := range rels {
		_, err := db.pool.Exec(ctx, fmt.Sprintf("ALTER %s %s SET TABLESPACE %s", r.Kind,
			pgx.Identifier{db.schema, r.Name}.Sanitize(), pgx.Identifier{disk.Tablespace}.Sanitize()))
		require.NoError(t, err)
		moved[r.Kind]++
	}
	require.Positive(t, moved["TABLE"])
	require.Positive(t, moved["INDEX"])
	t.Logf("%d tables and %d indexes on a disk of %d MB", moved["TABLE"], moved["INDEX"], size>>20)
	return disk
}
