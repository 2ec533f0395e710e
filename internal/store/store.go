// Package store is the only home of gendurable's runtime SQL. Statements live in sql/*.sql, one
// file per statement family, each with a comment saying which locks it takes and why. The schema
// is written {schema} in the files and substituted once per Store as a quoted identifier; every
// value is a bound parameter. Methods run on a DB: a pool, a connection or a caller's
// transaction.
package store

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/fault"
	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

//go:embed sql/*.sql
var files embed.FS

// DB is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store holds the statements, expanded for one schema.
type Store struct {
	Schema string
	stmts  map[string]string
}

// New parses the embedded statements for schema ("" is the default schema).
func New(schema string) (*Store, error) {
	schema, err := ident.Schema(schema)
	if err != nil {
		return nil, err
	}
	stmts, err := parse(files)
	if err != nil {
		return nil, err
	}
	for name, text := range stmts {
		stmts[name] = ident.Expand(text, schema)
	}
	st := &Store{Schema: schema, stmts: stmts}
	st.assemblePicks()
	return st, nil
}

// assemblePicks builds the admission picks from pick.sql's fragments: pick_gated (gates only),
// pick_rated (rate limits only) and pick_admitted (both).
func (s *Store) assemblePicks() {
	either := func(cond bool, yes, no string) string {
		if cond {
			return s.frag(yes)
		}
		return s.frag(no)
	}
	// The rate limits' CTEs: the grants, their writeback, the rows they let through.
	rateCTEs := s.frag("pa_rate_ctes") + ",\n" + s.frag("pa_rdebit") + ",\n" + s.frag("pa_rate_admitted")
	for _, v := range []struct {
		name         string
		gates, rates bool
	}{{"pick_gated", true, false}, {"pick_rated", false, true}, {"pick_admitted", true, true}} {
		rateCTEs := either(v.gates, "pa_eligible", "pr_eligible") + ",\n" + rateCTEs
		if !v.rates {
			rateCTEs = s.frag("pa_no_rate_ctes")
		}
		var parts []string
		if v.gates {
			parts = append(parts, s.frag("pa_gate_cfg"))
		}
		if v.rates {
			parts = append(parts, s.frag("pa_rate_cfg"))
		}
		parts = append(parts,
			s.frag("pa_candidates_head")+"\n"+either(v.gates, "pa_gate_filter", "pa_k1_filter")+"\n"+
				either(v.rates, "pa_rate_filter", "pa_no_rate_filter")+"\n"+s.frag("pa_candidates_tail"),
			rateCTEs,
			either(v.gates, "pa_gate_ctes", "pa_k1_chosen"),
			either(v.rates, "pa_refused", "pa_no_refused"))
		s.stmts[v.name] = "WITH " + strings.Join(parts, ",\n") + "\n" + s.frag("pick_claim")
	}
	// The lean picks (Lane): the lane's key or limit passes the scan untested, every other row
	// takes the admission pick's test (filter).
	passOr := func(test, filter string) string {
		return "    AND (" + test + " OR (TRUE\n" + s.frag(filter) + "))"
	}
	s.stmts["pick_leased"] = "WITH " + strings.Join([]string{
		s.frag("pa_gate_cfg"), s.frag("pl_lease"),
		strings.Join([]string{s.frag("pa_candidates_head"), passOr("i.concurrency_key = @l_key", "pa_gate_filter"),
			s.frag("pa_no_rate_filter"), s.frag("pa_candidates_tail")}, "\n"),
		s.frag("pl_chosen"), s.frag("pa_no_refused")}, ",\n") + "\n" + s.frag("pick_claim")
	s.stmts["pick_rate_lane"] = "WITH " + strings.Join([]string{
		s.frag("pa_rate_cfg"),
		strings.Join([]string{s.frag("pa_candidates_head"), s.frag("pa_k1_filter"),
			passOr("i.rate_limit = @lr_key", "pa_rate_filter"), s.frag("pa_candidates_tail")}, "\n"),
		s.frag("rl_granted"), s.frag("pa_rdebit"), s.frag("rl_chosen"), s.frag("pa_no_refused")}, ",\n") + "\n" + s.frag("pick_claim")
}

