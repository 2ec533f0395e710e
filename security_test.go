package gendurable_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The security suite, T15 of docs/reliability.md: least privilege, the search_path hijack,
// secrets, tenant scoping.

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// runtimeGrants reads the grants and settings of the runtime role from the operations guide (the
// sql block that follows "-- grants for the runtime role"), so that the guide and this test cannot
// differ, and returns its statements (but CREATE ROLE) with the guide's names replaced by schema
// and role.
func runtimeGrants(t *testing.T, schema, role string) []string {
	t.Helper()
	b, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```sql\n-- grants for the runtime role\n(.*?)```").FindSubmatch(b)
	require.NotNil(t, m, "docs/operations.md has no grants block")
	var out []string
	for _, stmt := range strings.Split(string(m[1]), ";") {
		stmt = strings.TrimSpace(stmt)
		if stmt == "" || strings.HasPrefix(stmt, "--") || strings.HasPrefix(stmt, "CREATE ROLE") {
			continue
		}
		stmt = strings.ReplaceAll(stmt, "gendurable_runtime", pgx.Identifier{role}.Sanitize())
		stmt = regexp.MustCompile(`\bgendurable\b`).ReplaceAllString(stmt, pgx.Identifier{schema}.Sanitize())
		out = append(out, stmt)
	}
	require.NotEmpty(t, out)
	return out
}

