package gendurable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/internal/bridge"
	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/jsonx"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	bridge.Engine = func(c any) (*engine.Engine, engine.Pool) {
		cl := c.(*Client)
		return cl.eng, cl.pool
	}
}

// Client inserts instances and, once started, works the queues of its Config. Several clients
// may share a process (give each its own Name) and any number of processes may share a schema.
type Client struct {
	pool       *pgxpool.Pool
	eng        *engine.Engine
	store      *store.Store
	maxPayload int
	// service and declared are Config.Service and the schedules its Config declares, written at
	// Start.
	service  string
	declared []store.ScheduleDef
}

// NewClient validates cfg and builds a client on pool. Nothing runs and nothing touches the
// database until Start; an invalid config is a *ConfigError.
func NewClient(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("gendurable: NewClient: nil pool")
	}
	ec, schema, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	st, err := store.New(schema)
	if err != nil {
		return nil, err
	}
	// A claimed row's inbox and join are loaded with it up to a size that one value aggregated
	// in the pick can hold; the executor reads the rest.
	st.ClaimRows = store.ClaimRowsFor(ec.MaxPayload)
	if cfg != nil {
		ec.OpenPoke = openPoke(cfg.Poke, pool, schema, ec.Name, ec.Logger)
		st.Codec = cfg.Codec
	}
	ec.CheckSchema = func(version, readers int) error {
		return durablemigrate.State{Version: version, Readers: readers}.Check(schema)
	}
	c := &Client{pool: pool, eng: engine.New(pool, st, ec), store: st, maxPayload: ec.MaxPayload}
	if cfg != nil {
		if err := c.declare(cfg); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// declare validates the schedules cfg declares.
func (c *Client) declare(cfg *Config) error {
	if cfg.Service != "" {
		if err := checkName("service name", cfg.Service); err != nil {
			return cfgErr("Service", "%v", err)
		}
	}
	c.service = cfg.Service
	seen := map[string]bool{}
	for i := range cfg.Schedules {
		s := &cfg.Schedules[i]
		def, err := c.scheduleDef(s, cfg.Service)
		if err != nil {
			var ie *InputError
			if errors.As(err, &ie) {
				return &ConfigError{Field: fmt.Sprintf("Schedules[%d].%s", i, ie.Field), Reason: ie.Reason, Err: ie.Err}
			}
			return err
		}
		if seen[s.Name] {
			return cfgErr(fmt.Sprintf("Schedules[%d].Name", i), "%q: declared twice", s.Name)
		}
		seen[s.Name] = true
		c.declared = append(c.declared, def)
	}
	return nil
}

// Schema is the schema the client works in.
func (c *Client) Schema() string { return c.store.Schema }

// Start checks that the schema is migrated, releases claims a dead predecessor of this client
// left behind (same name, queue and host, lease gone stale), then starts the queues' schedulers,
// the heartbeat, the reaper and the schedule firer, and writes the schedules its Config declares
// (removing those its Service declared before and no longer does). It never runs DDL: migrate first (Migrate or `gendurable migrate`).
// It logs a warning if the pool's search_path holds a schema that other roles can create objects
// in (see the operations guide, "Roles and grants"). Once the schema check has answered, a
// statement of Start's that fails in a way worth retrying (a lost connection, a lock or statement
// timeout, a server restarting) is tried again, with a warning, for up to twice the engine's
// statement deadline (the lease, within 5 to 30 seconds) before Start returns its error.
func (c *Client) Start(ctx context.Context) error {
	if err := durablemigrate.Check(ctx, c.pool, c.store.Schema); err != nil {
		return err
	}
	if err := c.checkIsolation(ctx); err != nil {
		return err
	}
	c.checkSearchPath(ctx)
	if err := c.eng.Start(ctx); err != nil {
		return err
	}
	if err := c.reconcileSchedules(ctx); err != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = c.eng.Stop(sctx)
		return err
	}
	c.eng.KickSchedules()
	return nil
}