// parse splits every file into statements named by "-- name: X" lines. A statement runs from its
// name line to the next name line or the end of the file; comment lines are kept, since they
// cost nothing and make server logs readable.
func parse(fsys fs.FS) (map[string]string, error) {
	names, err := fs.Glob(fsys, "sql/*.sql")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, file := range names {
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		var cur string
		var buf strings.Builder
		flush := func() {
			if cur != "" {
				out[cur] = strings.TrimSpace(buf.String())
			}
			buf.Reset()
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			t := strings.TrimSpace(line)
			rest, isName := strings.CutPrefix(t, "-- name:")
			frag, isFragment := strings.CutPrefix(t, "-- fragment:")
			if isName || isFragment {
				flush()
				cur = strings.TrimSpace(rest)
				if isFragment {
					cur = "{{" + strings.TrimSpace(frag) + "}}"
				}
				if _, dup := out[cur]; dup {
					return nil, fmt.Errorf("store: statement %q defined twice", cur)
				}
				continue
			}
			if cur != "" && !strings.HasPrefix(strings.TrimSpace(line), "--") {
				buf.WriteString(line)
				buf.WriteByte('\n')
			}
		}
		flush()
	}
	// Fragments ("-- fragment: x") are spliced into the statements that say {{x}}; they stay
	// available on their own to the statements assembled in Go.
	for name, text := range out {
		if !strings.HasPrefix(name, "{{") {
			continue
		}
		for n, stmt := range out {
			if !strings.HasPrefix(n, "{{") {
				out[n] = strings.ReplaceAll(stmt, name, text)
			}
		}
	}
	for n, stmt := range out {
		if !strings.HasPrefix(n, "{{") && strings.Contains(stmt, "{{") {
			return nil, fmt.Errorf("store: statement %q uses an undefined fragment", n)
		}
	}
	return out, nil
}

func (s *Store) sql(name string) string {
	q, ok := s.stmts[name]
	if !ok {
		panic("store: no statement " + name)
	}
	return q
}

// frag returns a statement fragment ("-- fragment: name" in the files).
func (s *Store) frag(name string) string {
	return s.sql("{{" + name + "}}")
}

// Claimed is a row the pick claimed.
type Claimed struct {
	ID             int64
	Machine        string
	Step           string
	State          []byte
	Attempt        int
	MaxAttempts    int
	Priority       int
	CorrelationKey string
	InsertedAt     time.Time
	// AwaitNames are the names the instance parked on, if this step runs after an Await.
	AwaitNames []string
	// Inbox is the instance's inbox as of the pick, oldest first.
	Inbox []SignalRow
	// Signalled says the instance has ever received a signal.
	Signalled bool
	// Child says the instance has a parent.
	Child bool
	// Children are the parent's latest wave, loaded when its join step is due.
	Children []ChildRow
	// ConcurrencyKey is the row's key (nil: none); ConcurrencyShard the gate shard its claim
	// debited (nil: not gated). The outcome credits that shard back.
	ConcurrencyKey   *string
	ConcurrencyShard *int16
	// RateLimit is the rate limit the claim was granted under (nil: none).
	RateLimit *string
	// Owner is the claim token the pick set (filled in by the caller).
	Owner string
}

// ChildRow is a child of a parent's latest wave.
type ChildRow struct {
	ID      int64           `json:"id"`
	Machine string          `json:"machine"`
	Status  string          `json:"status"`
	Result  json.RawMessage `json:"result"`
	Error   string          `json:"error"`
}

// SignalRow is a signal in an inbox.
type SignalRow struct {
	ID      int64           `json:"id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload"`
	At      time.Time       `json:"at"`
}

// Gates is the concurrency-gate configuration a pick admits against (parallel slices).
type Gates struct {
	Names  []string
	Limits []int32
	Shards []int32
}

// Rates is the rate-limit configuration a pick admits against (parallel slices): refill rate in
// tokens per second and burst, per limit name.
type Rates struct {
	Names  []string
	Rates  []float64
	Bursts []float64
}

// Admits reports whether a pick under gates and rates is an admission pick (it reads gates or
// buckets, and a Hint can make it cheaper) rather than the plain one.
func Admits(gates *Gates, rates *Rates) bool {
	return gates.configured() || rates.configured()
}

// LeasesGates reports whether a pick under gates and rates can take a gate lease (Lane.Gate):
// gates and no rate limits are configured.
func LeasesGates(gates *Gates, rates *Rates) bool { return gates.configured() && !rates.configured() }

// RatesLanes reports whether a pick under gates and rates can take a rate lane (Lane.Rate): rate
// limits and no gates are configured.
func RatesLanes(gates *Gates, rates *Rates) bool { return rates.configured() && !gates.configured() }

func (g *Gates) configured() bool { return g != nil && len(g.Names) > 0 }

func (r *Rates) configured() bool { return r != nil && len(r.Names) > 0 }

// pickLockTimeout bounds how long a pick waits for a lock (see Pick).
const pickLockTimeout = "100ms"

// PickResult is what a pick claimed, and how many candidates its window considered (the
// difference was denied by a concurrency key or gate in this pick).
type PickResult struct {
	Rows       []Claimed
	Considered int
	// Refused counts the buckets whose grant another pick's writeback beat this one to.
	Refused int
	// RateDenied counts the rate-limited rows of the window their bucket could not afford.
	RateDenied int
}