// runtimeRole creates a login role with exactly the guide's grants on the env's schema (and
// nothing else: no superuser, no CREATE anywhere), and returns a pool that connects as it. The
// role is dropped, and the pool closed, when the test ends.
func runtimeRole(t *testing.T, e *env, settings ...string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	role, password := "gd_rt_"+randHex(6), randHex(16)
	quoted := pgx.Identifier{role}.Sanitize()
	// The password is hex, so it can stand in the statement text (DDL takes no parameters).
	_, err := e.pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS`, quoted, password))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.Background()
		// Privileges first (DROP OWNED revokes them in this database), then the role.
		_, err := e.pool.Exec(ctx, "DROP OWNED BY "+quoted)
		require.NoError(t, err)
		_, err = e.pool.Exec(ctx, "DROP ROLE "+quoted)
		require.NoError(t, err)
	})
	for _, stmt := range runtimeGrants(t, e.schema, role) {
		_, err := e.pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	for _, s := range settings {
		_, err := e.pool.Exec(ctx, "ALTER ROLE "+quoted+" SET "+s)
		require.NoError(t, err)
	}
	cfg, err := pgxpool.ParseConfig(durabledbtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, role
}

// logSink collects a client's logs (slog's text handler at its default level, Info) and every
// event it emits, and answers whether a string occurs in them.
type logSink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	events []gendurable.Event
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) hook(ev gendurable.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, ev)
}

func (s *logSink) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// eventText is every event as text, error included, one per line.
func (s *logSink) eventText(skip func(gendurable.Event) bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, ev := range s.events {
		if skip != nil && skip(ev) {
			continue
		}
		fmt.Fprintf(&b, "%+v err=%v\n", ev, ev.Err)
	}
	return b.String()
}

// finishedDone reports whether the client committed an outcome that finished instance id as
// done (step.finished, Outcome "done").
func (s *logSink) finishedDone(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range s.events {
		if ev.Name == gendurable.EventStepFinished && ev.InstanceID == id && ev.Outcome == "done" {
			return true
		}
	}
	return false
}

func (s *logSink) config(cfg *gendurable.Config) *gendurable.Config {
	cfg.Logger = slog.New(slog.NewTextHandler(s, nil))
	cfg.Hooks = append(cfg.Hooks, s.hook)
	return cfg
}

// smokeState is the state of the smoke suite's machines.
type smokeState struct {
	N      int    `json:"n"`
	Secret string `json:"secret,omitempty"`
}

// smoke runs the smoke suite through cl (started by the caller) and returns when all of it has
// finished: 20 linear5 instances, 5 parked instances woken by signals (by id and by key), a
// fan-out of 5 children, a cancel, a retry, an await timeout fired by the reaper, a gated and a
// rate-limited step, and a GC sweep that deletes finished rows. Every instance must end as
// expected. The client must be configured through sink (its events tell an instance GC deleted
// after it finished from one that never did); checkLogs also checks its logs and events for
// permission errors.
func smoke(t *testing.T, cl *gendurable.Client, m smokeMachines, sink *logSink, checkLogs bool) {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	for i := range 20 {
		ids = append(ids, insertOK(t, cl, m.linear.With(path{}), &gendurable.InsertOpts{CorrelationKey: fmt.Sprint("lin-", i)}))
	}
	var parked []int64
	for i := range 5 {
		parked = append(parked, insertOK(t, cl, m.parker.With(smokeState{N: i}), &gendurable.InsertOpts{CorrelationKey: fmt.Sprint("park-", i)}))
	}
	parent := insertOK(t, cl, m.parent.With(smokeState{}), nil)
	gated := insertOK(t, cl, m.gated.With(smokeState{}), &gendurable.InsertOpts{ConcurrencyKey: "stripe:t1", RateLimit: "mail:t1"})
	timed := insertOK(t, cl, m.timed.With(smokeState{}), nil)
	doomed := insertOK(t, cl, m.parker.With(smokeState{}), nil)
	failing := insertOK(t, cl, m.failing.With(smokeState{}), nil)
	for _, id := range parked {
		eventually(t, 5*time.Second, "parked", func() bool {
			in, err := cl.Get(ctx, id)
			require.NoError(t, err)
			return in.Status == gendurable.StatusAwaiting
		})
	}
	for i, id := range parked {
		to := gendurable.ByID(id)
		if i%2 == 1 {
			to = gendurable.ByKey(m.parker.Name, fmt.Sprint("park-", i))
		}
		_, err := cl.Signal(ctx, to, "go", map[string]int{"i": i})
		require.NoError(t, err)
	}
	eventually(t, 5*time.Second, "the doomed instance parked", func() bool {
		in, err := cl.Get(ctx, doomed)
		require.NoError(t, err)
		return in.Status == gendurable.StatusAwaiting
	})
	require.NoError(t, cl.Cancel(ctx, doomed, "smoke"))
	awaitStatus(t, cl, failing, gendurable.AwaitFailed)
	require.NoError(t, cl.Retry(ctx, failing, &gendurable.RetryOpts{Step: "recover"}))
	for _, id := range append(append(ids, parked...), parent, gated, timed, failing) {
		res, err := cl.Await(ctx, id, 5*time.Second, &gendurable.AwaitOpts{UntilTerminal: true})
		require.NoError(t, err)
		if res.Status == gendurable.AwaitNotFound {
			// GC may delete an instance that finished before its turn
			// here came: its outcome must have been done.
			require.True(t, sink.finishedDone(id), "instance %d is gone and never finished as done", id)
			continue
		}
		require.Equal(t, gendurable.AwaitDone, res.Status, "instance %d: %+v", id, res.Instance)
	}
	// GC deletes the finished rows.
	eventually(t, 30*time.Second, "GC deletes finished instances", func() bool {
		_, err := cl.Get(ctx, ids[0])
		return errors.Is(err, gendurable.ErrNotFound)
	})
	if checkLogs {
		// The code as Postgres errors print it: a bare "42501" also matches the monotonic clock
		// readings in the events' text (m=+252.42501...).
		for _, needle := range []string{"permission denied", "(SQLSTATE 42501)"} {
			require.NotContains(t, sink.logs(), needle)
			require.NotContains(t, sink.eventText(nil), needle)
		}
	}
}

type smokeMachines struct {
	linear                                       gendurable.FSM[path]
	parker, parent, child, gated, timed, failing gendurable.FSM[smokeState]
}

func (m smokeMachines) list() []gendurable.Machine {
	return []gendurable.Machine{m.linear, m.parker, m.parent, m.child, m.gated, m.timed, m.failing}
}

func newSmokeMachines() smokeMachines {
	done := func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) { return gendurable.Done(s), nil }
	one := func(name string, step gendurable.StepFunc[smokeState]) gendurable.FSM[smokeState] {
		return gendurable.FSM[smokeState]{Name: name, Start: "a", Steps: map[string]gendurable.StepFunc[smokeState]{"a": step, "end": done}}
	}
	m := smokeMachines{linear: linear("linear5", 0, nil)}
	m.parker = one("parker", func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
		return gendurable.Await([]string{"go"}, "end", s), nil
	})
	m.child = one("child", done)
	m.parent = one("parent", func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
		children := make([]gendurable.Child, 5)
		for i := range children {
			children[i] = gendurable.Child{Input: m.child.With(smokeState{N: i})}
		}
		return gendurable.Spawn(children, "end", s), nil
	})
	m.gated = one("gated", func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
		return gendurable.Next("end", s, gendurable.ConcurrencyKey("stripe:t2"), gendurable.RateLimit("mail:t2")), nil
	})
	m.timed = one("timed", func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
		return gendurable.Await([]string{"never"}, "end", s, gendurable.Timeout(100*time.Millisecond)), nil
	})
	m.failing = gendurable.FSM[smokeState]{Name: "failing", Start: "a", MaxAttempts: 1, Steps: map[string]gendurable.StepFunc[smokeState]{
		"a": func(*gendurable.Ctx, smokeState) (gendurable.Outcome, error) {
			return gendurable.Stop(errors.New("no")), nil
		},
		"recover": done,
	}}
	return m
}

// smokeConfig is the smoke suite's client: short lease, fast reaper and GC.
func smokeConfig(schema string, m smokeMachines) *gendurable.Config {
	return &gendurable.Config{
		Schema: schema, Machines: m.list(),
		Queues:       map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 8}, "work": {Concurrency: 8}},
		Lease:        time.Second,
		PollInterval: 50 * time.Millisecond,
		Reaper:       &gendurable.ReaperConfig{Interval: 50 * time.Millisecond},
		// Retention long enough for the suite to retry its failed instance after it fails; GC
		// deletes the finished rows while the suite watches (below).
		GC:                &gendurable.GCConfig{Interval: 100 * time.Millisecond, Retention: 5 * time.Second},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"stripe": {Limit: 2}},
		RateLimits:        map[string]gendurable.Rate{"mail": {Allowed: 100, Period: time.Second}},
		Poke:              gendurable.PokePostgres(),
	}
}

// ownedBy counts the objects in the database the role owns (a table, a type, a function, … that
// it created).
func ownedBy(t *testing.T, e *env, role string) int {
	t.Helper()
	return e.count(t, `SELECT (SELECT count(*) FROM pg_catalog.pg_class WHERE relowner = r.oid)
		+ (SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspowner = r.oid)
		+ (SELECT count(*) FROM pg_catalog.pg_type WHERE typowner = r.oid)
		+ (SELECT count(*) FROM pg_catalog.pg_proc WHERE proowner = r.oid)
		FROM pg_catalog.pg_roles r WHERE r.rolname = $1`, role)
}

// T15a, least privilege: migrated by the owner, the whole smoke suite runs as a runtime role
// holding only the guide's grants, with no permission error anywhere, and Start runs no DDL:
// the role can create nothing in the schema (any DDL would fail), and owns nothing afterwards.
func TestSecurityLeastPrivilege(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool, role := runtimeRole(t, e)
	ctx := context.Background()
	var canCreate bool
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT pg_catalog.has_schema_privilege($1, $2, 'CREATE')
		OR pg_catalog.has_database_privilege($1, pg_catalog.current_database(), 'CREATE')`, role, e.schema).Scan(&canCreate))
	require.False(t, canCreate)
	var searchPath string
	require.NoError(t, pool.QueryRow(ctx, `SHOW search_path`).Scan(&searchPath))
	require.Equal(t, `""`, searchPath, "the guide's empty search_path: the engine needs none")

	sink := &logSink{}
	m := newSmokeMachines()
	cl, err := gendurable.NewClient(pool, sink.config(smokeConfig(e.schema, m)))
	require.NoError(t, err)
	start(t, cl)
	smoke(t, cl, m, sink, true)
	require.Equal(t, 0, ownedBy(t, e, role), "the runtime role created objects")
	require.NotContains(t, sink.logs(), "CVE-2018-1058", "an empty search_path is safe")

	// What the role cannot do, so Start and the engine cannot have done it either.
	for _, ddl := range []string{
		"CREATE TABLE {schema}.x (a int)",
		"ALTER TABLE {schema}.instances ADD COLUMN x int",
		"CREATE INDEX ON {schema}.instances (queue)",
		"TRUNCATE {schema}.signals",
	} {
		_, err := pool.Exec(ctx, expand(ddl, e.schema))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, ddl)
		require.Contains(t, []string{"42501", "42P01"}, pgErr.Code, ddl)
	}
	// Migrating needs the owner: as the runtime role it is refused.
	require.Error(t, gendurable.Migrate(ctx, pool, &gendurable.MigrateOpts{Schema: "t_rt_" + randHex(4)}))
}