// checkIsolation refuses a pool whose sessions default to an isolation other than read
// committed (default_transaction_isolation set for the role, the database or the connection):
// gendurable's statements rely on read committed's re-reads of rows changed under them, and
// under repeatable read or serializable its picks and outcome batches fail one another's
// serialization constantly (see store's session.sql).
func (c *Client) checkIsolation(ctx context.Context) error {
	iso, err := c.store.DefaultIsolation(ctx, c.pool)
	if err != nil {
		return fmt.Errorf("gendurable: read the session's default_transaction_isolation: %w", err)
	}
	if iso != "read committed" {
		return fmt.Errorf("gendurable: the pool's sessions default to %s isolation (default_transaction_isolation); "+
			"gendurable needs read committed, the server's default: set default_transaction_isolation = 'read committed' "+
			"for the pool's connections (pgxpool.Config.ConnConfig.RuntimeParams) or for the role they connect as; "+
			"your own transactions may still ask for another level with BEGIN", iso)
	}
	return nil
}

// checkSearchPath warns about schemas on the search_path that other roles can create objects
// in: a function or operator created there can take the place of a built-in that gendurable's
// statements call (CVE-2018-1058). The check is advice: if it cannot run, Start goes on.
func (c *Client) checkSearchPath(ctx context.Context) {
	log := c.eng.Config().Logger
	schemas, err := c.store.UnsafeSearchPath(ctx, c.pool)
	if err != nil {
		log.Debug("gendurable: could not check the search_path", "client", c.eng.Config().Name, "error", err)
		return
	}
	if len(schemas) > 0 {
		log.Warn("gendurable: the search_path holds schemas that other roles can create objects in; "+
			"a function or operator created there can replace a built-in in gendurable's statements (CVE-2018-1058): "+
			"set the runtime role's search_path to '' (see the operations guide, Roles and grants)",
			"client", c.eng.Config().Name, "schemas", schemas)
	}
}

// Stop drains the client: schedulers stop claiming, prefetched rows no step has begun
// (QueueConfig.Prefetch) are handed back at once, running steps have until ctx is done to
// finish (their outcomes commit); then the rest are cancelled (their context's cause is
// ErrClientStopped) and their claims handed back at once for other workers. A step that ignores
// its context keeps its goroutine until it returns; its late outcome is dropped.
func (c *Client) Stop(ctx context.Context) error {
	return c.eng.Stop(ctx)
}

// InsertOpts are per-insert options. Every field is optional.
type InsertOpts struct {
	// Queue overrides the machine's queue.
	Queue string
	// Priority is 1 (most urgent) to 9; 0 means 5. Lower runs first.
	Priority int
	// ScheduledAt makes the instance runnable only from this time on (microsecond precision,
	// within Postgres's range: 4714 BC to 294276 AD).
	ScheduledAt time.Time
	// In makes the instance runnable only after this delay (measured by the database clock).
	// It cannot be combined with ScheduledAt.
	In time.Duration
	// MaxAttempts overrides the machine's MaxAttempts for this instance (at most 2^31 - 1).
	MaxAttempts int
	// CorrelationKey is a business key (an order id, say) that addresses the instance and
	// deduplicates inserts: while an instance of the same machine with this key is live, an
	// insert returns that instance's id with Duplicate set instead of creating another. Up to
	// 512 characters.
	CorrelationKey string
	// ConcurrencyKey runs the instance's steps under a concurrency key: never while another
	// execution of the key runs (K = 1), or, when the part before its first ':' names a gate in
	// Config.ConcurrencyLimits, only while the gate has a free slot. Up to 512 characters.
	ConcurrencyKey string
	// RateLimit runs the instance's first step under a token bucket: a limit's name in
	// Config.RateLimits, or "name:partition" for a bucket per tenant. Weight is the tokens the
	// step takes (default 1, at most 2^31 - 1; keep it at or below the limit's Burst).
	RateLimit string
	Weight    int
	// FairnessKey schedules the instance's steps fairly against the other keys of its queue (a
	// tenant, say): while several keys have runnable instances, each gets picks in proportion to
	// its weight (Config.FairnessWeights), so one key's burst does not hold up the others. Up to
	// 512 characters. See docs/fairness.md.
	FairnessKey string
	// CorrelationScope adds finished statuses (StatusDone, StatusFailed, StatusCancelled) to the
	// deduplication scope, so that an insert also returns a finished instance with that key.
	// The live statuses are always in scope.
	CorrelationScope []Status
}

