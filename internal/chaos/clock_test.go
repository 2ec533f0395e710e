package chaos

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// timeColumns are the instance and bucket columns that hold points in time.
var timeColumns = regexp.MustCompile(`\b(locked_until|scheduled_at|await_deadline|finalized_at|inserted_at|updated_at)\b`)

// comparison finds an ordering comparison.
var comparison = regexp.MustCompile(`(<=|>=|<|>)`)

// T12, the static half: every lease, due-time and deadline comparison in the engine's SQL is
// against the database clock (now(), or clock_timestamp()), so no node's clock takes part in
// deciding whether a lease ran out, a row is due or a deadline passed. Every statement line that
// compares a time column must use one of them; the few exceptions are listed here with the reason each is not such a
// comparison.
func TestEveryTimeComparisonUsesTheDatabaseClock(t *testing.T) {
	exceptions := map[string]string{
		// Keyset paging of the GC's sweep: the cursor is a finalized_at value the previous batch
		// read from the database, not a clock reading.
		"maintenance.sql: AND (i.machine, i.finalized_at, i.id) > (@machine::text, @after_at::timestamptz, @after_id::bigint)": "cursor",
		// The operator's list filter (CLI --since): a bound the operator gives, computed by the
		// CLI from its own clock. It selects rows to show, never decides a lease, a due time or
		// a deadline; a skewed CLI clock shifts the window it shows.
		"list.sql: AND inserted_at >= @since": "operator filter",
		// The bulk actions' time range: bounds the operator gives, as for the list.
		"bulk.sql: AND inserted_at >= @since": "operator filter",
		"bulk.sql: AND inserted_at < @until":  "operator filter",
		// Explain's count of the rows ahead of one: row against row, no clock.
		"explain.sql: AND (x.fair_tag, x.scheduled_at, x.id) < (me.fair_tag, me.scheduled_at, me.id)": "row order",
		"explain.sql: AND (x.scheduled_at, x.id) < (me.scheduled_at, me.id)":                          "row order",
		// Whether a row was due when last written: two of its own columns, no clock.
		"maintenance.sql: AND status = 'available' AND scheduled_at <= updated_at":       "row against itself",
		"maintenance.sql: AND i.status = 'available' AND i.scheduled_at <= i.updated_at": "row against itself",
		// Urgency order between two candidate rows of one pick: row against row, no clock.
		"pick.sql: WHERE d.ckey = c.ckey AND (d.priority, d.scheduled_at, d.id) < (c.priority, c.scheduled_at, c.id))": "row order",
	}
	files, err := filepath.Glob(filepath.Join("..", "store", "sql", "*.sql"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for n, line := range strings.Split(string(b), "\n") {
			code, _, _ := strings.Cut(line, "--")
			code = strings.TrimSpace(code)
			ops := strings.NewReplacer("<>", "", "->>", "", "->", "").Replace(code)
			if !timeColumns.MatchString(code) || !comparison.MatchString(ops) {
				continue
			}
			if strings.Contains(code, "SET ") || strings.HasPrefix(code, "ORDER BY") {
				continue
			}
			checked++
			// now() is the database clock at the transaction's start, clock_timestamp() as it
			// reads at the call.
			if strings.Contains(code, "now()") || strings.Contains(code, "clock_timestamp()") {
				continue
			}
			if _, ok := exceptions[filepath.Base(f)+": "+code]; ok {
				continue
			}
			t.Errorf("%s:%d compares a time column without the database clock: %s", filepath.Base(f), n+1, code)
		}
	}
	require.Greater(t, checked, 10, "the scan found the comparisons it is meant to check")

	// A time parameter is either one of these (each an absolute time a caller chose, or a value
	// read back from the database), or new and in need of a look.
	params := regexp.MustCompile(`[$@]\w+::timestamptz`)
	allowed := map[string]string{
		"insert.sql $6::timestamptz":               "InsertOpts.ScheduledAt: the caller's own absolute time",
		"outcome.sql @c_scheduled_at::timestamptz": "a spawned child's InsertOpts.ScheduledAt",
		"maintenance.sql @after_at::timestamptz":   "the GC cursor, read from the database",
		"schedule.sql @next::timestamptz":          "schedules' next fire times, computed from their claim's now()",
		"schedule.sql @last_fire::timestamptz":     "fire times, computed from their claim's now()",
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, p := range params.FindAllString(string(b), -1) {
			if _, ok := allowed[filepath.Base(f)+" "+p]; !ok {
				t.Errorf("%s: time parameter %s: does it carry a worker's clock into a comparison?", filepath.Base(f), p)
			}
		}
	}
}

// T12, the Go half: the packages that build statements (the store, the sweepers) read the wall
// clock only to measure durations. Every value they take from time.Now() is used nowhere but as
// the start of time.Since (which measures with the monotonic clock and is blind to wall-clock
// offsets) or as an event's timestamp for the hooks, so no time.Now()-derived value can reach a
// statement. (The client and the engine also keep local deadlines, such as how long Await holds
// its caller or a commit retries: timers of their own, never sent to the database; the SQL half
// above checks that no statement compares a time column with a parameter.)
func TestEngineUsesItsClockOnlyForDurations(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := []string{"internal/store", "internal/maintenance"}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		require.NoError(t, err)
		fset := token.NewFileSet()
		var parsed []*ast.File
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, 0)
			require.NoError(t, err)
			parsed = append(parsed, file)
		}
		for _, p := range checkClockUses(fset, parsed) {
			t.Error(p)
		}
	}
}