// T15b, search_path hijack (CVE-2018-1058): a schema with a table named like every engine table
// and a now() of its own, first on the runtime role's search_path. The smoke suite passes and
// nothing is written to it: every engine object is schema-qualified, and built-ins with an exact
// match resolve in pg_catalog, which Postgres searches first unless told otherwise.
func TestSecuritySearchPathHijack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	evil := "t_evil_" + randHex(4)
	q := pgx.Identifier{evil}.Sanitize()
	_, err := e.pool.Exec(ctx, "CREATE SCHEMA "+q)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := e.pool.Exec(context.Background(), "DROP SCHEMA "+q+" CASCADE")
		require.NoError(t, err)
	})
	var tables []string
	rows, err := e.pool.Query(ctx, `SELECT relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r'`, e.schema)
	require.NoError(t, err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, tbl := range tables {
		// Same columns, no constraints: anything written here would be a hijack.
		_, err := e.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.%s (LIKE %s.%s)`, q, pgx.Identifier{tbl}.Sanitize(),
			pgx.Identifier{e.schema}.Sanitize(), pgx.Identifier{tbl}.Sanitize()))
		require.NoError(t, err)
	}
	_, err = e.pool.Exec(ctx, `CREATE FUNCTION `+q+`.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '1970-01-01'::timestamptz $$`)
	require.NoError(t, err)
	pool, role := runtimeRole(t, e, "search_path = "+q+", public")
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s; GRANT ALL ON ALL TABLES IN SCHEMA %s TO %s`,
		q, pgx.Identifier{role}.Sanitize(), q, pgx.Identifier{role}.Sanitize()))
	require.NoError(t, err)
	var path string
	require.NoError(t, pool.QueryRow(ctx, `SHOW search_path`).Scan(&path))
	require.Contains(t, path, evil, "the role's search_path starts with the evil schema")

	m := newSmokeMachines()
	sink := &logSink{}
	cl, err := gendurable.NewClient(pool, sink.config(smokeConfig(e.schema, m)))
	require.NoError(t, err)
	start(t, cl)
	smoke(t, cl, m, sink, false)
	for _, tbl := range tables {
		require.Equal(t, 0, e.count(t, fmt.Sprintf(`SELECT count(*) FROM %s.%s`, q, pgx.Identifier{tbl}.Sanitize())), tbl)
	}
	require.NotContains(t, sink.logs(), "CVE-2018-1058", "only superusers can create objects in the evil schema")

	// Once other roles can create objects there (as in public before Postgres 15), a function or
	// an operator there can replace a built-in the engine calls: an enum's = decides which rows a
	// pick claims, bigint * interval a lease. Start says so.
	_, err = e.pool.Exec(ctx, "GRANT CREATE ON SCHEMA "+q+" TO PUBLIC")
	require.NoError(t, err)
	warned := &logSink{}
	cl2, err := gendurable.NewClient(pool, warned.config(&gendurable.Config{Schema: e.schema, Name: "second"}))
	require.NoError(t, err)
	start(t, cl2)
	require.Contains(t, warned.logs(), "CVE-2018-1058")
	require.Contains(t, warned.logs(), evil)
}