// InsertResult is the instance an insert created or found.
type InsertResult struct {
	// ID is the instance's id.
	ID int64
	// Duplicate says that an instance with the same correlation key already existed in scope
	// and nothing was inserted: ID is that instance's.
	Duplicate bool
}

// InsertManyParams is one row of InsertMany.
type InsertManyParams struct {
	Input Input
	Opts  *InsertOpts
}

// Insert inserts one instance. If this client is running and works the instance's queue with a
// free slot, and the instance has no correlation key, concurrency key or rate limit and is due
// now, it is inserted already claimed by this client (unless a due instance of its queue is ahead
// of it) and its first step starts as Insert returns, without a pick and without a poke.
// Otherwise, once it is committed, Insert pokes its queue (Config.Poke) so that a scheduler picks
// it at once; an instance scheduled for later wakes nobody.
func (c *Client) Insert(ctx context.Context, in Input, opts *InsertOpts) (InsertResult, error) {
	var row store.InsertRow
	if err := c.row(&InsertManyParams{Input: in, Opts: opts}, -1, &row); err != nil {
		return InsertResult{}, err
	}
	if row.Runnable() {
		if owner, ok := c.eng.ReserveInsert(row.Queue, row.Machine); ok {
			return c.insertClaimed(ctx, &row, owner)
		}
	}
	res, err := c.insertRows(ctx, c.pool, []store.InsertRow{row})
	if err != nil {
		return InsertResult{}, err
	}
	return res[0], nil
}

// insertClaimed inserts a row this client runs at once if nothing of its queue is due ahead of it
// (its executor slot is reserved for owner): the step starts without waiting for a pick.
func (c *Client) insertClaimed(ctx context.Context, row *store.InsertRow, owner string) (InsertResult, error) {
	began := time.Now()
	id, claimed, err := c.store.InsertClaim(ctx, c.pool, row, owner, c.eng.Lease())
	c.eng.RunInserted(row.Queue, claimed, time.Since(began))
	if err != nil {
		return InsertResult{}, fmt.Errorf("gendurable: insert 1 rows: %w", err)
	}
	if claimed == nil {
		c.eng.Poke(row.Queue)
	}
	return InsertResult{ID: id}, nil
}

// InsertTx inserts one instance inside the caller's transaction: workers see it only once tx
// commits, and never if it rolls back. With PokePostgres its poke rides tx and leaves with the
// commit (unless the server's NOTIFY queue is half full or more: a full one fails every commit
// that notified); with the other transports, or without the poke, no other node is poked (their
// poll finds the row), and this client, if it works the queue, watches for the commit and starts
// the instance once it sees it (see docs/operations.md).
func (c *Client) InsertTx(ctx context.Context, tx pgx.Tx, in Input, opts *InsertOpts) (InsertResult, error) {
	res, err := c.insert(ctx, tx, []InsertManyParams{{Input: in, Opts: opts}})
	if err != nil {
		return InsertResult{}, err
	}
	return res[0], nil
}

// InsertMany inserts many instances in one statement (no parameter-count ceiling) and returns
// their results in input order. Rows are inserted in correlation-key order, so ids follow key
// order, and batches racing over the same keys cannot deadlock. (A keyed row whose key was taken
// by an instance that finished while the statement ran is inserted by a second statement, so its
// id comes after the others'.) If any row is invalid, nothing
// is inserted and the *InputError names the row.
func (c *Client) InsertMany(ctx context.Context, params []InsertManyParams) ([]InsertResult, error) {
	return c.insert(ctx, c.pool, params)
}

// InsertManyTx is InsertMany inside the caller's transaction.
func (c *Client) InsertManyTx(ctx context.Context, tx pgx.Tx, params []InsertManyParams) ([]InsertResult, error) {
	return c.insert(ctx, tx, params)
}

func (c *Client) insert(ctx context.Context, db store.DB, params []InsertManyParams) ([]InsertResult, error) {
	if len(params) == 0 {
		return nil, nil
	}
	rows := make([]store.InsertRow, len(params))
	index := -1
	if len(params) > 1 {
		index = 0
	}
	for i := range params {
		if index >= 0 {
			index = i
		}
		if err := c.row(&params[i], index, &rows[i]); err != nil {
			return nil, err
		}
	}
	return c.insertRows(ctx, db, rows)
}

