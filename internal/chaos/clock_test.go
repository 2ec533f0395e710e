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
	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// timeColumns are the instance and bucket columns that hold points in time.
var timeColumns = regexp.MustCompile(`\b(locked_until|scheduled_at|await_deadline|finalized_at|inserted_at|updated_at)\b`)

// comparison finds an ordering comparison.
var comparison = regexp.MustCompile(`(<=|>=|<|>)`)

// T12, the static half: every lease, due-time and deadline comparison in the engine's SQL is
// against the database clock (now()), so no node's clock takes part in deciding whether a lease
// ran out, a row is due or a deadline passed. Every statement line that compares a time column
// must use now(); the few exceptions are listed here with the reason each is not such a
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
		"explain.sql: AND (a.priority, a.scheduled_at, a.id) < (me.priority, me.scheduled_at, me.id)": "row order",
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
			if strings.Contains(code, "now()") {
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

// T12, the live half: two worker processes whose time zones are 26 hours apart (TZ and the
// sessions' TimeZone, +14 and -12) run linear5, rows scheduled 1.5 s ahead by the database
// clock, and awaits that time out after 1 s. Their Go clocks cannot be set apart without a clock
// the engine does not have (it reads its clock only for durations: see the Go half); a time-zone
// skew is what a process can be given from outside, and it would break any statement that read
// local time. Pass: no (id, step, attempt) ran in both processes (no premature reclaim); no
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
	for range sched {
		params = append(params, gendurable.InsertManyParams{Input: stamp.With("x"), Opts: &gendurable.InsertOpts{In: 1500 * time.Millisecond}})
	}
	for range awaits {
		params = append(params, gendurable.InsertManyParams{Input: timed.With(walkState{})})
	}
	_, err := ins.InsertMany(ctx, params)
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
