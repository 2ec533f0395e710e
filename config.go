package gendurable

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/ident"
	"github.com/gendurable/gendurable/internal/store"
)

// Config configures a Client. The zero value of every field means its documented default.
// NewClient validates it in one place; an invalid field is a *ConfigError naming it, returned
// before anything runs or touches the database.
type Config struct {
	// Name tells clients in one process apart (in worker ids, logs and events). Default
	// "default". 1 to 64 bytes of printable UTF-8 without ':', '@' or '#'.
	Name string
	// Schema is the Postgres schema holding gendurable's tables. Default "gendurable". A plain
	// lower-case identifier (a-z, 0-9, _; not starting with pg_).
	Schema string
	// Machines are the FSMs and Jobs this client can run. Rows of other machines in its queues
	// are handed back untouched for a node that knows them (event fsm.unknown).
	Machines []Machine
	// Queues are the queues this client works, by name. Empty: this node runs no workers (it can
	// still insert).
	Queues map[string]QueueConfig
	// Lease is how long a claim lasts without a heartbeat before the reaper may give the row to
	// another worker. Default 30s; at least 100ms.
	Lease time.Duration
	// Heartbeat is how often the client extends the leases it holds (one statement for all of
	// them). Default Lease/6; at most Lease/3.
	Heartbeat time.Duration
	// PollInterval is the longest an idle queue waits before looking for work again: the floor
	// of discovery latency for rows made due by time (scheduled, backoff) or by other nodes.
	// Default 1s. Queues can override it.
	PollInterval time.Duration
	// Reaper configures the sweep that releases expired claims, fires await deadlines and, after
	// the database's clock steps back, re-dates the rows written ahead of it. Nil: enabled with
	// defaults.
	Reaper *ReaperConfig
	// GC configures the sweep that deletes finished instances past their retention, prunes idle
	// rate-limit buckets and reconciles gate counters. Nil: enabled with defaults.
	GC *GCConfig
	// MaxPayloadBytes caps an encoded state, result or argument document. Default 1 MiB.
	MaxPayloadBytes int
	// MaxChildren caps the children one Spawn may start. Default 100,000.
	MaxChildren int
	// ConcurrencyLimits are the concurrency gates, by name. A concurrency key whose part before
	// its first ':' is a gate's name ("stripe", or "stripe:acme" for one semaphore per tenant) is
	// a semaphore of that gate's Limit executions across every node; any other key is mutual
	// exclusion (K = 1). Every node must configure the same gates.
	ConcurrencyLimits map[string]ConcurrencyLimit
	// RateLimits are the token buckets steps can opt into, by name (RateLimit option of Next,
	// InsertOpts.RateLimit). A key "name" or "name:partition" (a bucket per tenant) is limited by
	// the configuration named by its part before the first ':'. Every node must configure the
	// same limits; a step naming a limit this node does not configure stalls here.
	RateLimits map[string]Rate
	// FairnessWeights are the fairness keys' weights (InsertOpts.FairnessKey, the FairnessKey
	// option of Next): while several keys of a queue and priority have runnable instances, each
	// gets a share of the picks in proportion to its weight, and a key alone gets them all. A key
	// not named here, and the instances without a key (which share as one key), weigh
	// FairnessDefaultWeight (default 1). Weights are between 0.01 and 10,000. A row takes its
	// place in the fair order from the client that inserts it or moves it on, so every client
	// should configure the same weights (docs/fairness.md).
	FairnessWeights       map[string]float64
	FairnessDefaultWeight float64
	// Logger receives the engine's logs. Default slog.Default().
	Logger *slog.Logger
	// Hooks receive every event, on a goroutine of their own: a slow hook never blocks the
	// engine (past a large buffer, events are dropped and the drop is logged).
	Hooks []func(Event)
	// Poke is how inserts and engine-driven wakes reach the schedulers of other nodes: nil or
	// PokeLocal() (this client only), PokePostgres() (LISTEN/NOTIFY), or another module's
	// transport (Redis: contrib/redispoke). See the operations guide.
	Poke PokeTransport
	// Service names the service this client belongs to: the schedules its Config declares are
	// that service's. At Start, the service's schedules that Schedules no longer declares are
	// removed; other services' schedules, and those set at run time, are never touched. Empty:
	// Start removes nothing. Same rules as Name.
	Service string
	// Schedules are written at Start (created, or updated where they changed). Their machines
	// must be in Machines. A schedule another service declared first stays as that service
	// declares it. See Schedule and docs/schedules.md.
	Schedules []Schedule
	// Codec, when set, seals states, results, signal payloads, schedules' inputs and the error
	// texts steps return before they reach Postgres, and opens them after a read (NewAESGCM is
	// a ready one). Every client of a schema that reads or writes them needs it, with every key
	// still in use. Nil: stored as plain JSON. See docs/encryption.md.
	Codec Codec
	// AwaitTick is how often the await watcher reads, in one statement, the settled instances
	// that callers of Await on this client wait for: the latency of an answer settled on another
	// node. Default 25ms.
	AwaitTick time.Duration
}

