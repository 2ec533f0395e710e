package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
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
// stay on the cluster's main disk), a ballast file takes every free byte of that disk at 20% of
// the run and keeps it for 5s (full: 60s); then it goes (refusedWrites says the run and the
// pass). Writes that need a new block fail with disk_full (53100); those that fit in their
// pages go through.
func TestDiskFullLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db := privateCluster(t, nil)
	disk := smallDisk(t, cluster, db, 64<<20)
	refusedWrites(t, cluster, db, writeFault{test: "T21", code: "53100", logged: "No space left on device",
		on: func() {
			wrote, err := disk.Fill()
			require.NoError(t, err)
			left, err := disk.Available()
			require.NoError(t, err)
			t.Logf("the disk is full: ballast %d kB, %d bytes left", wrote/1024, left)
		},
		off: func() { require.NoError(t, disk.Free()) }})
}

// T21b of the reliability plan: the server refuses every write for a while, as a managed
// Postgres does when its storage runs out or an operator does for maintenance:
// default_transaction_read_only goes on for every session (ALTER SYSTEM and a reload) at 20% of
// the run, for 5s (full: 60s), then off. Every write fails with read_only_sql_transaction
// (25006), the reads go on (refusedWrites says the run and the pass).
func TestReadOnlyServerLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db := privateCluster(t, nil)
	readOnly := func(on bool) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, cluster.URL)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		_, err = conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET default_transaction_read_only = %t", on))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
	}
	refusedWrites(t, cluster, db, writeFault{test: "T21b", code: "25006", logged: "in a read-only transaction",
		on: func() { readOnly(true) }, off: func() { readOnly(false) }})
}

// T22 of the reliability plan: an operator locks the instances table for longer than a lease
// (VACUUM FULL, an ALTER TABLE, a CREATE INDEX without CONCURRENTLY, a repack's swap): a
// transaction holds it ACCESS EXCLUSIVE at 20% of the run for 5s (full: 60s; the workers' lease
// is 2s), then rolls back. Every statement on the table waits for it: picks give up at their lock
// timeout, beats and commits at their deadlines, and the running steps are cancelled once their
// beats failed for a lease; Inserts wait. Pass: statements waited for the table; no Insert failed
// and one waited through the spell; everything done within 60s of the spell's end, no worker
// restarted; I1-I8 (refusedWrites says the run).
func TestTableLockedPastTheLeaseLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db := privateCluster(t, nil)
	ctx := context.Background()
	var tx pgx.Tx
	refusedWrites(t, cluster, db, writeFault{test: "T22", blocks: true,
		on: func() {
			var err error
			tx, err = db.pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, expand(`LOCK TABLE {schema}.instances IN ACCESS EXCLUSIVE MODE`, db.schema))
			require.NoError(t, err)
		},
		off: func() { require.NoError(t, tx.Rollback(ctx)) }})
}

// writeFault is a spell in which the server refuses writes: on starts it, off ends it; code is
// the SQLSTATE of each refused write and logged what the server logs for one. A fault that
// blocks (a lock) makes writers wait instead: no write is refused, and an Insert waits through
// the spell.
type writeFault struct {
	test, code, logged string
	blocks             bool
	on, off            func()
}