// T15c, secrets: a sentinel in the arguments, the state, a signal's payload and a step's error.
// Payloads never reach the logs (slog at its default level) or any event. An error text is
// stored in the instance's error history and carried by step.error's Err by design (it is the
// step's own message): it must appear nowhere else.
func TestSecuritySecretsStayOutOfLogsAndEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	secret := "GD_SECRET_" + randHex(8)
	args, state, payload, errText := secret+"_ARGS", secret+"_STATE", secret+"_PAYLOAD", secret+"_ERROR"
	var tries atomic.Int32
	m := gendurable.FSM[smokeState]{Name: "secretive", Start: "a", MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 },
		Steps: map[string]gendurable.StepFunc[smokeState]{
			"a": func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
				s.Secret = state
				return gendurable.Await([]string{"go"}, "b", s), nil
			},
			"b": func(ctx *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
				if tries.Add(1) == 1 {
					return gendurable.Outcome{}, errors.New(errText)
				}
				return gendurable.Done(s), nil
			},
		}}
	job := gendurable.Job[smokeState]{Name: "secret-job", MaxAttempts: 1, Perform: func(_ *gendurable.Ctx, a smokeState) error {
		return gendurable.Unrecoverable(errors.New(errText + " " + "job"))
	}}
	sink := &logSink{}
	cl := e.client(t, sink.config(&gendurable.Config{Machines: []gendurable.Machine{m, job},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {}}, PollInterval: 20 * time.Millisecond,
		GC: &gendurable.GCConfig{Disabled: true}})) // which it logs: the sink sees the logs
	start(t, cl)
	id := insertOK(t, cl, m.With(smokeState{Secret: args}), &gendurable.InsertOpts{CorrelationKey: "k"})
	jobID := insertOK(t, cl, job.With(smokeState{Secret: args}), nil)
	eventually(t, 5*time.Second, "parked", func() bool {
		in, err := cl.Get(ctx, id)
		require.NoError(t, err)
		return in.Status == gendurable.StatusAwaiting
	})
	_, err := cl.Signal(ctx, gendurable.ByKey("secretive", "k"), "go", map[string]string{"token": payload})
	require.NoError(t, err)
	awaitStatus(t, cl, id, gendurable.AwaitDone)
	awaitStatus(t, cl, jobID, gendurable.AwaitFailed)
	require.NoError(t, cl.Stop(ctx)) // flushes the hooks' queue

	logs := sink.logs()
	require.NotEmpty(t, logs, "the sink sees the client's logs")
	require.NotContains(t, logs, secret, "no sentinel, not even an error text, in the logs")
	require.NotContains(t, sink.eventText(nil), args)
	require.NotContains(t, sink.eventText(nil), state)
	require.NotContains(t, sink.eventText(nil), payload)
	require.Contains(t, sink.eventText(nil), errText, "step.error carries the step's error")
	require.NotContains(t, sink.eventText(func(ev gendurable.Event) bool { return ev.Name == gendurable.EventStepError }), errText,
		"no event but step.error carries it")
	// By design the error history keeps the text (the operator's record of why).
	in, err := cl.Get(ctx, id)
	require.NoError(t, err)
	require.Contains(t, in.Errors[0].Error, errText)
}