// QueueConfig configures one queue's workers on a client.
type QueueConfig struct {
	// Concurrency is how many steps of the queue run at once on this client. Default 10; at
	// most 10,000.
	Concurrency int
	// PollInterval overrides Config.PollInterval for this queue.
	PollInterval time.Duration
	// Prefetch is how many rows a pick may claim beyond the free executors: they wait in this
	// client, their leases kept by its heartbeat, and start as executors free up. Each pick then
	// claims more rows for one round trip, so a backlog of short steps goes faster at the same
	// Concurrency; a prefetched row is executing for the database (it holds its gate slot and
	// concurrency key, and no other node runs it) while it waits here. Rows whose queue or
	// machine is paused while they wait are handed back unrun, and so is a row whose instance
	// is paused once the heartbeat has seen it. Default 0; at most 10,000. For queues of short
	// steps only: behind long steps a prefetched row waits for as long.
	Prefetch int
}

// Rate is a token bucket: Allowed tokens every Period, refilled continuously, holding at most
// Burst (default Allowed).
type Rate struct {
	Allowed int
	Period  time.Duration
	Burst   int
}

// ConcurrencyLimit is one gate: how many executions of one of its keys may run at once, and over
// how many counter rows (shards) its slots are spread. Completions of one key serialize on their
// shard's row; size Shards ≥ Limit × commit latency / step duration (default 1; at most Limit).
type ConcurrencyLimit struct {
	Limit  int
	Shards int
}

// ReaperConfig configures the reaper. At least one node of a cluster must run it (duplicates are
// safe: sweeps skip each other's rows).
type ReaperConfig struct {
	// Disabled turns the reaper off on this node.
	Disabled bool
	// Interval is the time between sweeps. Default 5s.
	Interval time.Duration
	// MaxRecoveries is how many claims of one step an instance may lose before the next such
	// loss fails it: to crashed or stalled workers (a lease that ran out, released by a reaper or
	// by the worker's own restart), to the lost session of the step's transaction (Ctx.Tx), or
	// to an inbox or join the worker could not read. A lost claim costs no attempt: MaxAttempts
	// bounds only the tries whose step returned. Progress to another step starts the count again.
	// Default 100; 1 to 2^31 − 1. Every node that releases claims (its reaper, its startup
	// reclaim, its steps) applies its own value: give them the same.
	MaxRecoveries int
}

// GCConfig configures GC. At least one node of a cluster must run it (duplicates are safe:
// sweeps skip each other's rows).
type GCConfig struct {
	// Disabled turns GC off on this node.
	Disabled bool
	// Interval is the time between sweeps. Default 1m; at least 1ms.
	Interval time.Duration
	// Retention is how long a finished instance (done, failed, cancelled) is kept after it
	// finished: Get and deduplication scopes that include finished instances see it until
	// then. Default 24h (or Lease, if longer); at least Lease.
	Retention time.Duration
	// Batch is how many instances one delete statement removes. Default 1,000; 1 to 10,000.
	Batch int
}