// refusedWrites runs a spell of f on cluster: two worker processes run linear5 instances (CI
// 1,000; full 5,000) while an inserter adds one every 20ms; at 20% of the steps the spell begins
// and lasts 5s (full: 60s). Pass: the fault bit (the server logged refused writes, and some
// Inserts failed); each failed Insert failed with f.code and inserted nothing; everything
// inserted is done within 60s of the spell's end, with no worker process restarted (each drains
// on SIGTERM); I1-I8.
func refusedWrites(t *testing.T, cluster *devdb.DB, db *chaosDB, f writeFault) {
	t.Helper()
	r := startWriteFaultRun(t, cluster, db, f.test)
	n, spell, ins := r.n, r.spell, r.ins
	f.on()
	t.Logf("20%%: the fault is on for %v", spell)
	time.Sleep(spell)
	if f.blocks {
		// The fault bit: the workers' statements wait on it.
		waiting := db.count(t, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '{schema}.instances'::regclass`)
		t.Logf("%d statements wait for the table at the end of the spell", waiting)
		require.Positive(t, waiting, "nothing waited for the table: the fault did not bite")
	}
	refusedInSpell := ins.refusedSoFar()
	f.off()
	ended := time.Now()
	t.Log("the fault is off")

	// Some more arrivals after the spell, then the inserter stops.
	time.Sleep(time.Second)
	inserted, refused, longest := ins.stop()
	total := n + len(inserted)
	db.waitDone(t, total, 60*time.Second)
	t.Logf("all %d done %v after the spell; %d Inserts refused during it, %d accepted in all, the longest took %v",
		total, time.Since(ended).Round(time.Millisecond), refusedInSpell, len(inserted), longest.Round(time.Millisecond))
	if f.blocks {
		// An Insert waited through the spell, and none failed for it.
		require.Empty(t, refused, "an Insert failed while the table was locked")
		require.Greater(t, longest, spell/2, "no Insert waited for the lock")
		require.Equal(t, total, db.count(t, `SELECT count(*) FROM {schema}.instances`))
		r.judge(t, db, total)
		return
	}

	// The fault bit: the server refused writes, inserts among them.
	log, err := cluster.ServerLog()
	require.NoError(t, err)
	k := strings.Count(log, f.logged)
	t.Logf("the server logged %d refused writes", k)
	require.Positive(t, k, "the server never refused a write: the fault did not bite")
	require.Positive(t, refusedInSpell, "no Insert failed during the spell")
	t.Logf("an Insert refused: %v", refused[0])
	for _, err := range refused {
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr) && pgErr.Code == f.code, "an Insert failed, but not with %s: %v", f.code, err)
	}
	// A refused Insert inserted nothing: the table holds exactly the accepted ones.
	require.Equal(t, total, db.count(t, `SELECT count(*) FROM {schema}.instances`), "a refused Insert left a row")
	r.judge(t, db, total)
}

// T23 of the reliability plan: the write-ahead log's disk fills up. On a private cluster whose
// WAL lives on a small disk of its own (a 160 MB tmpfs), a replication slot nothing reads is
// created at 20% of the run (how it happens: a standby or a logical consumer gone), so the
// server keeps every segment from then on; the checkup reports the slot; a ballast file takes
// every free byte of the disk, and a batch job beside the engine writes until the server needs
// a new segment and cannot create one. The server PANICs and cuts every session, and its crash
// restart fails, or PANICs again, while the disk stays full. After 5s (full: 60s) of that, the
// operator's fix: the ballast goes, the server is started if it stopped, the slot is dropped.
// Pass: the fault bit (the server logged a PANIC for want of space); everything inserted is done
// within 60s of the fix, with no worker process restarted (each drains on SIGTERM); the table
// holds every accepted Insert and at most the failed ones besides (a commit cut off by the crash
// has no known outcome); I1-I8. Mounting needs root: elsewhere the test skips, except under
// CI=true, where .ci/run runs it as root.
func TestWALDiskFullLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("the WAL's disk is a tmpfs, and mounting one needs root")
	}
	cluster, db := privateCluster(t, map[string]string{"min_wal_size": "32MB", "max_wal_size": "64MB"})
	ctx := context.Background()
	disk, err := cluster.MoveWAL(ctx, 160<<20)
	require.NoError(t, err)
	db.pool.Reset() // its connections went with the restart
	batch, err := pgx.Connect(ctx, cluster.URL)
	require.NoError(t, err)
	defer func() { _ = batch.Close(ctx) }()
	// The batch job's rows: 1 MB of text each, stored as is (no compression), so that each
	// writes about a megabyte of WAL.
	_, err = batch.Exec(ctx, `CREATE TABLE public.batch (b text); ALTER TABLE public.batch ALTER b SET STORAGE EXTERNAL`)
	require.NoError(t, err)

	r := startWriteFaultRun(t, cluster, db, "T23")
	_, err = db.pool.Exec(ctx, `SELECT pg_create_physical_replication_slot('gd_forgotten', true)`)
	require.NoError(t, err)
	cl, err := gendurable.NewClient(db.pool, &gendurable.Config{Schema: db.schema})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the checkup to report the slot", func() bool {
		fs, err := cl.Checkup(ctx, &gendurable.CheckupOpts{SlotWAL: 1})
		require.NoError(t, err)
		return slices.ContainsFunc(fs, func(f gendurable.Finding) bool {
			return f.Check == "slot" && strings.HasPrefix(f.Summary, "replication slot gd_forgotten (physical)")
		})
	})
	wrote, err := disk.Fill()
	require.NoError(t, err)
	t.Logf("20%%: a slot keeps the WAL, and the WAL's disk is full (ballast %d MB)", wrote>>20)
	mb := 0
	for ; mb < 1000; mb++ {
		if _, err = batch.Exec(ctx, `INSERT INTO public.batch SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 32768)`); err != nil {
			break
		}
	}
	require.Error(t, err, "the batch job wrote 1 GB of WAL on a full disk: the fault did not bite")
	t.Logf("the batch job was cut off after %d MB: %v", mb, err)
	time.Sleep(r.spell)

	// The operator's fix: free the space, start the server if its crash restart gave up, drop
	// the slot.
	require.NoError(t, disk.Free())
	eventually(t, time.Minute, "the server back", func() bool {
		if !cluster.Running() {
			t.Log("the server stopped: starting it")
			require.NoError(t, cluster.Start(ctx))
		}
		conn, err := pgx.Connect(ctx, cluster.URL)
		if err != nil {
			return false
		}
		defer func() { _ = conn.Close(ctx) }()
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot('gd_forgotten')`)
		return err == nil
	})
	fixed := time.Now()
	db.pool.Reset()
	t.Log("the disk is free, the server up and the slot dropped")

	time.Sleep(time.Second) // some more arrivals
	inserted, refused, _ := r.ins.stop()
	log, err := cluster.ServerLog()
	require.NoError(t, err)
	panics := strings.Count(log, "PANIC:")
	t.Logf("the server logged %d PANICs, %d No space left on device; %d Inserts accepted, %d failed", panics,
		strings.Count(log, "No space left on device"), len(inserted), len(refused))
	require.Positive(t, panics, "the server never PANICked: the fault did not bite")
	require.Contains(t, log, "No space left on device")
	r.judge(t, db, settle(t, db, r.n, inserted, refused, fixed))
}