// The Go half's checker catches what it is meant to: a deadline computed from the worker's clock
// and handed to a statement, and a reading used in arithmetic.
func TestClockCheckerCatchesWallClockUse(t *testing.T) {
	src := `package p
import "time"
func f(db DB) {
	start := time.Now()
	_ = time.Since(start)
	deadline := time.Now().Add(time.Minute)
	db.Exec("UPDATE x SET due = $1", deadline)
	t0 := time.Now()
	db.Exec("SELECT $1", t0)
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	require.NoError(t, err)
	problems := checkClockUses(fset, []*ast.File{f})
	require.Len(t, problems, 2, "%v", problems)
	require.Contains(t, problems[0], "time.Now() used other than as a start time")
	require.Contains(t, problems[1], "t0 holds a wall-clock reading")
}

func isTimeNow(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	s, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := s.X.(*ast.Ident)
	return ok && id.Name == "time" && s.Sel.Name == "Now"
}

func nameOf(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return "." + x.Sel.Name
	}
	return ""
}

// checkClockUses finds the names (variables, fields, parameters) a package's files assign
// time.Now() to and fails for any use of them that is not time.Since(name), another assignment of
// time.Now() to them, passing them on to a start-time parameter or field, or an event's At.
func checkClockUses(fset *token.FileSet, files []*ast.File) (problems []string) {
	names := map[string]bool{}
	nowOK := map[*ast.CallExpr]bool{}
	// Functions of this file that take a start time: passing one on is fine, and the
	// parameter is then checked like the rest.
	takesTime := map[string]bool{}
	for _, f := range files {
		collectClockNames(f, names, nowOK, takesTime)
	}
	delete(names, "")
	for _, f := range files {
		ast.Inspect(f, clockVisitor(fset, names, nowOK, takesTime, &problems))
	}
	return problems
}

func collectClockNames(f *ast.File, names map[string]bool, nowOK map[*ast.CallExpr]bool, takesTime map[string]bool) {
	ast.Inspect(f, func(n ast.Node) bool {
		if fd, ok := n.(*ast.FuncDecl); ok {
			for _, p := range fd.Type.Params.List {
				if s, ok := p.Type.(*ast.SelectorExpr); ok && s.Sel.Name == "Time" {
					takesTime[fd.Name.Name] = true
					for _, id := range p.Names {
						names[id.Name] = true
					}
				}
			}
		}
		return true
	})
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			for i, r := range x.Rhs {
				if isTimeNow(r) && i < len(x.Lhs) {
					names[nameOf(x.Lhs[i])] = true
					nowOK[r.(*ast.CallExpr)] = true
				}
			}
		case *ast.KeyValueExpr:
			if isTimeNow(x.Value) {
				if k, ok := x.Key.(*ast.Ident); ok {
					names["."+k.Name] = true
					nowOK[x.Value.(*ast.CallExpr)] = true
				}
			}
		}
		return true
	})
}

func clockVisitor(fset *token.FileSet, names map[string]bool, nowOK map[*ast.CallExpr]bool, takesTime map[string]bool,
	problems *[]string) func(ast.Node) bool {
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			if isTimeNow(x) && !nowOK[x] {
				*problems = append(*problems, fmt.Sprintf("%s: time.Now() used other than as a start time", fset.Position(x.Pos())))
			}
			if s, ok := x.Fun.(*ast.SelectorExpr); ok {
				if id, ok := s.X.(*ast.Ident); ok && id.Name == "time" && s.Sel.Name == "Since" {
					return false // time.Since(start): a duration
				}
				if takesTime[s.Sel.Name] { // passing a start time on
					for _, a := range x.Args {
						if id, ok := a.(*ast.Ident); ok && names[id.Name] {
							continue
						}
						ast.Inspect(a, visit)
					}
					ast.Inspect(x.Fun, visit)
					return false
				}
			}
		case *ast.AssignStmt:
			for i, r := range x.Rhs {
				if isTimeNow(r) && i < len(x.Lhs) {
					return false
				}
			}
		case *ast.KeyValueExpr:
			if isTimeNow(x.Value) {
				return false
			}
			if k, ok := x.Key.(*ast.Ident); ok && names["."+k.Name] {
				if v, ok := x.Value.(*ast.Ident); ok && names[v.Name] {
					return false // started: started
				}
			}
		case *ast.Field:
			return false // a declaration, not a use
		case *ast.FuncDecl:
			if x.Type.Params != nil {
				ast.Inspect(x.Body, visit) // the parameter list itself is not a use
				return false
			}
		case *ast.Ident:
			if names[x.Name] {
				*problems = append(*problems, fmt.Sprintf("%s: %s holds a wall-clock reading and is used other than in time.Since",
					fset.Position(x.Pos()), x.Name))
			}
		case *ast.SelectorExpr:
			if n := "." + x.Sel.Name; names[n] && n != ".At" {
				*problems = append(*problems, fmt.Sprintf("%s: %s holds a wall-clock reading and is used other than in time.Since",
					fset.Position(x.Pos()), n))
			}
			ast.Inspect(x.X, visit)
			return false
		}
		return true
	}
	return visit
}

// timeWork is T12's clock-bound work: sched stamp jobs due 1.5s after their insert, and awaits
// timed instances whose await times out after 1s.
func timeWork(stamp gendurable.Job[string], timed gendurable.FSM[walkState], sched, awaits int) []gendurable.InsertManyParams {
	var params []gendurable.InsertManyParams
	for range sched {
		params = append(params, gendurable.InsertManyParams{Input: stamp.With("x"), Opts: &gendurable.InsertOpts{In: 1500 * time.Millisecond}})
	}
	for range awaits {
		params = append(params, gendurable.InsertManyParams{Input: timed.With(walkState{})})
	}
	return params
}

// T12, the live half: two worker processes whose time zones are 26 hours apart (TZ and the
// sessions' TimeZone, +14 and -12) run linear5, rows scheduled 1.5 s ahead by the database
// clock, and awaits that time out after 1 s. Their Go clocks cannot be set apart without a clock
// the engine does not have (it reads its clock only for durations: see the Go half); a time-zone
// skew is what a process can be given from outside, and it would break any statement that read
// local time. (TestWorkersOffTheDatabaseClockKeepLeasesHonest sets the database's clock minutes
// apart from the workers' instead.) Pass: no (id, step, attempt) ran in both processes (no premature reclaim); no
// scheduled row started before its scheduled_at by the database clock; every timeout fired
// within [1 s, 1 s + reaper interval + 700 ms] of its park (the plan's 200 ms of slack is too
// little on a shared 2-core machine; the lower bound is the point).
func TestTimezoneSkewedWorkersAgreeOnTime(t *testing.T) {
	t.Parallel()
	heavy.Lock()
	defer heavy.Unlock()
	seed, _ := oracle.Seed(t)
	e := newEnv(t, 8)
	ctx := context.Background()
	machines := stubMachines(e, "t12", 0, 0, seed)
	walk := machines[0].(gendurable.FSM[walkState])
	stamp := machines[3].(gendurable.Job[string])
	timed := machines[4].(gendurable.FSM[walkState])
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: machines})
	n, sched, awaits := oracle.Size(300, 2000), oracle.Size(50, 200), oracle.Size(50, 200)
	var params []gendurable.InsertManyParams
	for range n {
		params = append(params, gendurable.InsertManyParams{Input: walk.With(walkState{})})
	}
	_, err := ins.InsertMany(ctx, append(params, timeWork(stamp, timed, sched, awaits)...))
	require.NoError(t, err)
	var pids []int
	for i, tz := range []string{"Pacific/Kiritimati", "Etc/GMT+12"} {
		w := startWorker(t, workerCfg{Machines: machinesRaces, Conns: 5, FxConns: 3, URL: e.url,
			Schema: e.schema, Name: fmt.Sprint("tz", i), Queues: []string{"t12"},
			Conc: 8, PollMS: 50, LeaseMS: 2000, ReaperMS: 100, StepMinMS: 1, StepMaxMS: 3, Seed: seed + uint64(i)},
			"TZ="+tz, "PGTZ="+tz)
		pids = append(pids, w.pid())
		defer w.stop(t)
	}
	total := n + sched + awaits
	eventually(t, 2*time.Minute, "all done", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == total
	})
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM (SELECT id, step, attempt FROM {schema}.t_effects
		GROUP BY 1, 2, 3 HAVING count(DISTINCT pid) > 1) d`), "a step ran in both processes: a premature reclaim")
	require.Equal(t, 0, e.count(t, `SELECT count(*) FROM {schema}.instances i JOIN {schema}.t_effects f ON f.id = i.id
		WHERE i.machine = 'stamp' AND f.at < i.scheduled_at`), "a scheduled row started early by the database clock")
	// The timeout's wake as the log stamped it, against the parking step's effect (stamped before
	// the park's transaction began, whose now() + 1 s is the deadline: the wake may not come
	// sooner than 1 s after it) and against the park as the log stamped it (stamped after that
	// now(): the bound for lateness). All database clock.
	var lo, hi float64
	var fired int
	require.NoError(t, e.side.QueryRow(ctx, e.q(`SELECT count(*), min(early), max(late) FROM (
		SELECT extract(epoch FROM w.at - f.at)::float8 AS early, extract(epoch FROM w.at - p.at)::float8 AS late
		FROM {schema}.t_outcome_log p
		JOIN {schema}.t_outcome_log w ON w.id = p.id AND w.old_status = 'awaiting' AND w.new_status = 'available'
		JOIN {schema}.t_effects f ON f.id = p.id AND f.step = 's0'
		WHERE p.new_status = 'awaiting' AND p.old_status = 'executing') x`)).Scan(&fired, &lo, &hi))
	t.Logf("%d await timeouts fired at least %.3f s after the parking step and at most %.3f s after the park (timeout 1 s, reaper 100 ms)",
		fired, lo, hi)
	require.Equal(t, awaits, fired)
	require.GreaterOrEqual(t, lo, 1.0, "an await timed out early")
	require.LessOrEqual(t, hi, 1.0+0.1+0.7, "an await timed out late")
	require.Positive(t, e.count(t, `SELECT count(DISTINCT pid) FROM {schema}.t_effects`)-1, "both processes worked")
	e.check(t, oracle.Opts{N: total, Effects: true}, oracle.Summary{Seed: seed, Instances: total})
	_ = pids
}