// Defaults.
const (
	DefaultLease           = 30 * time.Second
	DefaultPollInterval    = time.Second
	DefaultReaperInterval  = 5 * time.Second
	DefaultMaxRecoveries   = 100
	DefaultGCInterval      = time.Minute
	DefaultGCRetention     = 24 * time.Hour
	DefaultGCBatch         = 1000
	DefaultConcurrency     = 10
	DefaultMaxPayloadBytes = 1 << 20
	DefaultMaxChildren     = 100_000
	DefaultAwaitTick       = 25 * time.Millisecond
	defaultCommitters      = 2
	defaultMaxCommitBatch  = 1000
	maxGCBatch             = 10_000
	// maxCount bounds the counts stored in 32-bit columns (limits, attempts).
	maxCount = math.MaxInt32
)

func cfgErr(field, format string, args ...any) error {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// resolve validates c and returns the engine configuration with every default filled in.
func (c *Config) resolve() (engine.Config, string, error) {
	var ec engine.Config
	if c == nil {
		c = &Config{}
	}
	ec.Name = orDefault(c.Name, "default")
	if len(ec.Name) > 64 || strings.ContainsAny(ec.Name, ":@#") || !printable(ec.Name) {
		return ec, "", cfgErr("Name", "%q: use 1 to 64 bytes of printable characters without ':', '@' or '#'", c.Name)
	}
	schema, err := ident.Schema(c.Schema)
	if err != nil {
		return ec, "", &ConfigError{Field: "Schema", Reason: err.Error(), Err: ErrInvalidIdentifier}
	}

	ec.Lease = c.Lease
	if ec.Lease == 0 {
		ec.Lease = DefaultLease
	}
	if ec.Lease < 100*time.Millisecond {
		return ec, "", cfgErr("Lease", "%v: must be at least 100ms", c.Lease)
	}
	ec.Heartbeat = c.Heartbeat
	if ec.Heartbeat == 0 {
		ec.Heartbeat = ec.Lease / 6
	}
	if ec.Heartbeat < 0 || ec.Heartbeat > ec.Lease/3 {
		return ec, "", cfgErr("Heartbeat", "%v: must be positive and at most Lease/3 (%v), so a lease survives a missed beat", c.Heartbeat, ec.Lease/3)
	}
	poll := c.PollInterval
	if poll == 0 {
		poll = DefaultPollInterval
	}
	if poll < time.Millisecond {
		return ec, "", cfgErr("PollInterval", "%v: must be at least 1ms", c.PollInterval)
	}
	if c.Reaper != nil && c.Reaper.Interval != 0 && c.Reaper.Interval < time.Millisecond {
		return ec, "", cfgErr("Reaper.Interval", "%v: must be at least 1ms (0 means %v)", c.Reaper.Interval, DefaultReaperInterval)
	}
	ec.MaxRecoveries = DefaultMaxRecoveries
	if c.Reaper != nil && c.Reaper.MaxRecoveries != 0 {
		if c.Reaper.MaxRecoveries < 0 || c.Reaper.MaxRecoveries > maxCount {
			return ec, "", cfgErr("Reaper.MaxRecoveries", "%d: must be between 1 and %d (0 means %d)", c.Reaper.MaxRecoveries,
				maxCount, DefaultMaxRecoveries)
		}
		ec.MaxRecoveries = c.Reaper.MaxRecoveries
	}
	if c.Reaper == nil || !c.Reaper.Disabled {
		ec.ReaperInterval = DefaultReaperInterval
		if c.Reaper != nil && c.Reaper.Interval != 0 {
			ec.ReaperInterval = c.Reaper.Interval
		}
	}
	if err := c.resolveGC(&ec); err != nil {
		return ec, "", err
	}
	ec.MaxPayload = c.MaxPayloadBytes
	if ec.MaxPayload == 0 {
		ec.MaxPayload = DefaultMaxPayloadBytes
	}
	if ec.MaxPayload < 0 {
		return ec, "", cfgErr("MaxPayloadBytes", "%d: must be positive", c.MaxPayloadBytes)
	}

	ec.MaxChildren = c.MaxChildren
	if ec.MaxChildren == 0 {
		ec.MaxChildren = DefaultMaxChildren
	}
	if ec.MaxChildren < 0 {
		return ec, "", cfgErr("MaxChildren", "%d: must be positive", c.MaxChildren)
	}

	if len(c.ConcurrencyLimits) > 0 {
		g := &store.Gates{}
		for _, name := range slices.Sorted(maps.Keys(c.ConcurrencyLimits)) {
			l := c.ConcurrencyLimits[name]
			field := "ConcurrencyLimits[" + name + "]"
			if err := checkLimitName("gate", field, name); err != nil {
				return ec, "", err
			}
			if l.Limit < 1 || l.Limit > maxCount {
				return ec, "", cfgErr(field+".Limit", "%d: must be between 1 and %d", l.Limit, maxCount)
			}
			shards := l.Shards
			if shards == 0 {
				shards = 1
			}
			if shards < 1 || shards > l.Limit || shards > 1000 {
				return ec, "", cfgErr(field+".Shards", "%d: must be between 1 and min(Limit, 1000)", l.Shards)
			}
			g.Names = append(g.Names, name)
			g.Limits = append(g.Limits, int32(l.Limit))
			g.Shards = append(g.Shards, int32(shards))
		}
		ec.Gates = g
	}

	if len(c.RateLimits) > 0 {
		r := &store.Rates{}
		for _, name := range slices.Sorted(maps.Keys(c.RateLimits)) {
			l := c.RateLimits[name]
			field := "RateLimits[" + name + "]"
			if err := checkLimitName("rate limit", field, name); err != nil {
				return ec, "", err
			}
			if l.Allowed < 1 {
				return ec, "", cfgErr(field+".Allowed", "%d: must be at least 1", l.Allowed)
			}
			if l.Period < time.Millisecond {
				return ec, "", cfgErr(field+".Period", "%v: must be at least 1ms", l.Period)
			}
			burst := l.Burst
			if burst == 0 {
				burst = l.Allowed
			}
			if burst < 1 {
				return ec, "", cfgErr(field+".Burst", "%d: must be at least 1 (0 means Allowed)", l.Burst)
			}
			r.Names = append(r.Names, name)
			r.Rates = append(r.Rates, float64(l.Allowed)/l.Period.Seconds())
			r.Bursts = append(r.Bursts, float64(burst))
		}
		ec.Rates = r
	}

	fair, err := c.fairWeights()
	if err != nil {
		return ec, "", err
	}
	ec.Fair = fair

	ec.Queues = make(map[string]engine.QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		field := "Queues[" + name + "]"
		if err := checkName("queue name", name); err != nil {
			return ec, "", &ConfigError{Field: field, Reason: err.Error()}
		}
		conc := q.Concurrency
		if conc == 0 {
			conc = DefaultConcurrency
		}
		if conc < 0 || conc > 10000 {
			return ec, "", cfgErr(field+".Concurrency", "%d: must be between 1 and 10000", q.Concurrency)
		}
		qp := q.PollInterval
		if qp == 0 {
			qp = poll
		}
		if qp < time.Millisecond {
			return ec, "", cfgErr(field+".PollInterval", "%v: must be at least 1ms", q.PollInterval)
		}
		if q.Prefetch < 0 || q.Prefetch > 10000 {
			return ec, "", cfgErr(field+".Prefetch", "%d: must be between 0 and 10000", q.Prefetch)
		}
		ec.Queues[name] = engine.QueueConfig{Concurrency: conc, PollInterval: qp, Prefetch: q.Prefetch}
	}

	ec.Machines = make(map[string]*engine.MachineDef, len(c.Machines))
	for i, m := range c.Machines {
		field := fmt.Sprintf("Machines[%d]", i)
		if m == nil {
			return ec, "", cfgErr(field, "nil machine")
		}
		def, err := m.def()
		if err != nil {
			return ec, "", &ConfigError{Field: field, Reason: err.Error()}
		}
		if _, dup := ec.Machines[def.Name]; dup {
			return ec, "", cfgErr(field, "a machine named %q is already registered", def.Name)
		}
		ec.Machines[def.Name] = def
	}

	ec.Logger = c.Logger
	if ec.Logger == nil {
		ec.Logger = slog.Default()
	}
	for i, h := range c.Hooks {
		if h == nil {
			return ec, "", cfgErr(fmt.Sprintf("Hooks[%d]", i), "nil hook")
		}
	}
	ec.Hooks = c.Hooks
	ec.AwaitTick = c.AwaitTick
	if ec.AwaitTick == 0 {
		ec.AwaitTick = DefaultAwaitTick
	}
	if ec.AwaitTick < time.Millisecond {
		return ec, "", cfgErr("AwaitTick", "%v: must be at least 1ms", c.AwaitTick)
	}
	ec.Committers = defaultCommitters
	ec.MaxCommitBatch = defaultMaxCommitBatch
	return ec, schema, nil
}

// resolveGC validates the GC options (also on a node that disables GC: an invalid value is a
// mistake either way) and fills ec's GC fields; GCInterval stays 0 when GC is disabled.
func (c *Config) resolveGC(ec *engine.Config) error {
	g := c.GC
	if g == nil {
		g = &GCConfig{}
	}
	interval := g.Interval
	if interval == 0 {
		interval = DefaultGCInterval
	}
	if interval < time.Millisecond {
		return cfgErr("GC.Interval", "%v: must be at least 1ms (0 means %v)", g.Interval, DefaultGCInterval)
	}
	retention := g.Retention
	if retention == 0 {
		retention = max(DefaultGCRetention, ec.Lease)
	}
	if retention < ec.Lease {
		// A floor, not a tuning: a finished instance kept for less than a lease could vanish
		// before a caller polling for its result reads it, and such a value is most likely a
		// unit mistake.
		return cfgErr("GC.Retention", "%v: must be at least Lease (%v) (0 means %v)", g.Retention, ec.Lease, DefaultGCRetention)
	}
	batch := g.Batch
	if batch == 0 {
		batch = DefaultGCBatch
	}
	if batch < 1 || batch > maxGCBatch {
		return cfgErr("GC.Batch", "%d: must be between 1 and %d (0 means %d)", g.Batch, maxGCBatch, DefaultGCBatch)
	}
	if !g.Disabled {
		ec.GCInterval, ec.GCRetention, ec.GCBatch = interval, retention, batch
	}
	return nil
}

// checkLimitName validates the name of a gate or rate limit: a durable name without ':' (the
// separator of a key's partition).
func checkLimitName(what, field, name string) error {
	if err := checkName(what+" name", name); err != nil || strings.Contains(name, ":") {
		return cfgErr(field, "%q: a %s name is 1 to 128 bytes of printable characters without ':'", name, what)
	}
	return nil
}

// checkName validates a durable name (machine, step, queue): 1 to 128 bytes of printable UTF-8.
func checkName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(s) > 128 {
		return fmt.Errorf("%s %.20q… is %d bytes long; the limit is 128", what, s, len(s))
	}
	if !printable(s) {
		return fmt.Errorf("%s %q: use printable UTF-8 characters only", what, s)
	}
	return nil
}

