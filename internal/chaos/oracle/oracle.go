// Package oracle is the reliability tests' judge: it records every committed transition of a test
// schema's instances with a trigger the test installs (never the library), gives steps an effect
// log on a connection of their own, and checks the invariants below (docs/reliability.md, "The
// oracle") with SQL after quiescence, trusting nothing the engine reports about itself.
//
//   - I1 complete: every instance terminal.
//   - I2 exactly one terminal transition per instance, and every instance seen.
//   - I3 no rewind: a state's counter "i" moves by 0 or 1 per committed transition.
//   - I4 no lost effect: every transition out of executing that moved an instance on (a new step,
//     or finished, parked) has an effect row for the step that ran.
//   - I5 exact path: every done instance's state path equals the expected path.
//   - I6 clean claims: nothing executing, gate counters at zero, no gate lease left, bucket
//     balances within their bursts.
//   - I7 clean inboxes: no signal addressed to a terminal instance.
//   - I8 no deadlocks: the test's own database counted none (DatabaseDeadlocks, read by the test
//     once every session of it has ended; a private cluster counts them from its server log).
//
// I9 (no leaked goroutines) is durabledbtest.Main's goleak check.
package oracle

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func q(schema string) string { return pgx.Identifier{schema}.Sanitize() }

// Install creates, in schema (already migrated), the outcome log and its trigger on the
// instances table, and the effect log.
func Install(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s := q(schema)
	ddl := fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %[1]s.t_outcome_log (
  seq        bigserial PRIMARY KEY,
  id         bigint NOT NULL,
  old_status text,
  new_status text NOT NULL,
  old_step   text,
  new_step   text NOT NULL,
  new_state  jsonb,
  attempt    integer,
  locked_by  text,
  parent_id  bigint,
  pending    integer,
  xid        bigint NOT NULL DEFAULT txid_current(),
  at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS t_outcome_log_id ON %[1]s.t_outcome_log (id, seq);
CREATE TABLE IF NOT EXISTS %[1]s.t_effects (
  id      bigint,
  step    text,
  attempt int,
  pid     int,
  at      timestamptz DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS t_effects_id ON %[1]s.t_effects (id, step);
CREATE OR REPLACE FUNCTION %[1]s.t_log_transition() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO %[1]s.t_outcome_log (id, old_status, new_status, old_step, new_step, new_state, attempt, locked_by,
                                     parent_id, pending)
    VALUES (NEW.id, NULL, NEW.status::text, NULL, NEW.step, NEW.state, NEW.attempt, NEW.locked_by, NEW.parent_id,
            NEW.pending_children);
  ELSIF OLD.status IS DISTINCT FROM NEW.status OR OLD.step IS DISTINCT FROM NEW.step
        OR OLD.state IS DISTINCT FROM NEW.state OR OLD.locked_by IS DISTINCT FROM NEW.locked_by
        OR OLD.pending_children IS DISTINCT FROM NEW.pending_children THEN
    -- Every change but a lease extension (the heartbeat) is a transition.
    INSERT INTO %[1]s.t_outcome_log (id, old_status, new_status, old_step, new_step, new_state, attempt, locked_by,
                                     parent_id, pending)
    VALUES (NEW.id, OLD.status::text, NEW.status::text, OLD.step, NEW.step, NEW.state, NEW.attempt, NEW.locked_by,
            NEW.parent_id, NEW.pending_children);
  END IF;
  RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS t_log_transition ON %[1]s.instances;
CREATE TRIGGER t_log_transition AFTER INSERT OR UPDATE ON %[1]s.instances
  FOR EACH ROW EXECUTE FUNCTION %[1]s.t_log_transition();`, s)
	_, err := pool.Exec(ctx, ddl)
	if err != nil {
		return fmt.Errorf("oracle: install: %w", err)
	}
	return nil
}

// Effect records a step's external effect, in autocommit on db (a pool of its own, not the
// step's transaction): at-least-once execution may repeat it, never lose it.
func Effect(ctx context.Context, db *pgxpool.Pool, schema string, id int64, step string, attempt, pid int) error {
	_, err := db.Exec(ctx, `INSERT INTO `+q(schema)+`.t_effects (id, step, attempt, pid) VALUES ($1, $2, $3, $4)`,
		id, step, attempt, pid)
	return err
}

// Deadlocks reads the current database's deadlock count (pg_stat_database) as it stands: a
// backend adds its own counts there a second or more after the fact, or when it exits. For a
// count that misses nothing, see DatabaseDeadlocks.
func Deadlocks(ctx context.Context, db *pgxpool.Pool) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// DatabaseDeadlocks returns the deadlock count of database datname once every session of it has
// ended, until ctx ends: a backend hands its counts to pg_stat_database when it exits (before
// that, a second or more after the deadlock), so a count read then cannot miss one. admin is a
// pool on another database of the same server. A database of the test's own, counted this way,
// shares its count with no other test.
func DatabaseDeadlocks(ctx context.Context, admin *pgxpool.Pool, datname string) (int64, error) {
	for {
		var open int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, datname).Scan(&open); err != nil {
			return 0, err
		}
		if open == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("database %s still has %d sessions: %w", datname, open, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	var n int64
	err := admin.QueryRow(ctx, `SELECT coalesce((SELECT deadlocks FROM pg_stat_database WHERE datname = $1), 0)`, datname).Scan(&n)
	return n, err
}

// Opts says what Check expects.
type Opts struct {
	// N is how many instances the test inserted (I2 checks every one reached the log); 0 skips.
	N int
	// Terminal lists the statuses I1 accepts at the end; default done only.
	Terminal []string
	// Effects turns on I4 (the test's steps record effects).
	Effects bool
	// Path is the path every done instance must have (I5); nil skips. Steps write it as the
	// "path" array of their state, or of the result they finish with.
	Path []string
	// Paths gives the path by machine, for tests that mix machines (I5): a done instance of a
	// machine listed here must have that path; one of any other machine, Path (if set).
	Paths map[string][]string
	// Counter turns on I3 (the test's states carry a counter "i").
	Counter bool
}

// Violation is an invariant that does not hold.
type Violation struct {
	Invariant string
	Detail    string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// Check runs the invariants and returns every violation (none: they all hold).
func Check(ctx context.Context, pool *pgxpool.Pool, schema string, o Opts) ([]Violation, error) {
	s := q(schema)
	terminal := o.Terminal
	if len(terminal) == 0 {
		terminal = []string{"done"}
	}
	var out []Violation
	count := func(name, query string, args ...any) error {
		var n int64
		var example *string
		if err := pool.QueryRow(ctx, strings.ReplaceAll(query, "{s}", s), args...).Scan(&n, &example); err != nil {
			return fmt.Errorf("oracle: %s: %w", name, err)
		}
		if n != 0 {
			d := fmt.Sprintf("%d violations", n)
			if example != nil {
				d += ", e.g. " + *example
			}
			out = append(out, Violation{name, d})
		}
		return nil
	}
	checks := []struct {
		name, query string
		args        []any
		on          bool
	}{
		{"I1 complete", `SELECT count(*), min(id || ' ' || status) FROM {s}.instances WHERE status::text <> ALL($1)`,
			[]any{terminal}, true},
		{"I2 one terminal transition", `SELECT count(*), min(id::text) FROM (
			SELECT id FROM {s}.t_outcome_log
			WHERE new_status IN ('done', 'failed', 'cancelled') AND old_status IS DISTINCT FROM new_status
			GROUP BY id HAVING count(*) <> 1
			UNION ALL
			SELECT id FROM {s}.instances i WHERE i.status IN ('done', 'failed', 'cancelled')
			  AND NOT EXISTS (SELECT 1 FROM {s}.t_outcome_log l WHERE l.id = i.id
			                  AND l.new_status = i.status::text AND l.old_status IS DISTINCT FROM l.new_status)) v`, nil, true},
		{"I3 no rewind", `SELECT count(*), min(id || ' at seq ' || seq) FROM (
			SELECT id, seq, (new_state->>'i')::int - lag((new_state->>'i')::int) OVER (PARTITION BY id ORDER BY seq) AS d
			FROM {s}.t_outcome_log WHERE new_state ? 'i') v WHERE d < 0 OR d > 1`, nil, o.Counter},
		{"I4 no lost effect", `SELECT count(*), min(l.id || ' step ' || l.old_step) FROM {s}.t_outcome_log l
			WHERE l.old_status = 'executing'
			  AND (l.new_step <> l.old_step OR l.new_status IN ('done', 'awaiting', 'joining'))
			  AND NOT EXISTS (SELECT 1 FROM {s}.t_effects f WHERE f.id = l.id AND f.step = l.old_step)`, nil, o.Effects},
		{"I6 nothing executing", `SELECT count(*), min(id::text) FROM {s}.instances WHERE status = 'executing'`, nil, true},
		{"I6 gate counters at zero", `SELECT count(*), min(key || '/' || shard || ' holds ' || held) FROM {s}.gates WHERE held <> 0`, nil, true},
		{"I6 no gate lease left", `SELECT count(*), min(key || '/' || shard || ' by ' || owner) FROM {s}.gate_leases`, nil, true},
		{"I6 bucket balances", `SELECT count(*), min(key) FROM {s}.buckets WHERE tokens < 0 OR tokens > burst + 1e-9`, nil, true},
		{"I7 clean inboxes", `SELECT count(*), min(s.instance_id::text) FROM {s}.signals s JOIN {s}.instances i ON i.id = s.instance_id
			WHERE i.status IN ('done', 'failed', 'cancelled')`, nil, true},
	}
	for _, c := range checks {
		if !c.on {
			continue
		}
		if err := count(c.name, c.query, c.args...); err != nil {
			return out, err
		}
	}
	if o.N > 0 {
		var seen int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM `+s+`.t_outcome_log`).Scan(&seen); err != nil {
			return out, err
		}
		if seen < o.N {
			out = append(out, Violation{"I2 every instance seen", fmt.Sprintf("%d of %d instances in the log", seen, o.N)})
		}
	}
	if o.Path != nil || len(o.Paths) > 0 {
		// want is the expected path of each machine; "" stands for every machine not named.
		machines, wants := []string{}, []string{}
		for m, p := range o.Paths {
			b, _ := json.Marshal(p)
			machines, wants = append(machines, m), append(wants, string(b))
		}
		var other *string
		if o.Path != nil {
			b, _ := json.Marshal(o.Path)
			w := string(b)
			other = &w
		}
		if err := count("I5 exact path", `SELECT count(*), min(id || ' ' || machine || ' ' || coalesce(result->'path', state->'path')::text)
			FROM {s}.instances i
			LEFT JOIN unnest($1::text[], $2::text[]) AS w(machine_name, path) ON w.machine_name = i.machine
			WHERE status = 'done' AND (w.path IS NOT NULL OR $3::text IS NOT NULL)
			  AND coalesce(result->'path', state->'path') IS DISTINCT FROM coalesce(w.path, $3::text)::jsonb`,
			machines, wants, other); err != nil {
			return out, err
		}
	}
	return out, nil
}