// T12 with the clocks minutes apart: worker processes whose clocks run 10 minutes behind the
// database's (subtest "ahead": the database's clock is ahead) or ahead of it ("behind"). A Go
// process cannot be given a skewed clock from outside: libfaketime (LD_PRELOAD) changes what
// libc's clock functions answer, and Go reads the clock through the vDSO directly, never through
// libc. So the database's clock is the one skewed: a private cluster runs under libfaketime, and
// every worker's clock is then minutes off the one that judges leases, due times and deadlines.
//
// Three phases on each cluster, worked by two worker processes (races set, queue "clock": lease
// 2 s, heartbeat 400 ms, reaper 100 ms, poll 50 ms, steps of 450 to 650 ms, longer than a
// heartbeat interval, so that every claim lives on its heartbeats; a lease of 1 s ran out at the
// workers' cold start on a loaded machine, their first heartbeats timing out):
//
//  1. No live lease is stolen: 16 / 200 gatewalk instances (five steps each) run to the end with
//     no fault. Pass: no step ran twice, no row carries a lease error (the wait fails at the
//     first), no claim of either worker was released.
//  2. No expired lease is kept: per round (1 / 3), 16 / 100 more; one worker is SIGSTOPped while
//     a step runs in it under a claim its heartbeat has extended (the lease ends later than the
//     claim's time plus a lease), and stays stopped until the other has claimed again every row
//     it held. Pass: each of its claims was released by the other's reaper no sooner than the
//     lease the database last gave it ran out (locked_until, read once its statements had
//     finished) and within lease + reaper interval + 2 s of the pause, all by the database
//     clock; each was claimed again by the other worker; after SIGCONT, the outcome of every
//     step that had begun in it under those claims was dropped as stale. Over the whole run, the
//     live worker dropped no outcome and lost no claim; the paused one lost none but those; every
//     repeated effect and every (id, step, attempt) run in both processes is one of those
//     claims.
//  3. Due times and deadlines (alongside phase 1): 20 / 200 stamp rows inserted 1.5 s ahead
//     (InsertOpts.In) and 20 / 200 timed rows, whose await times out after 1 s. Pass: every
//     scheduled_at is 1.5 s after its insert's now() and no row was claimed before it; every
//     await deadline is 1 s after its park's now(), and each wake came no sooner than the
//     deadline and within reaper interval + 2 s of it (triggers record each scheduled_at and
//     deadline with the now() of the transaction that set it).
//
// And the oracle's I1 to I7 (I8 from the server log). The slack of the upper bounds is for a
// loaded 2-core machine; the lower bounds are exact, and a worker's clock that reached a
// statement would miss any of them by 10 minutes.
func TestWorkersOffTheDatabaseClockKeepLeasesHonest(t *testing.T) {
	t.Parallel()
	lib := libfaketime(t)
	for _, c := range []struct {
		name, offset string
		skew         time.Duration
	}{
		{"ahead", "+10m", 10 * time.Minute},
		{"behind", "-10m", -10 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clockSkewRun(t, lib, c.offset, c.skew)
		})
	}
}

// T25 of the reliability plan: the database server's clock steps ahead, as a host's does when
// time sync corrects it or a paused VM resumes. A private cluster runs under libfaketime with its
// offset read from a file at every clock read (so that every backend jumps at once, as on a real
// host); the run of T21 with steps of a second, 250 at once in each worker. At 20% of the steps
// the file's offset goes from +0 to +10m: every lease, due time and deadline in the rows is 10
// minutes behind the database's clock at once. The steps the jump found running are past their
// leases until the reaper releases them (their outcomes then stale) or their heartbeat extends
// them first; either is right, and which comes first is a race (the test logs how many were
// released). Pass: the database's clock jumped; the table holds every accepted Insert and at
// most the failed ones besides; everything is done within 60s of the jump, with no worker
// process restarted (a worker that slept until a time the database gave it would wait 10
// minutes); I1-I8.
func TestDatabaseClockJumpsAheadLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db, step := clockFileCluster(t, "+0", 0)
	r := startWriteFaultRun(t, cluster, db, "T25", func(c *workerCfg) { c.StepMS, c.Conc = 1000, 250 })
	step("+10m", 10*time.Minute)
	jumped := time.Now()
	t.Logf("20%%: the database's clock jumped 10 minutes ahead")

	// The steps the jump found running have leases 10 minutes past, until the reaper releases
	// them (their outcomes are then stale) or their heartbeat extends them first: either is right.
	time.Sleep(time.Second) // some more arrivals, on the new clock
	inserted, refused, _ := r.ins.stop()
	t.Logf("%d Inserts accepted, %d failed", len(inserted), len(refused))
	released := db.count(t, `SELECT count(*) FROM {schema}.t_outcome_log
		WHERE old_status = 'executing' AND new_status = 'available' AND new_step = old_step`)
	t.Logf("claims handed back with their step unchanged (the reaper's releases among them): %d", released)
	r.judge(t, db, settle(t, db, r.n, inserted, refused, jumped))
}