// settle ends a run whose failed Inserts may have committed (the fault cut their connection
// during the commit): the table holds the n instances inserted first, every accepted Insert's
// and at most the failed ones' besides; all of them are done within 60s of since. It returns
// how many there are.
func settle(t *testing.T, db *chaosDB, n int, inserted []int64, refused []error, since time.Time) int {
	t.Helper()
	total := db.count(t, `SELECT count(*) FROM {schema}.instances`)
	require.GreaterOrEqual(t, total, n+len(inserted), "an accepted Insert left no row")
	require.LessOrEqual(t, total, n+len(inserted)+len(refused), "rows no Insert made")
	db.waitDone(t, total, 60*time.Second)
	t.Logf("all %d done %v after the fault", total, time.Since(since).Round(time.Millisecond))
	return total
}

// T24 of the reliability plan: the server's connections run out. On a private cluster with
// max_connections 50 (the workers' pools and the test's take up to 40), another application (the
// hog) takes every free connection at 20% of the run and keeps the server full for 5s (full: 60s):
// every 100ms it terminates the engine's sessions (found by application_name) and takes the slots
// they free, so the workers' pools reconnect against a full server and are refused ("sorry, too
// many clients already", 53300) unless they beat the hog to a slot. Then it lets every connection
// go. Pass: the server refused connections besides the hog's own last tries; the table holds every
// accepted Insert and at most the failed ones besides; everything is done within 60s of the spell's
// end, with no worker process restarted (each drains on SIGTERM); I1-I8.
func TestConnectionsRunOutLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db := privateCluster(t, map[string]string{"max_connections": "50"})
	ctx := context.Background()
	r := startWriteFaultRun(t, cluster, db, "T24")
	var hog []*pgx.Conn
	hogRefused := 0
	// grab connects until the server refuses, which it must do for want of slots.
	grab := func() {
		for {
			c, err := pgx.Connect(ctx, cluster.URL+"&application_name=hog")
			if err != nil {
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr) && pgErr.Code == "53300", "the hog was refused, but not for want of slots: %v", err)
				hogRefused++
				return
			}
			hog = append(hog, c)
		}
	}
	defer func() {
		for _, c := range hog {
			_ = c.Close(ctx)
		}
	}()
	// The server's log from here on says whom it refused.
	before, err := cluster.ServerLog()
	require.NoError(t, err)
	grab()
	require.NotEmpty(t, hog, "the server was full before the hog came")
	t.Logf("20%%: the hog holds the %d free connections, for %v", len(hog), r.spell)
	killed := 0
	for end := time.Now().Add(r.spell); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var k int
		require.NoError(t, hog[0].QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name LIKE 'gd-t24-%'`).Scan(&k))
		killed += k
		grab()
	}
	held := len(hog)
	for _, c := range hog {
		require.NoError(t, c.Close(ctx))
	}
	hog = nil
	ended := time.Now()

	time.Sleep(time.Second) // some more arrivals
	inserted, refused, _ := r.ins.stop()
	log, err := cluster.ServerLog()
	require.NoError(t, err)
	tooMany := strings.Count(log[len(before):], "sorry, too many clients already")
	t.Logf("the hog ended holding %d connections; it terminated %d of the engine's sessions; the server refused %d connections, %d of them the hog's; %d Inserts accepted, %d failed",
		held, killed, tooMany, hogRefused, len(inserted), len(refused))
	require.Positive(t, killed, "the hog terminated none of the engine's sessions")
	require.Greater(t, tooMany, hogRefused, "the server refused no connection but the hog's: the fault did not bite")
	r.judge(t, db, settle(t, db, r.n, inserted, refused, ended))
}

// inserter inserts a chaos instance every 20ms from a client of its own until stopped, and
// keeps what each Insert returned.
type inserter struct {
	mu            sync.Mutex
	inserted      []int64
	refused       []error
	longest       time.Duration // the longest Insert
	quit, stopped chan struct{}
	once          sync.Once
}

func startInserter(t *testing.T, db *chaosDB) *inserter {
	t.Helper()
	cl, err := gendurable.NewClient(db.pool, &gendurable.Config{Schema: db.schema})
	require.NoError(t, err)
	m := chaosMachine(nil, db.schema, 0, 0, 0)
	ins := &inserter{quit: make(chan struct{}), stopped: make(chan struct{})}
	t.Cleanup(func() { ins.stop() }) // a test that failed before stopping it
	go func() {
		defer close(ins.stopped)
		for {
			select {
			case <-ins.quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			began := time.Now()
			r, err := cl.Insert(context.Background(), m.With(path{}), nil)
			ins.mu.Lock()
			ins.longest = max(ins.longest, time.Since(began))
			if err != nil {
				ins.refused = append(ins.refused, err)
			} else {
				ins.inserted = append(ins.inserted, r.ID)
			}
			ins.mu.Unlock()
		}
	}()
	return ins
}

// refusedSoFar is how many Inserts failed so far.
func (ins *inserter) refusedSoFar() int {
	ins.mu.Lock()
	defer ins.mu.Unlock()
	return len(ins.refused)
}

// stop stops the inserter and returns the ids it inserted, the errors of the Inserts that
// failed and the longest Insert.
func (ins *inserter) stop() ([]int64, []error, time.Duration) {
	ins.once.Do(func() { close(ins.quit) })
	<-ins.stopped
	ins.mu.Lock()
	defer ins.mu.Unlock()
	return ins.inserted, ins.refused, ins.longest
}

// writeFaultRun is a write fault's run under way: n linear5 instances (CI 1,000; full 5,000)
// worked by two worker processes while an inserter adds one every 20ms; the fault lasts spell,
// 5s (full: 60s). kills counts the worker processes the test killed (judge reports them).
type writeFaultRun struct {
	test    string
	seed    uint64
	began   time.Time
	n       int
	spell   time.Duration
	workers []*worker
	ins     *inserter
	kills   int
}

// startWriteFaultRun inserts the run's instances and starts its workers (steps of 10ms, 8 at
// once, then set) and inserter; it returns at 20% of the steps, when the fault begins.
func startWriteFaultRun(t *testing.T, cluster *devdb.DB, db *chaosDB, test string, set ...func(*workerCfg)) *writeFaultRun {
	t.Helper()
	seed, _ := oracle.Seed(t)
	r := &writeFaultRun{test: test, seed: seed, began: time.Now(), n: oracle.Size(1000, 5000),
		spell: time.Duration(oracle.Size(5, 60)) * time.Second}
	db.insert(t, r.n, 5)
	r.workers = []*worker{
		writeFaultWorker(t, cluster.URL, db.schema, test, "w0", seed, set...),
		writeFaultWorker(t, cluster.URL, db.schema, test, "w1", seed, set...),
	}
	r.ins = startInserter(t, db)
	db.waitProgress(t, r.n, 0.2, 2*time.Minute)
	return r
}

// writeFaultWorker starts a worker process of a write fault's run on the database at url: steps
// of 10ms, 8 at once, then set; its engine pool's application name is gd-<test>-<name>.
func writeFaultWorker(t *testing.T, url, schema, test, name string, seed uint64, set ...func(*workerCfg)) *worker {
	t.Helper()
	return startWorker(t, chaosCfg(url, url, schema, name, func(c *workerCfg) {
		c.StepMS, c.Conc, c.Seed, c.Quiet, c.App = 10, 8, seed, true, "gd-"+strings.ToLower(test)+"-"+name
		for _, f := range set {
			f(c)
		}
	}))
}

// judge ends the run: the workers drain on SIGTERM, and the oracle judges its total instances.
func (r *writeFaultRun) judge(t *testing.T, db *chaosDB, total int) {
	t.Helper()
	var reports []workerReport
	for _, w := range r.workers {
		reports = append(reports, w.term(t))
	}
	st := sum(reports...)
	violations, dup := db.check(t, total)
	oracle.Report(t, oracle.Summary{Test: r.test, Seed: r.seed, Instances: total, Kills: r.kills, Faults: 1, Violations: violations,
		Lost: total - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(st.steps()) / time.Since(r.began).Seconds(), Seconds: time.Since(r.began).Seconds()})
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
