package gendurable

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Severity says how much a Finding matters.
type Severity string

const (
	// SeverityProblem means work stops, or will, until it is fixed.
	SeverityProblem Severity = "problem"
	// SeverityWarning means work goes on but degrades while it lasts (dead rows pile up, picks
	// and inserts wait).
	SeverityWarning Severity = "warning"
)

// Finding is one thing Client.Checkup found wrong with the database under the client's schema.
type Finding struct {
	// Check names the check that found it: "autovacuum", "dead_rows", "horizon", "prepared",
	// "slot", "connections", "notify_queue", "invalid_index", "lock_wait", "table_locked", "reaper"
	// or "workers" (docs/operations.md, "Checkup").
	Check string `json:"check"`
	// Severity says whether work stops (SeverityProblem) or degrades (SeverityWarning).
	Severity Severity `json:"severity"`
	// Summary says what is wrong, with its figures; Fix, what to do about it.
	Summary string `json:"summary"`
	Fix     string `json:"fix"`
}

// CheckupOpts tunes Client.Checkup's thresholds; the zero value (or nil) takes the defaults.
type CheckupOpts struct {
	// OldTransaction is how long a transaction or snapshot may stay open, or a prepared
	// transaction wait for its COMMIT PREPARED, before it is reported for holding vacuum back.
	// Default 5 minutes.
	OldTransaction time.Duration
	// LockWait is how long a session may wait for a lock on the schema's tables before it is
	// reported. Default 5s.
	LockWait time.Duration
	// ReaperGrace is how far past their lease (or await deadline) rows may be before the reaper
	// is reported as not running. Default 1 minute; keep it above the reaper's interval.
	ReaperGrace time.Duration
	// Connections is the share of the connections the server accepts (max_connections less the
	// reserved ones), or the client's role or database (their CONNECTION LIMIT), in use from
	// which the checkup reports them. Default 0.9.
	Connections float64
	// SlotWAL is how many bytes of WAL a replication slot nothing is connected to may keep
	// before it is reported. Default 1 GiB.
	SlotWAL int64
	// NotifyQueue is the share of the server's NOTIFY queue in use, above 0 and at most 1, from
	// which the checkup reports it (a problem from 0.9). Default 0.5, where the server starts
	// logging it.
	NotifyQueue float64
}

const (
	// checkupNotifyProblem is the share of the NOTIFY queue in use from which it is a problem.
	checkupNotifyProblem = 0.9
	// checkupDeadRows is the dead-row count of a table, and checkupDeadShare its share of the
	// live rows, from which dead rows are reported when no vacuum ended within checkupVacuumAge.
	checkupDeadRows  = 100_000
	checkupDeadShare = 0.2
	checkupVacuumAge = 10 * time.Minute
)