// T27 of the reliability plan: the database server's clock steps back, as a host's does when time
// sync corrects a clock that ran ahead. A private cluster's clock runs 10 minutes ahead (as in
// T25, the offset read from a file at every clock read) through T21's run and a rate-limited
// backlog in a schema of its own, worked by two clients of the test's through one bucket (50 a
// second, burst 20; more of the backlog goes in just before the step); at 20% of the steps the
// offset goes back to +0. Every due time, bucket and lease written until then is 10 minutes ahead
// of the clock: the backlog's rows would wait 10 minutes, and the bucket would refuse every grant
// for as long, but the reapers notice the step and make due the rows that were due when written,
// and the bucket counts as full. Pass: the database's clock stepped back; everything is done
// within 60s of the step, with no worker process restarted; I1-I8; the rate limit goes on from
// the new clock: its grants after the step come to what the rate allows in 5s (30s at full size)
// within a minute more, and once no transaction begun before the step is left, every window of
// them holds at most burst + rate × its length.
func TestDatabaseClockStepsBackLosesNothing(t *testing.T) {
	// A cluster of its own, offered a fixed load: it runs beside the other cluster tests.
	t.Parallel()
	cluster, db, step := clockFileCluster(t, "+10m", 10*time.Minute)
	ctx := context.Background()
	const allowed, periodMS, burst = 50, 1000, 20
	rated := &env{url: db.url, pool: openPool(t, db.url, 8), side: openPool(t, db.url, 2), started: time.Now()}
	rated.schema = durabledbtest.Schema(t, rated.pool)
	logRateGrants(t, rated)
	job := gendurable.Job[string]{Name: "rated", Queue: "rate", Perform: func(*gendurable.Ctx, string) error { return nil }}
	rates := map[string]gendurable.Rate{"api": {Allowed: allowed, Period: periodMS * time.Millisecond, Burst: burst}}
	ins := rated.client(t, &gendurable.Config{Name: "ins", Machines: []gendurable.Machine{job}, RateLimits: rates})
	backlog := func(n int) {
		params := make([]gendurable.InsertManyParams, n)
		for i := range params {
			params[i] = gendurable.InsertManyParams{Input: job.With("x"), Opts: &gendurable.InsertOpts{RateLimit: "api"}}
		}
		_, err := ins.InsertMany(ctx, params)
		require.NoError(t, err)
	}
	backlog(1000)
	var stops []func()
	for i := range 2 {
		cl := rated.client(t, &gendurable.Config{Name: fmt.Sprint("rated", i), Machines: []gendurable.Machine{job},
			RateLimits: rates, PollInterval: 20 * time.Millisecond, Queues: map[string]gendurable.QueueConfig{"rate": {Concurrency: 8}},
			Reaper: &gendurable.ReaperConfig{Interval: 200 * time.Millisecond}})
		stops = append(stops, start(t, cl))
	}

	r := startWriteFaultRun(t, cluster, db, "T27")
	backlog(3000) // what the rate grants after the step, and more, however long 20% took
	step("+0", 0)
	stepped := time.Now()
	since := db.now(t) // the step, by the new clock
	t.Logf("20%%: the database's clock stepped 10 minutes back")
	// A pick that began before the step and writes the bucket after one that began after it
	// may grant a burst more; from when no transaction begun before the step is left (their
	// start is 10 minutes ahead of the clock), the grants keep to the bucket exactly.
	eventually(t, 30*time.Second, "every transaction begun before the step to end", func() bool {
		return db.count(t, `SELECT count(*) FROM pg_stat_activity WHERE xact_start > now() + interval '5 minutes'`) == 0
	})
	settled := db.now(t)

	// Arrivals and grants on the new clock, until the grants since the step come to what the rate
	// allows in span. Stalled, the bucket would refuse every grant for 10 minutes; a busy machine
	// only slows the workers, so the test waits for the count rather than for a time.
	rate := float64(allowed) / (float64(periodMS) / 1000)
	span := oracle.Size(5*time.Second, 30*time.Second)
	want := int(rate * span.Seconds())
	eventually(t, span+time.Minute, fmt.Sprintf("%d grants since the step", want), func() bool {
		return rated.count(t, `SELECT count(*) FROM {schema}.t_grants WHERE tx_at < now() + interval '5 minutes'`) >= want
	})
	inserted, refused, _ := r.ins.stop()
	for _, stop := range stops {
		stop()
	}
	until := db.now(t)
	t.Logf("%d Inserts accepted, %d failed", len(inserted), len(refused))
	r.judge(t, db, settle(t, db, r.n, inserted, refused, stepped))
	var before int
	var doneAfter float64
	require.NoError(t, db.pool.QueryRow(ctx, expand(`SELECT count(*), extract(epoch FROM max(finalized_at) - $1)::float8
		FROM {schema}.instances WHERE inserted_at > now() + interval '5 minutes'`, db.schema), since).Scan(&before, &doneAfter))
	t.Logf("the %d instances inserted before the step were all done %.1fs after it", before, doneAfter)
	// The grants after the step: those stamped by the new clock (the earlier ones are 10 minutes
	// ahead of it).
	at := grantTimes(t, rated, `tx_at < now() + interval '5 minutes'`)
	t.Logf("%d grants in the %.1fs since the step (the rate allows %.0f, and the burst %d more)", len(at),
		until.Sub(since).Seconds(), rate*until.Sub(since).Seconds(), burst)
	settledAt := grantTimes(t, rated, `tx_at >= $1 AND tx_at < now() + interval '5 minutes'`, settled)
	worst := checkRateWindows(t, settledAt, allowed, periodMS, burst)
	t.Logf("%d grants from %.1fs after the step on, when no transaction begun before it was left; worst window excess %.2f tokens",
		len(settledAt), settled.Sub(since).Seconds(), worst)
}