// Hint names the gate and rate-limit keys an admission pick expects among its candidates,
// usually the keys of the caller's last batch (HintFrom). The pick reads each hinted
// key's gate or bucket once, where it would read it once per candidate row; what it claims is the
// same with any hint, or none.
type Hint struct {
	GateKeys []string
	RateKeys []string
}

// maxHintKeys bounds a hint: a batch of many keys gains little from it, and each hinted key costs
// a read whether or not the batch holds a row of it.
const maxHintKeys = 32

// HintFrom returns the hint for the pick after the one that claimed rows: their gated keys and
// rate limits, each once, at most 32 of each.
func HintFrom(rows []Claimed) Hint {
	var h Hint
	for i := range rows {
		c := &rows[i]
		if c.ConcurrencyShard != nil && c.ConcurrencyKey != nil && len(h.GateKeys) < maxHintKeys &&
			!slices.Contains(h.GateKeys, *c.ConcurrencyKey) {
			h.GateKeys = append(h.GateKeys, *c.ConcurrencyKey)
		}
		if c.RateLimit != nil && len(h.RateKeys) < maxHintKeys && !slices.Contains(h.RateKeys, *c.RateLimit) {
			h.RateKeys = append(h.RateKeys, *c.RateLimit)
		}
	}
	return h
}

// Lane is a lean way for an admission pick to take a batch like the caller's last one, all of
// one gated key or one rate limit (at most one of the two is set): a pick on it claims that
// key's or limit's rows without the admission pick's per-key machinery, and leaves rows of any
// other key or limit that it could admit for the next pick, an admission pick.
type Lane struct {
	// Gate is the caller's gate lease (a client with gates and no rate limits): the key's rows
	// are claimed into the lease's shard without touching its counter. The caller must ask for
	// no more rows than the lease has free slots; every row of the key it gets back took one of
	// them (none if the lease is gone).
	Gate *Lease
	// Rate is a rate limit (a client with rate limits and no gates): all of its rows in the
	// window are granted in one debit of its bucket, or none of them are (the admission pick
	// then grants the prefix that fits).
	Rate string
}

// Pick claims up to limit due rows of queue for the claim token owner. hint only makes an
// admission pick cheaper (see Hint); lane makes it leaner still for a batch like the last one
// (see Lane).
func (s *Store) Pick(ctx context.Context, db DB, queue string, limit int, owner string, lease, horizon time.Duration, gates *Gates, rates *Rates, hint Hint, lane Lane) (PickResult, error) {
	args := pgx.NamedArgs{"queue": queue, "limit": limit, "owner": owner, "lease": lease.Milliseconds(), "horizon": horizon.Milliseconds()}
	// The statement carries only the admission machinery the configuration can use.
	hasGates, hasRates := gates.configured(), rates.configured()
	stmt := "pick"
	switch {
	case lane.Gate != nil && LeasesGates(gates, rates):
		stmt = "pick_leased"
		args["l_key"], args["l_shard"], args["l_owner"] = lane.Gate.Key, lane.Gate.Shard, lane.Gate.Owner
	case lane.Rate != "" && RatesLanes(gates, rates):
		stmt = "pick_rate_lane"
		args["lr_key"] = lane.Rate
	case hasGates && hasRates:
		stmt = "pick_admitted"
	case hasGates:
		stmt = "pick_gated"
	case hasRates:
		stmt = "pick_rated"
	}
	if hasGates {
		args["g_names"], args["g_limits"], args["g_shards"] = gates.Names, gates.Limits, gates.Shards
		args["g_hint"] = hint.GateKeys
	}
	if hasRates {
		args["r_names"], args["r_rates"], args["r_bursts"] = rates.Names, rates.Rates, rates.Bursts
		args["r_hint"] = hint.RateKeys
	}
	// A pick never waits long: the statement's lock_timeout (its own implicit transaction, via
	// the batch) turns a wait on another transaction (a claim of the same concurrency key, a
	// gate counter or bucket being written) into an error the caller retries. Without it, such a
	// wait could close a cycle with an outcome commit waiting on a row lock the pick took and
	// kept for a row its scan then found already claimed: a deadlock.
	// (In a caller's transaction, the test kit's Drain, the setting would outlive the pick, and
	// nothing races the drain: it is left alone there.)
	if fault.Enabled && stmt == "pick_admitted" && len(rates.Names) > 0 {
		if err := fault.PointFor(fault.BucketBeforeWriteback, queue); err != nil {
			return PickResult{}, err
		}
	}
	var rows pgx.Rows
	if _, inTx := db.(pgx.Tx); inTx {
		r, err := db.Query(ctx, s.sql(stmt), args)
		if err != nil {
			return PickResult{}, err
		}
		rows = r
	} else {
		b := &pgx.Batch{}
		settings := "pick_settings_admission"
		if stmt == "pick" {
			settings = "pick_settings"
		}
		b.Queue(s.sql(settings), pickLockTimeout)
		b.Queue(s.sql(stmt), args)
		br := db.SendBatch(ctx, b)
		defer func() { _ = br.Close() }()
		if _, err := br.Exec(); err != nil {
			return PickResult{}, err
		}
		r, err := br.Query()
		if err != nil {
			return PickResult{}, err
		}
		rows = r
	}
	defer rows.Close()
	res := PickResult{}
	out := make([]Claimed, 0, limit)
	for rows.Next() {
		var c Claimed
		var attempt, maxAttempts int32
		var priority int16
		var inbox, children []byte
		var considered, refused, denied int64
		if err := rows.Scan(&c.ID, &c.Machine, &c.Step, &c.State, &attempt, &maxAttempts, &priority,
			&c.CorrelationKey, &c.InsertedAt, &c.AwaitNames, &c.Signalled, &inbox, &c.Child, &children,
			&c.ConcurrencyKey, &c.ConcurrencyShard, &c.RateLimit, &considered, &refused, &denied); err != nil {
			return PickResult{}, err
		}
		res.Considered, res.Refused, res.RateDenied = int(considered), int(refused), int(denied)
		if len(children) > 0 {
			if err := json.Unmarshal(children, &c.Children); err != nil {
				return PickResult{}, fmt.Errorf("decode children of %d: %w", c.ID, err)
			}
		}
		c.Attempt, c.MaxAttempts, c.Priority = int(attempt), int(maxAttempts), int(priority)
		if len(inbox) > 0 {
			if err := json.Unmarshal(inbox, &c.Inbox); err != nil {
				return PickResult{}, fmt.Errorf("decode inbox of %d: %w", c.ID, err)
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return PickResult{}, err
	}
	// The UPDATE returns rows in no particular order; run them in urgency order.
	sort.Slice(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority < out[j].Priority
		}
		return out[i].ID < out[j].ID
	})
	res.Rows = out
	return res, nil
}

