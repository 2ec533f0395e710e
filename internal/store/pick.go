package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/fault"
	"github.com/jackc/pgx/v5"
)

// Claimed is a row the pick claimed.
type Claimed struct {
	ID          int64
	Machine     string
	Step        string
	State       []byte
	Attempt     int
	MaxAttempts int
	// Recoveries is how many claims of its current step the row has lost (ReleaseExpired, a
	// hand-back with a reason): the executor fails it past the client's MaxRecoveries.
	Recoveries     int
	Priority       int
	CorrelationKey string
	InsertedAt     time.Time
	// AwaitNames are the names the instance parked on, if this step runs after an Await.
	AwaitNames []string
	// Inbox is the instance's inbox as of the pick, oldest first: up to the Store's ClaimRows
	// signals, all of it once LoadRest has run.
	Inbox []SignalRow
	// Signalled says the instance has ever received a signal.
	Signalled bool
	// Child says the instance has a parent.
	Child bool
	// Children are the parent's latest wave, loaded when its join step is due: up to the
	// Store's ClaimRows children, all of them once LoadRest has run.
	Children []ChildRow
	// inboxMore and childrenMore say the pick loaded as many signals or children as it could:
	// there may be more, which LoadRest reads.
	inboxMore, childrenMore bool
	// ConcurrencyKey is the row's key (nil: none); ConcurrencyShard the gate shard its claim
	// debited (nil: not gated). The outcome credits that shard back.
	ConcurrencyKey   *string
	ConcurrencyShard *int16
	// RateLimit is the rate limit the claim was granted under (nil: none).
	RateLimit *string
	// Queue is the row's queue; FairKey its fairness key (nil: none).
	Queue   string
	FairKey *string
	// Owner is the claim token the pick set (filled in by the caller).
	Owner string
	// MachineVersion is the version of its machine the row was last brought to.
	MachineVersion int
	// CodecErr says why a sealed value the step would read could not be opened (it wraps
	// durabletype.ErrCodec): the step cannot run on this node.
	CodecErr error
}