// clockFileCluster starts a private cluster whose clock runs offset (libfaketime's form: "+0",
// "+10m") from this machine's, read from a file at every clock read so that every backend steps
// at once when it changes, as on a real host, and checks that its now() is want from this
// machine's clock. step changes the offset and waits until a new connection's now() is want off.
func clockFileCluster(t *testing.T, offset string, want time.Duration) (cluster *devdb.DB, db *chaosDB, step func(offset string, want time.Duration)) {
	t.Helper()
	lib := libfaketime(t)
	// Readable by the server, which may run as another user (t.TempDir's parent is not).
	dir, err := os.MkdirTemp("", "gd-faketime-")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	require.NoError(t, os.Chmod(dir, 0o755))
	file := filepath.Join(dir, "offset")
	require.NoError(t, os.WriteFile(file, []byte(offset+"\n"), 0o644))
	cluster, db = privateClusterWith(t, devdb.ClusterOptions{Env: []string{"LD_PRELOAD=" + lib,
		"FAKETIME_TIMESTAMP_FILE=" + file, "FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"}})
	ctx := context.Background()
	skew := func() time.Duration {
		// Every backend rereads the file within a second; a new connection's now() tells.
		conn, err := pgx.Connect(ctx, cluster.URL)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		var dbNow time.Time
		before := time.Now()
		require.NoError(t, conn.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))
		return dbNow.Sub(before)
	}
	require.InDelta(t, want.Seconds(), skew().Seconds(), 30, "the database's clock is not %s off: libfaketime did not take", offset)
	step = func(offset string, want time.Duration) {
		require.NoError(t, os.WriteFile(file, []byte(offset+"\n"), 0o644))
		eventually(t, 30*time.Second, "the database's clock to step to "+offset, func() bool {
			return (skew() - want).Abs() < 30*time.Second
		})
	}
	return cluster, db, step
}

// libfaketime returns the path of libfaketime's preload library (Debian's package libfaketime,
// which the faketime package brings). Without it the test skips, except under CI=true, where
// .ci/run must have installed it and its absence fails the test.
func libfaketime(t *testing.T) string {
	t.Helper()
	for _, g := range []string{"/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
		"/usr/lib64/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1"} {
		if m, _ := filepath.Glob(g); len(m) > 0 {
			return m[0]
		}
	}
	const why = "libfaketime is not installed (Debian: apt-get install faketime)"
	if os.Getenv("CI") == "true" {
		t.Fatal(why + " (CI=true: .ci/run must provide it)")
	}
	t.Skip(why)
	return ""
}

// skewedEnv starts a private cluster whose clock runs offset (libfaketime's FAKETIME: "+10m",
// "-10m") from this machine's, checks that the database's now() is that far off, and returns it
// as an env (migrated schema, oracle installed).
//
// The settings, and what libfaketime does to Postgres:
//   - FAKETIME=<offset>: a fixed offset, the clock running at its real rate (what a misset clock
//     is). libfaketime reads it from the environment again every 10 s (its cache); Postgres
//     moves its environment when it rewrites its process titles, and getenv still finds it, so
//     FAKETIME_NO_CACHE (which would parse it on every clock read) is not needed.
//   - FAKETIME_DONT_FAKE_MONOTONIC=1: the monotonic clock stays real. Faked, it reads the skewed
//     wall clock (seconds since 1970) in some calls and the real uptime in others (below), and
//     Postgres measures durations with it.
//   - The environment is pg_ctl's (devdb.ClusterOptions.Env), which the server inherits: pg_ctl
//     start -w compares the start time the postmaster writes in its pid file with its own clock,
//     and with only the server skewed behind, it would wait for a start it takes for an older
//     server's.
//
// What no setting changes: libfaketime answers the real clock to any code that runs while the
// thread is inside one of the calls it wraps (epoll_wait, select, poll, the sleeps), and so to a
// signal handler that interrupts such a wait. Postgres 15 judges its timeouts in its SIGALRM
// handler, which mostly runs while the backend waits: with the clock ahead, statement_timeout,
// lock_timeout and deadlock_timeout do not fire while it waits (they wait for the real clock to
// catch up); behind, an alarm that lands while it waits finds every armed timeout due, the
// later ones too. (The postmaster, which works
// in its signal handlers, also stamps some of its log lines with the real time.) The engine's
// only server-side timeout is a pick's lock_timeout, met only by a pick that waits on a
// concurrency key's or a gate's lock, and these machines use neither. now(), clock_timestamp()
// and every column default are read outside such waits, and are skewed.
func skewedEnv(t *testing.T, lib, offset string, want time.Duration) (*env, *chaosDB) {
	t.Helper()
	_, db := privateClusterWith(t, devdb.ClusterOptions{Env: []string{
		"LD_PRELOAD=" + lib, "FAKETIME=" + offset, "FAKETIME_DONT_FAKE_MONOTONIC=1"}})
	before := time.Now()
	skew := db.now(t).Sub(before)
	t.Logf("the database's clock runs %v from this machine's (FAKETIME=%s)", skew.Round(time.Millisecond), offset)
	require.InDelta(t, want.Seconds(), skew.Seconds(), 30, "the database's clock is not skewed as asked: libfaketime did not take")
	e := &env{url: db.url, pool: db.pool, side: openPool(t, db.url, 6), schema: db.schema, started: time.Now()}
	return e, db
}

// releasedClaim is a claim a paused worker held, and the lease end the database last gave it.
type releasedClaim struct {
	staleClaim
	until time.Time
}

