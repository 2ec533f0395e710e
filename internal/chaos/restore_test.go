package chaos

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// T26 of the reliability plan: the database is restored from a backup taken while the workers
// ran, as after losing the server, or on moving to another. The run of T21 on a private
// cluster; at 20% of the steps the inserter stops and pg_dump takes a backup of the database
// (one snapshot, the workers still running); the run goes on for a second, and then the
// workers are killed (the old server is gone with what it did after the backup). The backup is
// restored (pg_restore) into a new database on the same server, and two workers of the same
// names start against it. What the backup holds is the truth now: rows claimed then still say
// executing, under leases of the old workers; steps finished after the backup run again. Pass:
// the restored database holds every instance the backup could hold (the inserter stopped before
// it began) with some not yet done; all of them are done within two minutes of the restore (a
// restarted worker reclaims its predecessor's claims once they have gone unextended for half a
// lease; the reaper releases the rest when their leases end); the new workers drain on SIGTERM;
// I1-I8 on the restored database.
func TestRestoredBackupLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db := privateCluster(t, nil)
	ctx := context.Background()
	r := startWriteFaultRun(t, cluster, db, "T26")
	inserted, refused, _ := r.ins.stop()
	require.Empty(t, refused, "an Insert failed before the backup")
	dump := filepath.Join(t.TempDir(), "backup.dump")
	pgDump, err := cluster.Program("pg_dump")
	require.NoError(t, err)
	out, err := exec.CommandContext(ctx, pgDump, "--format=custom", "--file="+dump, "--dbname="+cluster.URL).CombinedOutput()
	require.NoError(t, err, "pg_dump: %s", out)
	time.Sleep(time.Second) // the old server goes on working past the backup
	for _, w := range r.workers {
		w.kill()
	}
	r.kills = len(r.workers)
	lostWork := db.count(t, `SELECT count(*) FROM {schema}.t_effects`) // what the old server had done
	t.Logf("20%%: backup taken while the workers ran; the workers are killed a second later")

	// The new server: a database of its own, restored from the backup.
	_, err = db.pool.Exec(ctx, `CREATE DATABASE restored`)
	require.NoError(t, err)
	url := strings.Replace(cluster.URL, "/postgres?", "/restored?", 1)
	pgRestore, err := cluster.Program("pg_restore")
	require.NoError(t, err)
	out, err = exec.CommandContext(ctx, pgRestore, "--exit-on-error", "--dbname="+url, dump).CombinedOutput()
	require.NoError(t, err, "pg_restore: %s", out)
	restoredAt := time.Now()
	cfg, err := poolConfig(url, "test-"+t.Name()+"-restored", 8, "")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rdb := &chaosDB{url: url, pool: pool, schema: db.schema, cluster: cluster}

	total := rdb.count(t, `SELECT count(*) FROM {schema}.instances`)
	require.Equal(t, r.n+len(inserted), total, "the backup does not hold every instance inserted before it")
	left := rdb.count(t, `SELECT count(*) FROM {schema}.instances WHERE status <> 'done'`)
	claimed := rdb.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`)
	t.Logf("the restored database holds %d instances, %d of them not done, %d claimed by the old workers", total, left, claimed)
	require.Positive(t, left, "the backup was taken after the run")
	lostWork -= rdb.count(t, `SELECT count(*) FROM {schema}.t_effects`)
	t.Logf("%d steps the old server ran after the backup are not in it: they run again", lostWork)
	require.Positive(t, lostWork, "the old server did nothing after the backup: the restore loses no work")

	r.workers = []*worker{writeFaultWorker(t, url, db.schema, "T26", "w0", r.seed), writeFaultWorker(t, url, db.schema, "T26", "w1", r.seed)}
	rdb.waitDone(t, total, 2*time.Minute)
	t.Logf("all %d done %v after the restore", total, time.Since(restoredAt).Round(time.Millisecond))
	r.judge(t, rdb, total)
}