// Lease is a gate lease: a block of one shard's slots of a gated key that one runner (Owner, its
// worker id) debited at once and admits its own claims of the key against (see gates.sql).
type Lease struct {
	Key   string
	Shard int16
	Owner string
}

// LeaseGate leases want slots of key's emptiest shard for owner, for ttl, if that shard has at
// least want*roomy free slots; ok is false if no shard has. limit and shards are the key's gate.
func (s *Store) LeaseGate(ctx context.Context, db DB, key string, limit, shards int32, owner string, want, roomy int, ttl time.Duration) (shard int16, ok bool, err error) {
	err = db.QueryRow(ctx, s.sql("gate_lease"), pgx.NamedArgs{"key": key, "lim": limit, "shards": shards, "owner": owner,
		"want": want, "roomy": roomy, "ttl": ttl.Milliseconds()}).Scan(&shard)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("lease slots of gate key %q: %w", key, err)
	}
	return shard, true, nil
}

// GrowLease adds want slots to a gate lease, if it is still there and its shard has at least
// want*roomy free slots; ok is false otherwise.
func (s *Store) GrowLease(ctx context.Context, db DB, l Lease, want, roomy int) (ok bool, err error) {
	var slots int32
	err = db.QueryRow(ctx, s.sql("gate_lease_grow"), pgx.NamedArgs{"key": l.Key, "shard": l.Shard, "owner": l.Owner,
		"want": want, "roomy": roomy}).Scan(&slots)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("grow the lease of gate key %q shard %d: %w", l.Key, l.Shard, err)
	}
	return true, nil
}