// clockSkewRun is one subtest of TestWorkersOffTheDatabaseClockKeepLeasesHonest: its three
// phases on a cluster whose clock runs offset from the workers'.
func clockSkewRun(t *testing.T, lib, offset string, want time.Duration) {
	const (
		lease  = 2000 * time.Millisecond
		reaper = 100 * time.Millisecond
		slack  = 2 * time.Second
	)
	seed, _ := oracle.Seed(t)
	ctx := context.Background()
	e, db := skewedEnv(t, lib, offset, want)
	wait := oracle.Size(30*time.Second, 3*time.Minute) // for a phase's work (a bound on the test, not a measure)
	t.Cleanup(func() {
		if t.Failed() { // what is left, against the database's clock
			logUnfinished(t, e)
		}
	})
	// Every insert's scheduled_at and every park's deadline, with the now() of the transaction
	// that set it (the engine's is that now() plus the delay or the timeout).
	e.exec(t, `CREATE TABLE {schema}.t_due (id bigint NOT NULL, event text NOT NULL, due timestamptz,
		  txn_now timestamptz NOT NULL DEFAULT now(), at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE FUNCTION {schema}.t_log_due() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
		BEGIN
		  IF TG_OP = 'INSERT' THEN
		    INSERT INTO {schema}.t_due (id, event, due) VALUES (NEW.id, 'insert', NEW.scheduled_at);
		  ELSE
		    INSERT INTO {schema}.t_due (id, event, due) VALUES (NEW.id, 'park', NEW.await_deadline);
		  END IF;
		  RETURN NULL;
		END $fn$;
		CREATE TRIGGER t_log_insert AFTER INSERT ON {schema}.instances FOR EACH ROW EXECUTE FUNCTION {schema}.t_log_due();
		CREATE TRIGGER t_log_park AFTER UPDATE ON {schema}.instances FOR EACH ROW
		  WHEN (NEW.status = 'awaiting' AND OLD.status IS DISTINCT FROM 'awaiting') EXECUTE FUNCTION {schema}.t_log_due()`)
	machines := stubMachines(e, "clock", 0, 0, seed)
	walk := machines[0].(gendurable.FSM[walkState])
	stamp := machines[3].(gendurable.Job[string])
	timed := machines[4].(gendurable.FSM[walkState])
	ins := e.client(t, &gendurable.Config{Name: "ins", Machines: machines})
	insertWalks := func(n int) {
		params := make([]gendurable.InsertManyParams, n)
		for i := range params {
			params[i] = gendurable.InsertManyParams{Input: walk.With(walkState{})}
		}
		_, err := ins.InsertMany(ctx, params)
		require.NoError(t, err)
	}
	cfg := workerCfg{URL: e.url, Schema: e.schema, Machines: machinesRaces, Queues: []string{"clock"}, Conc: 12, Conns: 6,
		FxConns: 6, PollMS: 50, ReaperMS: int(reaper.Milliseconds()), StepMinMS: 450, StepMaxMS: 650, Seed: seed}
	leaseMS(int(lease.Milliseconds()))(&cfg)
	c := newCrew(t, e, 2, nil, cfg)
	a, b := c.workers[0], c.workers[1] // a is paused in phase 2; b never is

	// Phases 1 and 3: no fault.
	n, sched, awaits := oracle.Size(16, 200), oracle.Size(20, 200), oracle.Size(20, 200)
	_, err := ins.InsertMany(ctx, timeWork(stamp, timed, sched, awaits))
	require.NoError(t, err)
	insertWalks(n)
	total := n + sched + awaits
	waitLive(t, e, wait, "the fault-free phase done", func() bool { return doneCount(t, e) == total }, a.name, b.name)
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT 1 FROM {schema}.t_effects GROUP BY id, step HAVING count(*) > 1) d`),
		"a step ran twice with no worker faulted: a live lease was taken")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.instances WHERE errors @> '[{"kind":"lease"}]'`),
		"a live claim was released as expired")
	for _, w := range c.workers {
		lost, _ := claimEnds(t, e, w.name+":%")
		for l := range lost {
			logHistory(t, e, []int64{l.ID})
		}
		require.Empty(t, lost, "%s, live, lost claims", w.name)
	}
	// Due times: 1.5 s after the insert's now(), and no row claimed sooner.
	var started int
	var delayMin, delayMax, earliest float64
	require.NoError(t, e.side.QueryRow(ctx, e.q(`SELECT count(*), min(extract(epoch FROM d.due - d.txn_now)),
		       max(extract(epoch FROM d.due - d.txn_now)), min(extract(epoch FROM c.at - d.due))
		FROM {schema}.instances i
		JOIN {schema}.t_due d ON d.id = i.id AND d.event = 'insert'
		JOIN LATERAL (SELECT at FROM {schema}.t_outcome_log c WHERE c.id = i.id AND c.new_status = 'executing'
		              ORDER BY seq LIMIT 1) c ON true
		WHERE i.machine = 'stamp'`)).Scan(&started, &delayMin, &delayMax, &earliest))
	t.Logf("%d scheduled rows: due %.3f to %.3f s after their insert's now(), claimed %.3f s after their due time at the earliest",
		started, delayMin, delayMax, earliest)
	require.Equal(t, sched, started)
	require.GreaterOrEqual(t, delayMin, 1.5, "a row was scheduled less than 1.5 s after its insert by the database clock")
	require.LessOrEqual(t, delayMax, 1.75, "a row was scheduled more than 1.5 s after its insert by the database clock")
	require.GreaterOrEqual(t, earliest, 0.0, "a scheduled row was claimed before its scheduled_at by the database clock")
	// Deadlines: 1 s after the park by the database clock; each wake no sooner, and soon after.
	var fired int
	var deadlineMin, deadlineMax, wakeMin, wakeMax float64
	require.NoError(t, e.side.QueryRow(ctx, e.q(`SELECT count(*), min(extract(epoch FROM p.due - p.txn_now)),
		       max(extract(epoch FROM p.due - p.txn_now)), min(extract(epoch FROM w.at - p.due)),
		       max(extract(epoch FROM w.at - p.due))
		FROM {schema}.t_due p
		JOIN LATERAL (SELECT at FROM {schema}.t_outcome_log w WHERE w.id = p.id AND w.old_status = 'awaiting'
		              AND w.new_status = 'available' AND w.at >= p.at ORDER BY seq LIMIT 1) w ON true
		WHERE p.event = 'park'`)).Scan(&fired, &deadlineMin, &deadlineMax, &wakeMin, &wakeMax))
	t.Logf("%d await timeouts: deadlines %.3f to %.3f s after the park; woken %.3f to %.3f s after the deadline",
		fired, deadlineMin, deadlineMax, wakeMin, wakeMax)
	require.Equal(t, awaits, fired)
	require.GreaterOrEqual(t, deadlineMin, 1.0, "an await's deadline is less than its timeout after the park by the database clock")
	require.LessOrEqual(t, deadlineMax, 1.25, "an await's deadline is more than its timeout after the park by the database clock")
	require.GreaterOrEqual(t, wakeMin, 0.0, "an await timed out before its deadline by the database clock")
	require.LessOrEqual(t, wakeMax, (reaper + slack).Seconds(), "an await timed out late")

	// Phase 2: a paused worker's expired leases.
	rounds, perRound := oracle.Size(1, 3), oracle.Size(16, 100)
	app := a.app()
	// extended counts the rows a holds under claims whose step began in it and whose lease its
	// heartbeat has extended: the lease ends later than the claim's own (its time plus a lease).
	extended := func() int {
		return e.count(t, `SELECT count(*) FROM {schema}.instances i
			JOIN LATERAL (SELECT at FROM {schema}.t_outcome_log l WHERE l.id = i.id AND l.new_status = 'executing'
			              AND l.locked_by = i.locked_by ORDER BY seq DESC LIMIT 1) c ON true
			WHERE i.status = 'executing' AND starts_with(i.locked_by, $1)
			  AND i.locked_until > c.at + $2::bigint * interval '1 millisecond'
			  AND EXISTS (SELECT 1 FROM {schema}.t_effects f WHERE f.id = i.id AND f.step = i.step AND f.attempt = i.attempt
			              AND f.pid = $3)`, a.name+":", lease.Milliseconds(), a.pid())
	}
	var released []releasedClaim
	for round := range rounds {
		insertWalks(perRound)
		// Pause a while a step runs in it under a claim its heartbeat extended (one its pick gave
		// is judged the same, but the heartbeat is what keeps a claim). The database may show
		// such a claim whose outcome is on its way: look again once it is stopped and its
		// statements on the server have finished.
		var pausedAt time.Time
		var lastSeq int64
		var held []releasedClaim
		for {
			waitLive(t, e, 30*time.Second, a.name+" running a step under a claim its heartbeat extended",
				func() bool { return extended() > 0 }, b.name)
			c.pause(0)
			require.NoError(t, e.side.QueryRow(ctx, `SELECT now()`).Scan(&pausedAt))
			settled(t, e, app)
			if extended() > 0 {
				held, lastSeq = heldClaims(t, e, a.name)
				break
			}
			c.resume(0)
		}
		var last time.Time
		for _, h := range held {
			if h.until.After(last) {
				last = h.until
			}
		}
		t.Logf("round %d: %s paused holding %d claims, whose leases end at most %v after the pause by the database clock",
			round, a.name, len(held), last.Sub(pausedAt).Round(time.Millisecond))
		waitLive(t, e, 15*time.Second, "the claims of paused "+a.name+" released",
			func() bool { return executingBy(t, e, a.name) == 0 }, b.name)
		waitLive(t, e, 30*time.Second, "the claims of paused "+a.name+" claimed again by "+b.name, func() bool {
			return e.count(t, `SELECT count(*) FROM unnest($1::bigint[]) AS h(id) WHERE NOT EXISTS (
				SELECT 1 FROM {schema}.t_outcome_log l WHERE l.id = h.id AND l.seq > $2 AND l.new_status = 'executing'
				AND starts_with(l.locked_by, $3))`, claimIDs(held), lastSeq, b.name+":") == 0
		}, b.name)
		c.resume(0)
		worst := checkReleases(t, e, held, lastSeq, pausedAt, lease+reaper+slack)
		t.Logf("round %d: released %v to %v after the pause by the database clock (lease %v, reaper %v)",
			round, worst[0].Round(time.Millisecond), worst[1].Round(time.Millisecond), lease, reaper)
		released = append(released, held...)
		waitLive(t, e, wait, "the round done", func() bool { return doneCount(t, e) == total+(round+1)*perRound }, b.name)
	}
	ra, rb := a.term(t), b.term(t)

	// The paused worker dropped the late outcome of every step that had begun in it under a claim
	// it lost; it lost no other claim; the live one dropped nothing and lost nothing.
	stale := map[staleClaim]bool{}
	for _, s := range ra.StaleClaims {
		stale[s] = true
	}
	isReleased := map[staleClaim]bool{}
	began := 0
	for _, r := range released {
		isReleased[r.staleClaim] = true
		if e.count(t, `SELECT count(*) FROM {schema}.t_effects WHERE id = $1 AND step = $2 AND attempt = $3 AND pid = $4`,
			r.ID, r.Step, r.Attempt, a.pid()) > 0 {
			began++
			require.True(t, stale[r.staleClaim], "%s: the late outcome of %v was not dropped as stale", a.name, r.staleClaim)
		}
	}
	require.GreaterOrEqual(t, began, rounds, "every pause caught a step running in %s", a.name)
	lostA, _ := claimEnds(t, e, a.name+":%")
	for l := range lostA {
		require.True(t, isReleased[l], "%s lost claim %v while it was not paused", a.name, l)
	}
	lostB, _ := claimEnds(t, e, b.name+":%")
	require.Empty(t, lostB, "%s, never paused, lost claims", b.name)
	require.Zero(t, rb.stale(), "%s, never paused, dropped outcomes as stale", b.name)
	require.Positive(t, rb.Events[string(gendurable.EventHeartbeatBeat)], "%s's heartbeat extended its claims", b.name)
	t.Logf("%s: %d claims released while paused, %d of them with a step begun in it; outcome.stale %d; %s: outcome.stale %d",
		a.name, len(released), began, ra.stale(), b.name, rb.stale())
	// Every repeat is the paused worker's: no (id, step, attempt) ran in both processes but the
	// claims it lost, and every repeated effect has all but one of its runs from it.
	rows, err := e.side.Query(ctx, e.q(`SELECT id, step, attempt FROM {schema}.t_effects GROUP BY 1, 2, 3 HAVING count(DISTINCT pid) > 1`))
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var k staleClaim
		var attempt int32
		require.NoError(t, rows.Scan(&k.ID, &k.Step, &attempt))
		k.Attempt = int64(attempt)
		require.True(t, isReleased[k], "%v ran in both processes, and was no claim of a paused worker", k)
	}
	require.NoError(t, rows.Err())
	require.Zero(t, unexplainedDuplicates(t, e, c.faulted, nil), "unexplained duplicate effects")

	all := total + rounds*perRound
	v, err := oracle.Check(ctx, e.pool, e.schema, oracle.Opts{N: all, Effects: true, Counter: true,
		Paths: map[string][]string{"gatewalk": linearPath}})
	require.NoError(t, err)
	deadlocks := db.deadlocks(t)
	oracle.Report(t, oracle.Summary{Test: "T12 clock skew " + t.Name()[strings.LastIndex(t.Name(), "/")+1:], Seed: seed,
		Instances: all, Pauses: c.pauses, Violations: len(v), Lost: all - doneCount(t, e), Deadlocks: deadlocks,
		Seconds: time.Since(e.started).Seconds()})
	require.Empty(t, v, "oracle violations")
	require.Zero(t, deadlocks, "I8: the server logged deadlocks")
}