// insertRows inserts validated rows and pokes the queues of those due now.
func (c *Client) insertRows(ctx context.Context, db store.DB, rows []store.InsertRow) ([]InsertResult, error) {
	for i := range rows {
		if rows[i].FairKey != "" {
			rows[i].FairWeight = c.eng.FairWeight(rows[i].FairKey)
		}
	}
	ins, err := c.store.InsertMany(ctx, db, rows)
	if err != nil {
		return nil, fmt.Errorf("gendurable: insert %d rows: %w", len(rows), err)
	}
	out := make([]InsertResult, len(ins))
	due := map[string]int64{} // queue → one of its new due rows
	for i, r := range ins {
		out[i] = InsertResult{ID: r.ID, Duplicate: r.Duplicate}
		if !r.Duplicate && rows[i].ScheduledAt == nil && rows[i].Delay == 0 {
			due[rows[i].Queue] = r.ID
		}
	}
	queues := make([]string, 0, len(due))
	for q := range due {
		queues = append(queues, q)
	}
	if tx, ok := db.(pgx.Tx); ok {
		// Nothing may wake a node before the rows are visible: the transport sends with the
		// commit if it can; otherwise this node looks for one row of each queue (the rows of a
		// transaction become visible together) and starts them once it sees it, and the other
		// nodes' poll finds them.
		sent, err := c.eng.PokeTx(ctx, tx, queues)
		if err != nil {
			return nil, err
		}
		if !sent {
			ids := make([]int64, len(queues))
			for i, q := range queues {
				ids[i] = due[q]
			}
			c.eng.WatchCommit(ids, queues)
		}
	} else {
		c.eng.Poke(queues...)
	}
	return out, nil
}

// row validates one insert and builds its statement row.
func (c *Client) row(p *InsertManyParams, index int, r *store.InsertRow) error {
	return buildRow(p.Input, p.Opts, index, c.maxPayload, c.eng.Machine, r)
}