// Slot returns the gate slot the claim took (nil: none).
func (c *Claimed) Slot() *GateSlot {
	if c.ConcurrencyKey == nil || c.ConcurrencyShard == nil {
		return nil
	}
	return &GateSlot{Key: *c.ConcurrencyKey, Shard: *c.ConcurrencyShard}
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

// FairWeights are the fairness weights a client configures (parallel slices): a key's share of a
// queue is its weight over the sum of the weights of the keys with runnable rows. Any other key,
// and the rows without a key (which share as one), weigh Default.
type FairWeights struct {
	Keys    []string
	Weights []float64
	Default float64
	by      map[string]float64
}

// NewFairWeights returns the weights of m, and def (1 if not above 0) for any other key.
func NewFairWeights(m map[string]float64, def float64) *FairWeights {
	if def <= 0 {
		def = 1
	}
	f := &FairWeights{Keys: []string{}, Weights: []float64{}, Default: def, by: make(map[string]float64, len(m))}
	for k, w := range m {
		f.Keys, f.Weights = append(f.Keys, k), append(f.Weights, w)
		f.by[k] = w
	}
	return f
}

// Of returns key's weight ("" is the rows without a key).
func (f *FairWeights) Of(key string) float64 {
	if f == nil {
		return 1
	}
	if w, ok := f.by[key]; ok {
		return w
	}
	return f.Default
}

// fairRankings numbers the rows one statement makes runnable at once with a fairness key, per
// queue, priority and key, from 1: rows of one key in one statement take consecutive places in
// the fair order (insert.sql's fair_base). The zero value is ready to use.
type fairRankings map[fairGroup]int32

type fairGroup struct {
	queue    string
	priority int
	key      string
}

// next returns the next rank of key's rows in queue at priority.
func (r *fairRankings) next(queue string, priority int, key string) *int32 {
	if *r == nil {
		*r = fairRankings{}
	}
	g := fairGroup{queue, priority, key}
	(*r)[g]++
	rank := (*r)[g]
	return &rank
}

func (f *FairWeights) args() ([]string, []float64, float64) {
	if f == nil {
		return []string{}, []float64{}, 1
	}
	return f.Keys, f.Weights, f.Default
}

// pickVariant is one pick statement, as the list of pick.sql's fragments it is made of (see the
// shape at the top of pick.sql). A filter "a OR b" passes a row that either fragment passes.
type pickVariant struct {
	config  []string // CTEs the scan and admission read: the configuration, the lease held
	filters []string // the candidate scan's tests, each row must pass them all
	admit   []string // CTEs from the candidates to the admitted rows (the rate limits' grants)
	chosen  string   // the CTE of the rows to claim, with their gate shards
	refused string   // the CTE of what admission refused (events)
}

// pickVariants declares every pick statement, by name (see Pick for which one runs).
var pickVariants = map[string]pickVariant{
	// No gates or rate limits configured: every key is K = 1.
	"pick": {
		filters: []string{"version_known", "not_paused", "key_runnable", "no_rate_limit"},
		chosen:  "chosen_first_of_key(candidates)", refused: "refused_none",
	},
	// Gates, no rate limits.
	"pick_gated": {
		config:  []string{"gate_config"},
		filters: []string{"version_known", "not_paused", "gate_has_room", "no_rate_limit"},
		admit:   []string{"admit_all"},
		chosen:  "chosen_gate_debit", refused: "refused_none",
	},
	// Rate limits, no gates.
	"pick_rated": {
		config:  []string{"rate_config"},
		filters: []string{"version_known", "not_paused", "key_runnable", "rate_has_token"},
		admit:   []string{"eligible_ungated", "rate_grants", "bucket_debit", "rate_admitted"},
		chosen:  "chosen_first_of_key(admitted)", refused: "refused_count",
	},
	// Gates and rate limits.
	"pick_admitted": {
		config:  []string{"gate_config", "rate_config"},
		filters: []string{"version_known", "not_paused", "gate_has_room", "rate_has_token"},
		admit:   []string{"eligible_gated", "rate_grants", "bucket_debit", "rate_admitted"},
		chosen:  "chosen_gate_debit", refused: "refused_count",
	},
	// On a gate lease (Lane.Gate): the leased key's rows pass untested and take the lease's
	// slots; no counter is read or written for them.
	"pick_leased": {
		config:  []string{"gate_config", "lease_held"},
		filters: []string{"version_known", "not_paused", "lease_key OR gate_has_room", "no_rate_limit"},
		chosen:  "chosen_lease", refused: "refused_none",
	},
	// On a rate lane (Lane.Rate): the lane's rows pass untested and are granted in one debit.
	"pick_rate_lane": {
		config:  []string{"rate_config"},
		filters: []string{"version_known", "not_paused", "key_runnable", "lane_limit OR rate_has_token"},
		admit:   []string{"lane_grant", "bucket_debit"},
		chosen:  "chosen_lane", refused: "refused_none",
	},
}

// pickTemplates writes each variant as a statement of fragment splices, for New to expand: with
// the plain scan and ("_fair") the fair one (see pick.sql), each once with rows due now and once
// ("_horizon") with rows due within a horizon (the test kit's Drain).
func pickTemplates() map[string]string {
	out := make(map[string]string, 4*len(pickVariants))
	for name, v := range pickVariants {
		for _, fair := range []bool{false, true} {
			n := name
			if fair {
				n += "_fair"
			}
			out[n] = pickTemplate(v, "due", fair)
			out[n+"_horizon"] = pickTemplate(v, "due_within_horizon", fair)
		}
	}
	return out
}

// pickTemplate writes one variant whose scan tests due rows with the fragment due, with the plain
// scan or the fair one.
func pickTemplate(v pickVariant, due string, fair bool) string {
	splice := func(name string) string { return "{{" + name + "}}" }
	tests := "\n        AND " + splice(due)
	for _, f := range v.filters {
		alts := strings.Split(f, " OR ")
		for i, a := range alts {
			alts[i] = splice(a)
		}
		test := alts[0]
		if len(alts) > 1 {
			test = "(" + strings.Join(alts, " OR ") + ")"
		}
		tests += "\n        AND " + test
	}
	scan := splice("scan_plain_begin") + tests + "\n" + splice("scan_plain_end")
	if fair {
		// The tagged rows and the untagged ones, each under every test (see pick.sql).
		scan = splice("scan_begin") + tests + "\n" + splice("scan_tagged_end") + tests + "\n" + splice("scan_end")
	}
	var ctes []string
	for _, c := range v.config {
		ctes = append(ctes, splice(c))
	}
	ctes = append(ctes, scan)
	for _, c := range v.admit {
		ctes = append(ctes, splice(c))
	}
	ctes = append(ctes, splice(v.chosen), splice(v.refused))
	return "WITH " + strings.Join(ctes, ",\n") + "\n" + splice("claim")
}

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
	// Tagged says the queue held runnable rows with a fair tag as the pick began (pick_tagged,
	// sent in the pick's round trip, before it): its next pick must use the fair scan.
	Tagged bool
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

// Versions names the machines a client registers at a version above 1, with their versions
// (parallel slices): its picks claim rows of those machines up to those versions, and rows of any
// other machine at version 1 only.
type Versions struct {
	Names    []string
	Versions []int32
}

// PickOpts is how a pick claims: for how long, how far ahead, what it admits against, and which
// way (Hint, Lane).
type PickOpts struct {
	// Lease is how long the claims last without a heartbeat.
	Lease time.Duration
	// Horizon makes rows scheduled up to now + Horizon due (0 in production).
	Horizon time.Duration
	// Gates and Rates are the client's admission configuration (nil: none).
	Gates *Gates
	Rates *Rates
	// Versions are the client's machine versions (nil: every machine at version 1).
	Versions *Versions
	// PausedMachines are the machines whose rows the pick must leave alone.
	PausedMachines []string
	// Fair are the client's fairness weights (nil: every key weighs 1). FairOrder picks with the
	// fair scan, for a queue that holds tagged rows (PickResult.Tagged); without it a pick claims
	// nothing from such a queue.
	Fair      *FairWeights
	FairOrder bool
	// Hint only makes an admission pick cheaper (see Hint); Lane makes it leaner still for a
	// batch like the last one (see Lane).
	Hint Hint
	Lane Lane
	// ClaimRows, if positive, is how many signals of an inbox and children of a join the pick
	// loads with each row, in place of the Store's ClaimRows.
	ClaimRows int
}

// Pick claims up to limit due rows of queue for the claim token owner.
func (s *Store) Pick(ctx context.Context, db DB, queue string, limit int, owner string, o PickOpts) (PickResult, error) {
	claimRows := s.claimRows()
	if o.ClaimRows > 0 {
		claimRows = o.ClaimRows
	}
	args := pgx.NamedArgs{"queue": queue, "limit": limit, "owner": owner, "lease": o.Lease.Milliseconds(),
		"claim_rows": claimRows,
		"mv_names":   []string{}, "mv_versions": []int32{},
		"paused_machines": o.PausedMachines}
	if o.PausedMachines == nil {
		args["paused_machines"] = []string{}
	}
	if o.Versions != nil {
		args["mv_names"], args["mv_versions"] = o.Versions.Names, o.Versions.Versions
	}
	args["fw_keys"], args["fw_weights"], args["fw_default"] = o.Fair.args()
	// The statement carries only the admission machinery the configuration can use.
	gates, rates, hint, lane := o.Gates, o.Rates, o.Hint, o.Lane
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
	if o.FairOrder {
		stmt += "_fair"
	}
	if o.Horizon != 0 {
		// The test kit's Drain: rows scheduled up to the horizon are due (see pick.sql).
		stmt += "_horizon"
		args["horizon"] = o.Horizon.Milliseconds()
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
	if fault.Enabled && strings.HasPrefix(stmt, "pick_admitted") && len(rates.Names) > 0 {
		if err := fault.PointFor(fault.BucketBeforeWriteback, queue); err != nil {
			return PickResult{}, err
		}
	}
	rows, tagged, done, err := s.queryPicking(ctx, db, stmt, queue, args)
	if err != nil {
		return PickResult{}, err
	}
	res := PickResult{Tagged: tagged}
	res.Rows, err = s.claimedRows(rows, queue, limit, claimRows, &res)
	// The claims are the batch's implicit transaction's: they stand only if it commits.
	if derr := done(); err == nil {
		err = derr
	}
	if err != nil {
		return PickResult{}, err
	}
	return res, nil
}

// claimedRows reads a pick's claimed rows (and its counts into res), in urgency order.
func (s *Store) claimedRows(rows pgx.Rows, queue string, limit, claimRows int, res *PickResult) ([]Claimed, error) {
	out := make([]Claimed, 0, limit)
	// Scanned through pointers, these escape: declared once per pick, not once per row, and each
	// row is scanned in place in out.
	var attempt, maxAttempts, recoveries int32
	var priority int16
	var inbox, children []byte
	var considered, refused, denied int64
	var version int32
	for rows.Next() {
		out = append(out, Claimed{})
		c := &out[len(out)-1]
		inbox, children = nil, nil
		if err := rows.Scan(&c.ID, &c.Machine, &c.Step, &c.State, &attempt, &maxAttempts, &priority,
			&c.CorrelationKey, &c.InsertedAt, &c.AwaitNames, &c.Signalled, &inbox, &c.Child, &children,
			&c.ConcurrencyKey, &c.ConcurrencyShard, &c.RateLimit, &version, &c.FairKey, &recoveries,
			&considered, &refused, &denied); err != nil {
			return nil, err
		}
		res.Considered, res.Refused, res.RateDenied = int(considered), int(refused), int(denied)
		if len(children) > 0 {
			if err := json.Unmarshal(children, &c.Children); err != nil {
				return nil, fmt.Errorf("decode children of %d: %w", c.ID, err)
			}
			c.childrenMore = len(c.Children) >= claimRows
		}
		c.Attempt, c.MaxAttempts, c.Priority, c.MachineVersion = int(attempt), int(maxAttempts), int(priority), int(version)
		c.Recoveries = int(recoveries)
		if err := c.decodeInbox(inbox, claimRows); err != nil {
			return nil, err
		}
		c.Queue = queue
		s.openClaim(c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// The UPDATE returns rows in no particular order; run them in urgency order.
	sort.Slice(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority < out[j].Priority
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// queryPicking runs pick statement stmt for queue under pick_settings, sent with it in one round
// trip (its own implicit transaction), so that its plan stays index probes whatever the
// statistics said when it was cached; pick_tagged for the queue goes before stmt in the same
// round trip, so that the caller learns whether the queue holds tagged rows without a round trip
// of its own between the pick and the running of what it claimed. (Before the pick, not after
// it: the batch is one transaction, and a probe that failed after the pick would roll its claims
// back.) done closes the rows and the batch; its error (the commit's) means the claims did not
// stand. In a caller's transaction (the test kit's Drain) the settings would outlive it, and the
// statements run as they are.
func (s *Store) queryPicking(ctx context.Context, db DB, stmt, queue string, args pgx.NamedArgs) (rows pgx.Rows, tagged bool, done func() error, err error) {
	probe := pgx.NamedArgs{"queue": queue}
	if _, inTx := db.(pgx.Tx); inTx {
		if err := db.QueryRow(ctx, s.sql("pick_tagged"), s.named(probe)).Scan(&tagged); err != nil {
			return nil, false, nil, err
		}
		rows, err := db.Query(ctx, s.sql(stmt), s.named(args))
		if err != nil {
			return nil, false, nil, err
		}
		return rows, tagged, func() error { rows.Close(); return rows.Err() }, nil
	}
	b := &pgx.Batch{}
	b.Queue(s.sql("pick_settings"), pickLockTimeout)
	b.Queue(s.sql("pick_tagged"), s.named(probe))
	b.Queue(s.sql(stmt), s.named(args))
	br := db.SendBatch(ctx, b)
	fail := func(err error) (pgx.Rows, bool, func() error, error) {
		_ = br.Close()
		return nil, false, nil, err
	}
	if _, err := br.Exec(); err != nil {
		return fail(err)
	}
	if err := br.QueryRow().Scan(&tagged); err != nil {
		return fail(err)
	}
	rows, err = br.Query()
	if err != nil {
		return fail(err)
	}
	return rows, tagged, func() error {
		rows.Close()
		err := rows.Err()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	}, nil
}

// DefaultClaimRows is the Store's ClaimRows when it is not set: with payloads of at most 1 MiB,
// 100 of them aggregate to well under jsonb's 256 MB.
const DefaultClaimRows = 100

func (s *Store) claimRows() int {
	if s.ClaimRows > 0 {
		return s.ClaimRows
	}
	return DefaultClaimRows
}

// ClaimRowsFor is the ClaimRows for payloads of at most maxPayload bytes: as many as fit 128 MiB
// (half of jsonb's limit on one aggregated value), between 1 and DefaultClaimRows.
func ClaimRowsFor(maxPayload int) int {
	if maxPayload <= 0 {
		return DefaultClaimRows
	}
	return max(1, min(DefaultClaimRows, (128<<20)/maxPayload))
}

// decodeInbox sets the claim's inbox from a claim statement's aggregate of its first signals (at
// most claimRows; none: nil), and whether there may be more for LoadRest.
func (c *Claimed) decodeInbox(inbox []byte, claimRows int) error {
	if len(inbox) == 0 {
		return nil
	}
	if err := json.Unmarshal(inbox, &c.Inbox); err != nil {
		return fmt.Errorf("decode inbox of %d: %w", c.ID, err)
	}
	// JSON carries the session's offset (TimeZone); the rest of an inbox, scanned by the
	// driver, comes in the local zone: the same, whichever part a signal is in.
	for i := range c.Inbox {
		c.Inbox[i].At = c.Inbox[i].At.Local()
	}
	c.inboxMore = len(c.Inbox) >= claimRows
	return nil
}

// HasMore reports whether the pick may have left part of the claimed row's inbox or of its
// join's children unread (LoadRest reads it).
func (c *Claimed) HasMore() bool {
	return c.inboxMore || c.childrenMore
}

// LoadRest reads the rest of a claimed row's inbox and of its join's children past what the pick
// loaded (claim_inbox_rest, claim_children_rest), opening sealed values as the pick does.
func (s *Store) LoadRest(ctx context.Context, db DB, c *Claimed) error {
	if c.inboxMore {
		n := len(c.Inbox)
		var sg SignalRow
		var payload []byte
		if err := readRest(ctx, db, s.sql("claim_inbox_rest"), c.ID, c.Inbox[n-1].ID,
			[]any{&sg.ID, &sg.Name, &payload, &sg.At}, func() {
				sg.Payload = json.RawMessage(payload)
				c.Inbox = append(c.Inbox, sg)
			}); err != nil {
			return fmt.Errorf("read the rest of the inbox of %d: %w", c.ID, err)
		}
		c.inboxMore = false
		s.openRest(c, c.Inbox[n:], nil)
	}
	if c.childrenMore {
		n := len(c.Children)
		var ch ChildRow
		var result []byte
		if err := readRest(ctx, db, s.sql("claim_children_rest"), c.ID, c.Children[n-1].ID,
			[]any{&ch.ID, &ch.Machine, &ch.Status, &result, &ch.Error}, func() {
				ch.Result = json.RawMessage(result)
				c.Children = append(c.Children, ch)
			}); err != nil {
			return fmt.Errorf("read the rest of the children of %d: %w", c.ID, err)
		}
		c.childrenMore = false
		s.openRest(c, nil, c.Children[n:])
	}
	return nil
}

// readRest runs one of the LoadRest statements for row id past the id after, scanning each row
// into dest and calling add after each.
func readRest(ctx context.Context, db DB, sql string, id, after int64, dest []any, add func()) error {
	rows, err := db.Query(ctx, sql, id, after)
	if err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, dest, func() error { add(); return nil })
	return err
}