// heldClaims reads the claims the worker named name holds, with their lease ends, and the outcome
// log's last sequence number: what comes after it for these rows is their release.
func heldClaims(t *testing.T, e *env, name string) ([]releasedClaim, int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.side.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var seq int64
	require.NoError(t, tx.QueryRow(ctx, e.q(`SELECT coalesce(max(seq), 0) FROM {schema}.t_outcome_log`)).Scan(&seq))
	rows, err := tx.Query(ctx, e.q(`SELECT id, step, attempt, locked_until FROM {schema}.instances
		WHERE status = 'executing' AND starts_with(locked_by, $1) ORDER BY id`), name+":")
	require.NoError(t, err)
	var held []releasedClaim
	for rows.Next() {
		var r releasedClaim
		var attempt int32
		require.NoError(t, rows.Scan(&r.ID, &r.Step, &attempt, &r.until))
		r.Attempt = int64(attempt)
		held = append(held, r)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, held)
	return held, seq
}

func claimIDs(cs []releasedClaim) []int64 {
	ids := make([]int64, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return ids
}

// checkReleases checks, from the outcome log, that each claim in held (read after the outcome
// log's sequence number seq) was next released by the reaper as expired, no sooner than its
// lease's end and within bound of pausedAt, all by the database clock. It returns the earliest
// and the latest release, after pausedAt.
func checkReleases(t *testing.T, e *env, held []releasedClaim, seq int64, pausedAt time.Time, bound time.Duration) [2]time.Duration {
	t.Helper()
	worst := [2]time.Duration{time.Hour, -time.Hour}
	for _, h := range held {
		var oldStatus, newStatus, newStep string
		var at time.Time
		var leaseError bool
		require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT l.old_status, l.new_status, l.new_step, l.at,
			       EXISTS (SELECT 1 FROM {schema}.instances i, jsonb_array_elements(coalesce(i.errors, '[]')) AS x
			               WHERE i.id = l.id AND x ->> 'kind' = 'lease' AND x ->> 'step' = $3 AND (x ->> 'attempt')::int = $4)
			FROM {schema}.t_outcome_log l WHERE l.id = $1 AND l.seq > $2 ORDER BY l.seq LIMIT 1`), h.ID, seq, h.Step, h.Attempt).
			Scan(&oldStatus, &newStatus, &newStep, &at, &leaseError))
		require.True(t, oldStatus == "executing" && newStatus == "available" && newStep == h.Step && leaseError,
			"claim %v of the paused worker next went %s -> %s at step %s (lease error recorded: %v), not released as expired",
			h.staleClaim, oldStatus, newStatus, newStep, leaseError)
		require.False(t, at.Before(h.until), "claim %v released at %v, before its lease ran out at %v by the database clock",
			h.staleClaim, at, h.until)
		require.LessOrEqual(t, at.Sub(pausedAt), bound, "claim %v released %v after the pause, by the database clock",
			h.staleClaim, at.Sub(pausedAt))
		worst[0], worst[1] = min(worst[0], at.Sub(pausedAt)), max(worst[1], at.Sub(pausedAt))
	}
	return worst
}

// waitLive waits like eventually until cond holds, and fails at once if meanwhile a claim of one
// of the live workers named is released as expired (a lease error naming it as the claim's owner).
func waitLive(t *testing.T, e *env, timeout time.Duration, what string, cond func() bool, live ...string) {
	t.Helper()
	eventually(t, timeout, what, func() bool {
		for _, name := range live {
			var ids []int64
			require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT coalesce(array_agg(DISTINCT i.id), '{}')
				FROM {schema}.instances i, jsonb_array_elements(coalesce(i.errors, '[]')) AS x
				WHERE x ->> 'kind' = 'lease' AND position('worker ' || $1 || ':' in x ->> 'error') > 0`), name).Scan(&ids))
			if len(ids) > 0 {
				logHistory(t, e, ids)
				t.Fatalf("waiting for %s: claims of live worker %s were released as expired (instances %v)", what, name, ids)
			}
		}
		return cond()
	})
}