// RenewLeases extends the given gate leases to ttl from now and returns those it renewed; one it
// does not return is gone (the reconciler removed it once it expired).
func (s *Store) RenewLeases(ctx context.Context, db DB, leases []Lease, ttl time.Duration) ([]Lease, error) {
	keys, shards, owners := make([]string, len(leases)), make([]int16, len(leases)), make([]string, len(leases))
	for i, l := range leases {
		keys[i], shards[i], owners[i] = l.Key, l.Shard, l.Owner
	}
	rows, err := db.Query(ctx, s.sql("gate_lease_renew"), keys, shards, owners, ttl.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("renew gate leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
		var l Lease
		err := r.Scan(&l.Key, &l.Shard, &l.Owner)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("renew gate leases: %w", err)
	}
	return renewed, nil
}

// ReleaseLease ends a gate lease: its row goes, and its unused slots go back to the counter if
// the row was still there.
func (s *Store) ReleaseLease(ctx context.Context, db DB, l Lease, unused int) error {
	if _, err := db.Exec(ctx, s.sql("gate_lease_release"), l.Key, l.Shard, l.Owner, unused); err != nil {
		return fmt.Errorf("release the lease of gate key %q shard %d: %w", l.Key, l.Shard, err)
	}
	return nil
}

// Heartbeat extends the leases of the given claims and returns the ids of those no longer held.
func (s *Store) Heartbeat(ctx context.Context, db DB, ids []int64, owners []string, lease time.Duration) ([]int64, error) {
	rows, err := db.Query(ctx, s.sql("heartbeat"), ids, owners, lease.Milliseconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// Released is a row the reaper or a startup reclaim released.
type Released struct {
	ID      int64
	Queue   string
	Machine string
	Step    string
	Attempt int
	Status  durabletype.Status
}

// ReleaseExpired releases up to limit claims: with prefix empty (the reaper), every claim whose
// lease has run out; otherwise (startup reclaim) only claims of that worker-id prefix, whose
// lease ends before now() + slack.
func (s *Store) ReleaseExpired(ctx context.Context, db DB, limit int, prefix string, slack time.Duration) ([]Released, []Woken, error) {
	var p *string
	if prefix != "" {
		p = &prefix
	}
	// One transaction: the instances it fails and the clearing of their inboxes (which needs a
	// snapshot taken after the release) commit together.
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, s.sql("release_expired"), limit, p, slack.Milliseconds())
	if err != nil {
		return nil, nil, err
	}
	var out []Released
	var woken []Woken
	var failed []int64
	var woke bool
	var r Released
	var attempt int32
	var status string
	if _, err := pgx.ForEachRow(rows, []any{&woke, &r.ID, &r.Queue, &r.Machine, &r.Step, &attempt, &status}, func() error {
		if woke { // a parent whose last child failed here
			woken = append(woken, Woken{ID: r.ID, Queue: r.Queue})
			return nil
		}
		r.Attempt, r.Status = int(attempt), durabletype.Status(status)
		out = append(out, r)
		if r.Status.Terminal() {
			failed = append(failed, r.ID)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if fault.Enabled {
		// The claims are released, their row locks held, nothing committed yet.
		if err := fault.PointFor(fault.ReaperBetweenSelectUpdate, prefix); err != nil {
			return nil, nil, err
		}
	}
	if len(failed) > 0 {
		// Instances that failed here are finished: clear their inboxes, with a fresh snapshot
		// (see purge_terminal_inboxes).
		if _, err := tx.Exec(ctx, s.sql("purge_terminal_inboxes"), failed); err != nil {
			return nil, nil, fmt.Errorf("clear the inboxes of failed instances: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, err
	}
	return out, woken, nil
}

// InsertRow is one row to insert.
type InsertRow struct {
	Machine        string
	Step           string
	State          string // JSON
	Queue          string
	Priority       int
	ScheduledAt    *time.Time
	Delay          time.Duration
	MaxAttempts    int
	CorrelationKey string // "" for none
	ScopeMask      int16
	ConcurrencyKey string // "" for none
	RateLimit      string // "" for none
	Weight         int
}

// Inserted is the result of one input row.
type Inserted struct {
	ID        int64
	Duplicate bool
}

// Runnable reports whether an Insert of r may be claimed by its own client as it is inserted
// (InsertClaim): no correlation key, concurrency key or rate limit, and due now.
func (r *InsertRow) Runnable() bool {
	return r.CorrelationKey == "" && r.ConcurrencyKey == "" && r.RateLimit == "" && r.ScheduledAt == nil && r.Delay == 0
}

// InsertClaim inserts one row (r.Runnable() must hold) claimed for owner with a lease, unless a
// due row of its queue is ahead of it; then it is inserted available and c is nil.
func (s *Store) InsertClaim(ctx context.Context, db DB, r *InsertRow, owner string, lease time.Duration) (id int64, c *Claimed, err error) {
	if !r.Runnable() {
		return 0, nil, errors.New("insert: only a row without keys or limits, due now, can be claimed as it is inserted")
	}
	var claimed bool
	var state []byte
	var at time.Time
	if err := db.QueryRow(ctx, s.sql("insert_claim"), r.Machine, r.Step, r.State, r.Queue, int16(r.Priority),
		int32(r.MaxAttempts), owner, lease.Milliseconds()).Scan(&id, &claimed, &state, &at); err != nil {
		return 0, nil, err
	}
	if !claimed {
		return id, nil, nil
	}
	return id, &Claimed{ID: id, Machine: r.Machine, Step: r.Step, State: state, Attempt: 1, MaxAttempts: r.MaxAttempts,
		Priority: r.Priority, InsertedAt: at, Owner: owner}, nil
}

// InsertMany inserts rows in one statement and returns, per input row, the id of the new
// instance, or of the existing one it deduplicated against.
func (s *Store) InsertMany(ctx context.Context, db DB, in []InsertRow) ([]Inserted, error) {
	out := make([]Inserted, len(in))
	pending := make([]int, len(in))
	for i := range in {
		pending[i] = i
	}
	// A keyed row can be refused by the unique index and then find no instance to point at, if
	// the one it collided with finished (and left its scope) in between. Such rows are simply
	// inserted again; each round is a new statement with a new snapshot.
	for round := 0; len(pending) > 0; round++ {
		if round == 5 {
			return nil, fmt.Errorf("insert: %d keyed rows kept colliding with instances that finished meanwhile", len(pending))
		}
		next, err := s.insertRound(ctx, db, in, pending, out)
		if err != nil {
			return nil, err
		}
		pending = next
	}
	return out, nil
}

func (s *Store) insertRound(ctx context.Context, db DB, in []InsertRow, idx []int, out []Inserted) ([]int, error) {
	n := len(idx)
	machines := make([]string, n)
	steps := make([]string, n)
	states := make([]string, n)
	queues := make([]string, n)
	prios := make([]int16, n)
	sched := make([]*time.Time, n)
	delays := make([]int64, n)
	maxAtt := make([]int32, n)
	keys := make([]*string, n)
	masks := make([]int16, n)
	ords := make([]int32, n)
	ckeys := make([]*string, n)
	rates := make([]*string, n)
	weights := make([]int32, n)
	for j, i := range idx {
		r := &in[i]
		machines[j], steps[j], states[j], queues[j] = r.Machine, r.Step, r.State, r.Queue
		prios[j], sched[j], delays[j], maxAtt[j] = int16(r.Priority), r.ScheduledAt, r.Delay.Milliseconds(), int32(r.MaxAttempts)
		if r.CorrelationKey != "" {
			keys[j] = &in[i].CorrelationKey
		}
		masks[j], ords[j] = r.ScopeMask, int32(i)
		if r.ConcurrencyKey != "" {
			ckeys[j] = &in[i].ConcurrencyKey
		}
		if r.RateLimit != "" {
			rates[j] = &in[i].RateLimit
		}
		weights[j] = int32(max(r.Weight, 1))
	}
	var rows pgx.Rows
	var err error
	if n == 1 {
		rows, err = db.Query(ctx, s.sql("insert_one"), machines[0], steps[0], states[0], queues[0], prios[0], sched[0],
			delays[0], maxAtt[0], keys[0], masks[0], ords[0], ckeys[0], rates[0], weights[0])
	} else {
		rows, err = db.Query(ctx, s.sql("insert_many"), machines, steps, states, queues, prios, sched, delays, maxAtt,
			keys, masks, ords, ckeys, rates, weights)
	}
	if err != nil {
		return nil, err
	}
	type mk struct{ machine, key string }
	byKey := map[mk]int64{}
	var unkeyed []int64
	var id int64
	var machine, key string
	if _, err := pgx.ForEachRow(rows, []any{&id, &machine, &key}, func() error {
		if key == "" {
			unkeyed = append(unkeyed, id)
		} else {
			byKey[mk{machine, key}] = id
		}
		return nil
	}); err != nil {
		return nil, err
	}
	// Unkeyed rows are never deduplicated; their ids ascend in input order.
	sort.Slice(unkeyed, func(a, b int) bool { return unkeyed[a] < unkeyed[b] })
	u := 0
	var missing []int
	for _, i := range idx {
		r := &in[i]
		if r.CorrelationKey == "" {
			if u >= len(unkeyed) {
				return nil, errors.New("insert: fewer ids returned than unkeyed rows")
			}
			out[i] = Inserted{ID: unkeyed[u]}
			u++
			continue
		}
		k := mk{r.Machine, r.CorrelationKey}
		if id, ok := byKey[k]; ok {
			out[i] = Inserted{ID: id}
			delete(byKey, k) // a later row with the same key is a duplicate of this one
			continue
		}
		missing = append(missing, i)
	}
	if len(missing) == 0 {
		return nil, nil
	}
	// Rows with the same key inside this batch point at the row that was inserted.
	inserted := map[mk]int64{}
	for _, i := range idx {
		if in[i].CorrelationKey != "" && out[i].ID != 0 {
			inserted[mk{in[i].Machine, in[i].CorrelationKey}] = out[i].ID
		}
	}
	var lookup []int
	for _, i := range missing {
		if id, ok := inserted[mk{in[i].Machine, in[i].CorrelationKey}]; ok {
			out[i] = Inserted{ID: id, Duplicate: true}
			continue
		}
		lookup = append(lookup, i)
	}
	if len(lookup) == 0 {
		return nil, nil
	}
	lm := make([]string, len(lookup))
	lk := make([]string, len(lookup))
	ls := make([]int16, len(lookup))
	lo := make([]int32, len(lookup))
	for j, i := range lookup {
		lm[j], lk[j], ls[j], lo[j] = in[i].Machine, in[i].CorrelationKey, in[i].ScopeMask, int32(i)
	}
	rows, err = db.Query(ctx, s.sql("insert_find_existing"), lm, lk, ls, lo)
	if err != nil {
		return nil, err
	}
	found := map[int]int64{}
	var ord int32
	if _, err := pgx.ForEachRow(rows, []any{&ord, &id}, func() error {
		found[int(ord)] = id
		return nil
	}); err != nil {
		return nil, err
	}
	var again []int
	for _, i := range lookup {
		if id, ok := found[i]; ok {
			out[i] = Inserted{ID: id, Duplicate: true}
		} else {
			again = append(again, i)
		}
	}
	return again, nil
}

// GetInstance reads one instance row.
func (s *Store) GetInstance(ctx context.Context, db DB, id int64) (*durabletype.Instance, error) {
	in, err := scanInstance(db.QueryRow(ctx, s.sql("get_instance"), id), nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", durabletype.ErrNotFound, id)
	}
	return in, err
}

// CountByStatus counts instances by status, for one queue or ("") all.
func (s *Store) CountByStatus(ctx context.Context, db DB, queue string) (map[durabletype.Status]int64, error) {
	var q *string
	if queue != "" {
		q = &queue
	}
	rows, err := db.Query(ctx, s.sql("count_by_status"), q)
	if err != nil {
		return nil, err
	}
	out := map[durabletype.Status]int64{}
	var status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		out[durabletype.Status(status)] = n
		return nil
	})
	return out, err
}

// RunnableQueues lists the queues with rows due within horizon.
func (s *Store) RunnableQueues(ctx context.Context, db DB, horizon time.Duration) ([]string, error) {
	rows, err := db.Query(ctx, s.sql("runnable_queues"), horizon.Milliseconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Reason is a failure reason and how many failed instances it ended.
type Reason struct {
	Reason string
	Count  int64
}

// FailureReasons counts failed instances by their last error.
func (s *Store) FailureReasons(ctx context.Context, db DB) ([]Reason, error) {
	rows, err := db.Query(ctx, s.sql("failure_reasons"))
	if err != nil {
		return nil, err
	}
	var out []Reason
	var r Reason
	_, err = pgx.ForEachRow(rows, []any{&r.Reason, &r.Count}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// PreloadTerminal inserts n finished rows (the benchmark's large-table set-up).
func (s *Store) PreloadTerminal(ctx context.Context, db DB, n int, machine, queue string) error {
	_, err := db.Exec(ctx, s.sql("bench_preload_terminal"), n, machine, queue)
	return err
}

// Delivered is the result of a delivered signal.
type Delivered struct {
	SignalID   int64
	InstanceID int64
	Woke       bool
	Queue      string
}

// DeliverSignal stores a signal for a live instance (by id, or by machine and correlation key
// when id is 0) and wakes it if it awaits that name. found is false when the target is finished
// or does not exist; then nothing was stored.
func (s *Store) DeliverSignal(ctx context.Context, db DB, id int64, machine, key, name string, payload *string) (Delivered, bool, error) {
	var idArg *int64
	if id != 0 {
		idArg = &id
	}
	if fault.Enabled {
		subject := machine + "/" + key
		if id != 0 {
			subject = strconv.FormatInt(id, 10)
		}
		if err := fault.PointFor(fault.DeliverBeforeWake, subject); err != nil {
			return Delivered{}, false, err
		}
	}
	var d Delivered
	err := db.QueryRow(ctx, s.sql("deliver_signal"), idArg, machine, key, name, payload).Scan(&d.SignalID, &d.InstanceID, &d.Woke, &d.Queue)
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivered{}, false, nil
	}
	if err != nil {
		return Delivered{}, false, err
	}
	return d, true, nil
}

// Fired is an instance whose await deadline woke it.
type Fired struct {
	ID      int64
	Queue   string
	Machine string
	Step    string
}

// FireAwaitDeadlines wakes up to limit parked instances whose deadline is within horizon.
func (s *Store) FireAwaitDeadlines(ctx context.Context, db DB, limit int, horizon time.Duration) ([]Fired, error) {
	rows, err := db.Query(ctx, s.sql("fire_await_deadlines"), limit, horizon.Milliseconds())
	if err != nil {
		return nil, err
	}
	var out []Fired
	var f Fired
	_, err = pgx.ForEachRow(rows, []any{&f.ID, &f.Queue, &f.Machine, &f.Step}, func() error {
		out = append(out, f)
		return nil
	})
	return out, err
}

// Retryable reports whether err is worth retrying as is: the connection failed or was closed,
// the server is shutting down or out of resources, or the transaction lost a serialization or
// deadlock conflict. A statement the server rejected for its content (a constraint, a type, a
// syntax error) fails the same way every time.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57", "58":
			return true
		}
		return false
	}
	// Not a server error: a network or protocol failure.
	return true
}

// ReconcileGates sets the gate counters that disagree with the executing rows, their leases or
// the configuration right, and removes expired leases (see gates.sql), in one transaction; it
// returns how many counters it repaired and removed.
func (s *Store) ReconcileGates(ctx context.Context, db DB, g *Gates) (repaired, removed int, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	cfg := pgx.NamedArgs{"g_names": g.Names, "g_limits": g.Limits, "g_shards": g.Shards}
	rows, err := tx.Query(ctx, s.sql("reconcile_gates_lock"), cfg)
	if err != nil {
		return 0, 0, err
	}
	var keys []string
	var shards []int16
	var key string
	var shard int16
	if _, err := pgx.ForEachRow(rows, []any{&key, &shard}, func() error {
		keys, shards = append(keys, key), append(shards, shard)
		return nil
	}); err != nil {
		return 0, 0, err
	}
	if len(keys) == 0 {
		return 0, 0, tx.Commit(ctx)
	}
	cfg["keys"], cfg["shards"] = keys, shards
	rows, err = tx.Query(ctx, s.sql("reconcile_gates_leases"), cfg)
	if err != nil {
		return 0, 0, err
	}
	var xKeys, xOwners []string
	var xShards []int16
	var owner string
	if _, err := pgx.ForEachRow(rows, []any{&key, &shard, &owner}, func() error {
		xKeys, xShards, xOwners = append(xKeys, key), append(xShards, shard), append(xOwners, owner)
		return nil
	}); err != nil {
		return 0, 0, err
	}
	cfg["x_keys"], cfg["x_shards"], cfg["x_owners"] = xKeys, xShards, xOwners
	if fault.Enabled {
		// The counters that look wrong and their expired leases are locked; the repair has not
		// read the truth yet.
		if err := fault.Point(fault.GCBetweenSelectDelete); err != nil {
			return 0, 0, err
		}
	}
	var rep, rem int64
	if err := tx.QueryRow(ctx, s.sql("reconcile_gates_fix"), cfg).Scan(&rep, &rem); err != nil {
		return 0, 0, err
	}
	return int(rep), int(rem), tx.Commit(ctx)
}

// GateContention reports whether err is a pick losing a race for a concurrency key or the last
// slot of a gate, or waiting on another transaction past its lock timeout (it is retried).
func GateContention(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return (pgErr.Code == "23505" && pgErr.ConstraintName == "instances_concurrency_active") ||
		(pgErr.Code == "23514" && pgErr.ConstraintName == "gates_held") ||
		pgErr.Code == "55P03" // lock_timeout: the pick waited on another transaction too long
}

// GCBuckets deletes up to 1,000 buckets that are refilled or whose limit is not configured.
func (s *Store) GCBuckets(ctx context.Context, db DB, r *Rates) (int, error) {
	tag, err := db.Exec(ctx, s.sql("gc_buckets"), pgx.NamedArgs{"r_names": r.Names})
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// RateUnknown counts the runnable rows stalled on each limit the configuration does not name.
func (s *Store) RateUnknown(ctx context.Context, db DB, r *Rates) (map[string]int, error) {
	rows, err := db.Query(ctx, s.sql("rate_unknown"), pgx.NamedArgs{"r_names": r.Names})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
		out[name] = int(n)
		return nil
	})
	return out, err
}

// GCCursor is where a GC sweep's next batch starts: after the (finalized_at, id) of the last row
// the previous batch deleted. The zero value starts at the beginning.
type GCCursor struct {
	At time.Time
	ID int64
}

// GCInstances deletes up to batch finished instances whose finalized_at is older than retention,
// after cur in (finalized_at, id) order, with their inboxes (see gc.sql). It returns how many it
// deleted and the cursor for the next batch.
func (s *Store) GCInstances(ctx context.Context, db DB, retention time.Duration, batch int, cur GCCursor) (int, GCCursor, error) {
	args := s.GCInstancesArgs(retention, batch, cur)
	var n int64
	var at *time.Time
	var id *int64
	if err := db.QueryRow(ctx, s.sql("gc_instances"), args).Scan(&n, &at, &id); err != nil {
		return 0, cur, err
	}
	if at != nil && id != nil {
		cur = GCCursor{At: *at, ID: *id}
	}
	return int(n), cur, nil
}

// GCInstancesArgs are the arguments of one GC batch (GCInstances; tests EXPLAIN the statement
// with them).
func (s *Store) GCInstancesArgs(retention time.Duration, batch int, cur GCCursor) pgx.NamedArgs {
	args := pgx.NamedArgs{"retention_ms": retention.Milliseconds(), "batch": batch,
		"after_at": pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, "after_id": int64(0)}
	if !cur.At.IsZero() {
		args["after_at"], args["after_id"] = cur.At, cur.ID
	}
	return args
}

// Statement returns the text of a named statement as this Store runs it (for EXPLAIN in tests
// and tools).
func (s *Store) Statement(name string) string { return s.sql(name) }

// UnsafeSearchPath lists the schemas on the session's search_path in which PUBLIC, or a role
// other than the current one that is not a superuser, can create objects (see searchpath.sql).
func (s *Store) UnsafeSearchPath(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, s.sql("unsafe_search_path"))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