func printable(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Fairness weights are kept within a range where a tag's increments (1/weight) stay distinct in a
// float64 up to tags of about 10^12 (a priority that never runs dry of tagged rows adds about
// 1/weight per row; docs/fairness.md).
const minFairWeight, maxFairWeight = 0.01, 10_000

// fairWeights checks and returns the fairness weights.
func (c *Config) fairWeights() (*store.FairWeights, error) {
	okWeight := func(w float64) bool {
		return !math.IsNaN(w) && w >= minFairWeight && w <= maxFairWeight
	}
	def := c.FairnessDefaultWeight
	if def != 0 && !okWeight(def) {
		return nil, cfgErr("FairnessDefaultWeight", "%v: must be between %v and %v (0 means 1)", def, minFairWeight, maxFairWeight)
	}
	for _, key := range slices.Sorted(maps.Keys(c.FairnessWeights)) {
		field := "FairnessWeights[" + key + "]"
		if err := checkKey(key); err != nil {
			return nil, cfgErr(field, "%v", err)
		}
		if w := c.FairnessWeights[key]; !okWeight(w) {
			return nil, cfgErr(field, "%v: must be between %v and %v", w, minFairWeight, maxFairWeight)
		}
	}
	return store.NewFairWeights(c.FairnessWeights, def), nil
}