// logUnfinished logs the instances not done, by machine and status, with how far their due
// times, deadlines and leases are from the database's now(), and the error histories.
func logUnfinished(t *testing.T, e *env) {
	var histories []string
	if err := e.side.QueryRow(context.Background(), e.q(`SELECT coalesce(array_agg(format('%s %s %s: %s', id, machine, status,
		errors) ORDER BY id), '{}') FROM (SELECT * FROM {schema}.instances WHERE errors IS NOT NULL ORDER BY id LIMIT 20) i`)).
		Scan(&histories); err != nil {
		t.Logf("error histories: %v", err)
	}
	for _, h := range histories {
		t.Logf("error history: %s", h)
	}
	rows, err := e.side.Query(context.Background(), e.q(`SELECT machine, status::text, count(*),
		       coalesce(min(scheduled_at - now())::text, '-'), coalesce(min(await_deadline - now())::text, '-'),
		       coalesce(max(locked_until - now())::text, '-')
		FROM {schema}.instances WHERE status <> 'done' GROUP BY 1, 2 ORDER BY 1, 2`))
	if err != nil {
		t.Logf("unfinished instances: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var machine, status, due, deadline, lease string
		var n int
		if err := rows.Scan(&machine, &status, &n, &due, &deadline, &lease); err != nil {
			t.Logf("unfinished instances: %v", err)
			return
		}
		t.Logf("not done: %d %s %s (by the database clock: due in %s at the soonest, deadline in %s, lease ends in %s at the latest)",
			n, machine, status, due, deadline, lease)
	}
}

// settled waits until no backend of the connections named app runs a statement or holds an open
// transaction that wrote or locked rows (one with a transaction id): a paused worker's statements
// sent before the pause have finished, and none of its rows' changes is left to commit. (A
// transaction of its reaper may stay open, stopped between its statements, so long as it has
// released nothing.) It fails naming what they are doing if that takes 10 s.
func settled(t *testing.T, e *env, app string) {
	t.Helper()
	if !idle(t, e, app, true, 10*time.Second) {
		var what []string
		require.NoError(t, e.side.QueryRow(context.Background(), `SELECT array_agg(format('%s (%s %s, xid %s): %s', state,
			wait_event_type, wait_event, backend_xid, left(query, 200))) `+busyBackends(true), app).Scan(&what))
		t.Fatalf("%s's statements on the server did not finish within 10s: %q", app, what)
	}
}

// logHistory logs the outcome log's rows of the instances ids, and their error histories.
func logHistory(t *testing.T, e *env, ids []int64) {
	t.Helper()
	var rows []string
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT array_agg(format('%s #%s %s: %s/%s -> %s/%s attempt %s by %s',
		l.at, l.seq, l.id, l.old_status, l.old_step, l.new_status, l.new_step, l.attempt, l.locked_by) ORDER BY l.id, l.seq)
		FROM {schema}.t_outcome_log l WHERE l.id = ANY($1)`), ids).Scan(&rows))
	for _, r := range rows {
		t.Log(r)
	}
	var errs []string
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT coalesce(array_agg(format('%s %s: %s', id, machine, errors)), '{}')
		FROM {schema}.instances WHERE id = ANY($1)`), ids).Scan(&errs))
	for _, r := range errs {
		t.Log(r)
	}
	var effects []string
	require.NoError(t, e.side.QueryRow(context.Background(), e.q(`SELECT coalesce(array_agg(format('%s effect %s %s attempt %s in pid %s',
		at, id, step, attempt, pid) ORDER BY id, at), '{}') FROM {schema}.t_effects WHERE id = ANY($1)`), ids).Scan(&effects))
	for _, r := range effects {
		t.Log(r)
	}
}