// buildRow validates one new instance (an insert, or a spawned child) and builds its statement
// row. machine looks up the registered machines, to check the start step of one this node knows.
func buildRow(input Input, opts *InsertOpts, index, maxPayload int, machine func(string) *engine.MachineDef, r *store.InsertRow) error {
	in := &input
	if opts == nil {
		opts = &InsertOpts{}
	}
	bad := func(field, format string, args ...any) error {
		return &InputError{Index: index, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if in.err != nil {
		return &InputError{Index: index, Field: "Input", Reason: in.err.Error(), Err: in.err}
	}
	if in.machine == "" && in.step == "" {
		return bad("Input", "the zero Input: build one with FSM.With or Job.With")
	}
	if err := checkName("machine name", in.machine); err != nil {
		return bad("Input", "%v", err)
	}
	if def := machine(in.machine); def != nil && !def.Steps[in.step] {
		return &InputError{Index: index, Field: "Input", Err: ErrUnknownStep,
			Reason: fmt.Sprintf("the registered machine %q has no step %q", in.machine, in.step)}
	}
	state, err := jsonx.Encode(in.state, maxPayload)
	if err != nil {
		return &InputError{Index: index, Field: "state", Reason: err.Error(), Err: err}
	}
	queue := orDefault(opts.Queue, orDefault(in.queue, DefaultQueue))
	if err := checkName("queue name", queue); err != nil {
		return bad("Queue", "%v", err)
	}
	prio := opts.Priority
	if prio == 0 {
		prio = 5
	}
	if prio < 1 || prio > 9 {
		return bad("Priority", "%d: must be 1 (most urgent) to 9, or 0 for the default 5", opts.Priority)
	}
	maxAtt := orDefault(opts.MaxAttempts, orDefault(in.maxAttempts, DefaultMaxAttempts))
	if maxAtt < 1 || maxAtt > maxCount {
		return bad("MaxAttempts", "%d: must be 1 to %d", opts.MaxAttempts, maxCount)
	}
	if opts.In < 0 {
		return bad("In", "%v: negative delay", opts.In)
	}
	if opts.In != 0 && !opts.ScheduledAt.IsZero() {
		return bad("In", "set In or ScheduledAt, not both")
	}
	if err := checkTimestamp(opts.ScheduledAt); err != nil {
		return bad("ScheduledAt", "%v", err)
	}
	key := opts.CorrelationKey
	if key != "" {
		if err := checkKey(key); err != nil {
			return bad("CorrelationKey", "%v", err)
		}
	}
	var mask int16
	for _, s := range opts.CorrelationScope {
		switch s {
		case StatusAvailable, StatusExecuting, StatusAwaiting, StatusJoining:
		case StatusDone:
			mask |= 1
		case StatusFailed:
			mask |= 2
		case StatusCancelled:
			mask |= 4
		default:
			return bad("CorrelationScope", "%q is not a status", s)
		}
	}
	if len(opts.CorrelationScope) > 0 && key == "" {
		return bad("CorrelationScope", "set without a CorrelationKey")
	}
	if opts.ConcurrencyKey != "" {
		if err := checkKey(opts.ConcurrencyKey); err != nil {
			return bad("ConcurrencyKey", "%v", err)
		}
	}
	if opts.RateLimit != "" {
		if err := checkKey(opts.RateLimit); err != nil {
			return bad("RateLimit", "%v", err)
		}
	}
	if opts.Weight < 0 || opts.Weight > maxCount || (opts.Weight > 0 && opts.RateLimit == "") {
		return bad("Weight", "%d: a weight of 1 to %d, with a RateLimit", opts.Weight, maxCount)
	}
	if opts.FairnessKey != "" {
		if err := checkKey(opts.FairnessKey); err != nil {
			return bad("FairnessKey", "%v", err)
		}
	}
	*r = store.InsertRow{
		Machine: in.machine, Step: in.step, State: string(state), Queue: queue, Priority: prio,
		Delay: opts.In, MaxAttempts: maxAtt, CorrelationKey: key, ScopeMask: mask, ConcurrencyKey: opts.ConcurrencyKey,
		RateLimit: opts.RateLimit, Weight: max(opts.Weight, 1), MachineVersion: in.version,
		FairKey: opts.FairnessKey,
	}
	if !opts.ScheduledAt.IsZero() {
		t := opts.ScheduledAt
		r.ScheduledAt = &t
	}
	return nil
}

// checkTimestamp accepts the zero time (unset) and the times Postgres's timestamptz stores: from
// 4714-11-24 BC (Julian day 0) up to, not including, 294277-01-01. pgx would wrap a time far
// outside that into another date without a word.
func checkTimestamp(t time.Time) error {
	first := time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	end := time.Date(294277, time.January, 1, 0, 0, 0, 0, time.UTC)
	if !t.IsZero() && (t.Before(first) || !t.Before(end)) {
		return fmt.Errorf("%v: outside the range Postgres stores (4714 BC to 294276 AD)", t)
	}
	return nil
}

// Get reads an instance by id; ErrNotFound if there is none.
func (c *Client) Get(ctx context.Context, id int64) (*Instance, error) {
	in, err := c.store.GetInstance(ctx, c.pool, id)
	if err != nil {
		return nil, fmt.Errorf("gendurable: get %d: %w", id, err)
	}
	return in, nil
}

// MigrateOpts configures Migrate.
type MigrateOpts struct {
	// Schema to create or migrate; default "gendurable".
	Schema string
	// Target is the schema version to migrate to, up or down. 0 creates a schema at the newest
	// version this library knows (durablemigrate.Version) and brings an existing one to the
	// oldest this library runs against (durablemigrate.Required) if it is older: the contract
	// migrations after that remove what earlier libraries read, and run only when asked for by
	// their version, once every node runs this library (durablemigrate.DefaultTarget;
	// docs/upgrading.md).
	Target int
}

// Migrate creates gendurable's schema, or brings an existing one to the target version, one
// numbered migration per transaction. It is idempotent and safe to run from many processes at
// once. A schema already newer than this library knows is left as it is (a fleet migrated ahead
// of its deploy): Start says whether this library can run against it.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	var o MigrateOpts
	if opts != nil {
		o = *opts
	}
	if o.Target == 0 {
		return durablemigrate.Migrate(ctx, pool, o.Schema)
	}
	return durablemigrate.MigrateTo(ctx, pool, o.Schema, o.Target)
}