// Checkup looks for what keeps the engine's tables from staying healthy or its work from moving,
// in the database as a whole rather than instance by instance (Stuck does that): autovacuum off,
// dead rows piling up, sessions holding vacuum back with a transaction left open, prepared
// transactions nobody ended, replication slots nobody reads keeping WAL, connections running out
// (the server's, or the client's role's or database's limit), the NOTIFY queue filling up,
// indexes left invalid by a failed build, sessions waiting for locks on the schema's tables or
// their rows (or the instances table locked outright), claims and await deadlines the reaper has
// not seen to, and queues with due rows that no live node works. It returns the findings,
// problems first; none means nothing was found. It reads catalogs and statistics views, and the
// instances and nodes tables through their indexes (waiting at most a second for their locks),
// at a cost of the queues and the rows in flight, never the backlog or the history; a role
// without pg_read_all_stats sees only its own sessions in pg_stat_activity.
func (c *Client) Checkup(ctx context.Context, opts *CheckupOpts) ([]Finding, error) {
	o := CheckupOpts{OldTransaction: 5 * time.Minute, LockWait: 5 * time.Second, ReaperGrace: time.Minute, Connections: 0.9,
		SlotWAL: 1 << 30, NotifyQueue: 0.5}
	if opts != nil {
		if opts.NotifyQueue > 1 {
			return nil, fmt.Errorf("gendurable: checkup: NotifyQueue %v: a share of the queue, at most 1", opts.NotifyQueue)
		}
		o.OldTransaction = orPositive(opts.OldTransaction, o.OldTransaction)
		o.LockWait = orPositive(opts.LockWait, o.LockWait)
		o.ReaperGrace = orPositive(opts.ReaperGrace, o.ReaperGrace)
		o.Connections = orPositive(opts.Connections, o.Connections)
		o.SlotWAL = orPositive(opts.SlotWAL, o.SlotWAL)
		o.NotifyQueue = orPositive(opts.NotifyQueue, o.NotifyQueue)
	}
	f, err := c.store.Checkup(ctx, c.pool, store.CheckupLimits{Old: o.OldTransaction, Wait: o.LockWait,
		Grace: o.ReaperGrace, Live: engine.NodeLive, SlotWAL: o.SlotWAL})
	if err != nil {
		return nil, fmt.Errorf("gendurable: checkup: %w", err)
	}
	var out []Finding
	// name quotes a schema-qualified name for the SQL of a fix.
	name := func(rel string) string { return pgx.Identifier{c.store.Schema, rel}.Sanitize() }
	add := func(check string, sev Severity, fix, format string, args ...any) {
		out = append(out, Finding{Check: check, Severity: sev, Summary: fmt.Sprintf(format, args...), Fix: fix})
	}
	if len(f.Tables) > 0 && !f.Tables[0].ServerAutovacuum {
		add("autovacuum", SeverityProblem, "Turn autovacuum on (autovacuum = on in postgresql.conf, then reload): "+
			"every instance leaves dead row versions behind, and picks slow down as they pile up.",
			"autovacuum is off on the server: nothing vacuums the tables of %s", c.store.Schema)
	}
	for _, t := range f.Tables {
		if t.ServerAutovacuum && !t.TableAutovacuum { // (a server without it has its own finding)
			add("autovacuum", SeverityProblem, fmt.Sprintf("ALTER TABLE %s RESET (autovacuum_enabled);", name(t.Table)),
				"autovacuum is off for %s.%s (autovacuum_enabled = false)", c.store.Schema, t.Table)
		}
		stale := t.SinceVacuum == nil || *t.SinceVacuum > checkupVacuumAge
		if t.Dead >= checkupDeadRows && float64(t.Dead) >= checkupDeadShare*float64(t.Live) && stale {
			last := "never since the statistics were reset"
			if t.SinceVacuum != nil {
				last = t.SinceVacuum.Round(time.Second).String() + " ago"
			}
			add("dead_rows", SeverityWarning, fmt.Sprintf("VACUUM %s; and see why autovacuum has not (the horizon check, "+
				"autovacuum_max_workers, the table's autovacuum settings).", name(t.Table)),
				"%s.%s holds %d dead rows beside %d live ones; its last vacuum ended %s", c.store.Schema, t.Table, t.Dead, t.Live, last)
		}
	}
	for _, h := range f.Horizon {
		add("horizon", SeverityWarning, fmt.Sprintf("End its transaction, or the session (SELECT pg_terminate_backend(%d);), "+
			"and bound such sessions with idle_in_transaction_session_timeout.", h.PID),
			"session %d (%q, %s) has held a transaction or snapshot open for %v: vacuum keeps every row version younger than it",
			h.PID, h.App, h.State, h.Age.Round(time.Second))
	}
	for _, p := range f.Prepared {
		fix := fmt.Sprintf("Find out what it was part of and end it, as its owner (%s) or a superuser in this database: "+
			"COMMIT PREPARED %s; or ROLLBACK PREPARED %s; (it survives restarts: nothing else ends it).", p.Owner, quoteLiteral(p.GID), quoteLiteral(p.GID))
		if len(p.Locked) == 0 {
			add("prepared", SeverityWarning, fix, "prepared transaction %s (owner %s) has waited %v for COMMIT PREPARED: "+
				"vacuum keeps every row version younger than it", quoteLiteral(p.GID), p.Owner, p.Age.Round(time.Second))
			continue
		}
		add("prepared", SeverityProblem, fix, "prepared transaction %s (owner %s) has waited %v for COMMIT PREPARED, holding "+
			"locks on %s: the rows it wrote or locked stay locked, schema changes wait, and vacuum keeps every row version "+
			"younger than it", quoteLiteral(p.GID), p.Owner, p.Age.Round(time.Second), qualified(c.store.Schema, p.Locked))
	}
	for _, sl := range f.Slots {
		of := "physical"
		if sl.Database != "" {
			of = sl.Type + ", database " + sl.Database
		}
		var does []string
		if sl.OverWAL {
			does = append(does, fmt.Sprintf("keeps %s of WAL: the server keeps every segment after it, until its disk fills",
				bytesIEC(sl.Kept)))
		}
		if sl.HoldsXmin {
			does = append(does, fmt.Sprintf("holds the xmin horizon %d transactions back (a standby's hot_standby_feedback, "+
				"kept when it went): vacuum keeps every row version younger than it, in every table", sl.XminAge))
		}
		add("slot", SeverityWarning, fmt.Sprintf("Reconnect its consumer, or drop it if none will come back: SELECT "+
			"pg_drop_replication_slot(%s); and bound what a slot may keep with max_slot_wal_keep_size.", quoteLiteral(sl.Name)),
			"replication slot %s (%s) has no consumer and %s", sl.Name, of, strings.Join(does, "; it "))
	}
	if f.Accepted > 0 && float64(f.Connections) >= o.Connections*float64(f.Accepted) {
		add("connections", SeverityWarning, "Lower the pools' MaxConns, put a pooler in front (PgBouncer in transaction mode), "+
			"or raise max_connections: past the limit, new connections are refused (the engine waits; your own calls fail).",
			"%d of the %d client connections the server accepts are in use", f.Connections, f.Accepted)
	}
	// The role's and the database's CONNECTION LIMIT (-1: none), to which no superuser is held.
	for _, l := range []struct {
		kind, name, may, refused string
		inUse, limit             int
	}{
		{"ROLE", f.Role, "role %s may hold", "the role's new connections", f.RoleConnections, f.RoleLimit},
		{"DATABASE", f.Database, "database %s accepts", "new connections to the database", f.DatabaseConnections, f.DatabaseLimit},
	} {
		if f.Superuser || l.limit < 0 || float64(l.inUse) < o.Connections*float64(l.limit) {
			continue
		}
		add("connections", SeverityWarning, fmt.Sprintf("Raise it (ALTER %s %s CONNECTION LIMIT n;) or lower the pools' "+
			"MaxConns: past it, %s are refused (the engine waits; your own calls fail).", l.kind,
			pgx.Identifier{l.name}.Sanitize(), l.refused),
			"%d of the %d connections "+l.may+" (its CONNECTION LIMIT) are in use", l.inUse, l.limit, l.name)
	}
	if f.NotifyQueue >= o.NotifyQueue {
		sev := SeverityWarning
		if f.NotifyQueue >= checkupNotifyProblem {
			sev = SeverityProblem
		}
		add("notify_queue", sev, "Find the session that listens inside a long transaction and end its transaction: "+
			"the horizon check lists long transactions, and from half full the server log's \"NOTIFY queue is … full\" "+
			"names the session's pid.",
			"the server's NOTIFY queue is %.1f%% full: a session that listens reads none of it while its transaction lasts. "+
				"Once it is full every transaction that notified fails at its commit: from half full, PokePostgres no longer "+
				"sends the pokes of InsertTx and SignalTx inside the caller's transaction (nodes find those rows by their poll), "+
				"and once it is full the other pokes are lost too",
			100*f.NotifyQueue)
	}
	for _, x := range f.Invalid {
		add("invalid_index", SeverityProblem, fmt.Sprintf("DROP INDEX CONCURRENTLY %s; then REINDEX the index it was to "+
			"replace, or run gendurable migrate again if a migration was building it.", name(x.Index)),
			"index %s.%s on %s is invalid (a concurrent build failed): every write maintains it, no read uses it",
			c.store.Schema, x.Index, x.Table)
	}
	for _, w := range f.Waits {
		by := make([]string, len(w.BlockedBy))
		for i, pid := range w.BlockedBy {
			by[i] = fmt.Sprint(pid)
		}
		if w.Row {
			add("lock_wait", SeverityWarning, "Find what the blocking sessions run (pg_stat_activity) and let it finish or "+
				"end it: a transaction that holds a row it wrote or locked (SELECT … FOR UPDATE) while it waits on something "+
				"else holds up every writer of that row; bound such transactions with idle_in_transaction_session_timeout.",
				"session %d (%q) has waited %v for a row of %s.%s, blocked by %s", w.PID, w.App, w.Waited.Round(time.Millisecond),
				c.store.Schema, w.Table, strings.Join(by, ", "))
			continue
		}
		add("lock_wait", SeverityWarning, "Find what the blocking sessions run (pg_stat_activity) and let it finish or end it; "+
			"take schema changes' locks with a lock_timeout, build indexes CONCURRENTLY.",
			"session %d (%q) has waited %v for %s on %s.%s, blocked by %s", w.PID, w.App, w.Waited.Round(time.Millisecond),
			w.Mode, c.store.Schema, w.Table, strings.Join(by, ", "))
	}
	if f.Rows == nil {
		add("table_locked", SeverityProblem, "See the lock waits: end or let finish the session that holds the table.",
			"%s.instances or %s.nodes stayed locked for the checkup's lock timeout: every pick, beat, commit and insert "+
				"waits for the instances table", c.store.Schema, c.store.Schema)
	} else {
		r := f.Rows
		if r.ExpiredLeases > 0 || r.OverdueAwaits > 0 {
			add("reaper", SeverityProblem, "Run the reaper on at least one node (Config.Reaper not disabled), and check its log "+
				"for failed sweeps.",
				"expired claims: %s; await deadlines passed: %s; each more than %v ago: no node's reaper is releasing or waking them",
				capped(r.ExpiredLeases), capped(r.OverdueAwaits), o.ReaperGrace)
		}
		var idle []string
		for _, q := range r.DueQueues {
			if !slices.Contains(r.WorkedQueues, q) {
				idle = append(idle, q)
			}
		}
		if len(idle) > 0 {
			add("workers", SeverityProblem, "Start a client whose Config.Queues has them (the node registry shows no node "+
				"working them refreshed within "+engine.NodeLive.String()+").",
				"rows are due in queues no live node works: %s", strings.Join(idle, ", "))
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		if a.Severity == b.Severity {
			return 0
		}
		if a.Severity == SeverityProblem {
			return -1
		}
		return 1
	})
	return out, nil
}

// capped prints a count the checkup stopped at store.CheckupCap.
func capped(n int64) string {
	if n >= store.CheckupCap {
		return fmt.Sprintf("at least %d", n)
	}
	return fmt.Sprint(n)
}

// quoteLiteral quotes s as an SQL string literal, for the SQL of a fix.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// qualified lists the schema's tables as schema.table.
func qualified(schema string, tables []string) string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = schema + "." + t
	}
	return strings.Join(out, ", ")
}

// bytesIEC prints a byte count in the largest binary unit it fills (12.5 GiB, 300 MiB).
func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, units := float64(n), []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	i := -1
	for v >= unit && i < len(units)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