// T15d, tenant scoping. Signals address by machine and key: a key of machine A addressed to
// machine B is ErrNoTarget and A stays parked with an empty inbox. Configuration names capture
// exactly the keys whose part before the first ':' is the name: gate "stripe" governs "stripe"
// and "stripe:t1" (a semaphore of Limit per key), never "stripes:t1" (mutual exclusion, K = 1);
// rate limit "mail" governs "mail:x", never "mails:x" (unknown: it stalls).
func TestSecurityTenantScoping(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a := gendurable.FSM[smokeState]{Name: "tenant-a", Start: "a", Steps: map[string]gendurable.StepFunc[smokeState]{
		"a": func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"go"}, "b", s), nil
		},
		"b": func(_ *gendurable.Ctx, s smokeState) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	b := a
	b.Name = "tenant-b"
	var mu sync.Mutex
	running, most := map[string]int{}, map[string]int{}
	release := make(chan struct{})
	hold := gendurable.Job[string]{Name: "hold", Perform: func(_ *gendurable.Ctx, key string) error {
		mu.Lock()
		running[key]++
		most[key] = max(most[key], running[key])
		mu.Unlock()
		<-release
		mu.Lock()
		running[key]--
		mu.Unlock()
		return nil
	}}
	mailed := gendurable.Job[string]{Name: "mailed", Perform: func(*gendurable.Ctx, string) error { return nil }}
	cl := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{a, b, hold, mailed},
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"stripe": {Limit: 2}},
		RateLimits:        map[string]gendurable.Rate{"mail": {Allowed: 10, Period: time.Second}}})
	kit := durabletest.New(t, cl, nil)

	ra := insertOK(t, cl, a.With(smokeState{}), &gendurable.InsertOpts{CorrelationKey: "acme-1"})
	kit.Drain(ctx)
	_, err := cl.Signal(ctx, gendurable.ByKey("tenant-b", "acme-1"), "go", nil)
	require.ErrorIs(t, err, gendurable.ErrNoTarget)
	in := kit.RequireAwaiting(ctx, ra, "go")
	require.Zero(t, e.count(t, `SELECT count(*) FROM {schema}.signals WHERE instance_id = $1`, in.ID))

	// Rate limits: "mail:x" runs, "mails:x" is not captured by "mail" and stalls.
	rm := insertOK(t, cl, mailed.With(""), &gendurable.InsertOpts{RateLimit: "mail:x"})
	rms := insertOK(t, cl, mailed.With(""), &gendurable.InsertOpts{RateLimit: "mails:x"})
	kit.Drain(ctx)
	kit.RequireDone(ctx, rm, nil)
	kit.RequireStatus(ctx, rms, gendurable.StatusAvailable)
	stuck, err := cl.Stuck(ctx)
	require.NoError(t, err)
	require.Len(t, stuck, 1)
	require.Equal(t, "mails", stuck[0].RateLimit)

	// Gates, observed on a running worker with room for everything at once.
	worker := e.client(t, &gendurable.Config{Name: "worker", Machines: []gendurable.Machine{hold},
		Queues:            map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 20}},
		PollInterval:      20 * time.Millisecond,
		ConcurrencyLimits: map[string]gendurable.ConcurrencyLimit{"stripe": {Limit: 2}}})
	var ids []int64
	for _, key := range []string{"stripe", "stripe:t1", "stripes:t1"} {
		for range 3 {
			ids = append(ids, insertOK(t, cl, hold.With(key), &gendurable.InsertOpts{ConcurrencyKey: key}))
		}
	}
	start(t, worker)
	eventually(t, 5*time.Second, "each key at its limit", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return running["stripe"] == 2 && running["stripe:t1"] == 2 && running["stripes:t1"] == 1
	})
	time.Sleep(200 * time.Millisecond) // a few polls: nobody is admitted past the limit
	close(release)
	for _, id := range ids {
		awaitStatus(t, cl, id, gendurable.AwaitDone)
	}
	require.Equal(t, map[string]int{"stripe": 2, "stripe:t1": 2, "stripes:t1": 1}, most)
}
