package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/fault"
	"github.com/jackc/pgx/v5"
)

// OutcomeKind is how an outcome changes its row. Its value is the kind's name as the outcome
// statement (outcome.sql) and the events spell it.
type OutcomeKind string

// The outcome kinds.
const (
	// KindNext moves the instance to Step (its attempt count starts over).
	KindNext OutcomeKind = "next"
	// KindRetry runs the same step again after Delay (its attempt count goes on).
	KindRetry OutcomeKind = "retry"
	// KindDone finishes the instance with Result.
	KindDone OutcomeKind = "done"
	// KindFailed finishes the instance as failed, ErrMsg recorded.
	KindFailed OutcomeKind = "failed"
	// KindReleased hands the claim back untouched: attempt restored, due after Delay (a node
	// that cannot run the row, a shutdown's deadline). With ErrKind set it is a recovery (the
	// step's transaction lost its session, its inbox could not be read): the error is recorded
	// and the row's recoveries count one more (Recovery).
	KindReleased OutcomeKind = "released"
	// KindAwait parks the instance on AwaitNames; Step runs on the wake.
	KindAwait OutcomeKind = "await"
	// KindSpawn starts Children and parks the instance until they have all finished; Step (the
	// join) runs then, at once if there are none.
	KindSpawn OutcomeKind = "spawn"
	// KindUpgrade brings the row forward to Version of its machine, at Step with State, before
	// any step of it runs: the claim is handed back like released, due at once, and the upgrade
	// recorded on the row.
	KindUpgrade OutcomeKind = "upgrade"
)

// String names the kind as events report it.
func (k OutcomeKind) String() string { return string(k) }

// Terminal reports whether the kind finishes the instance.
func (k OutcomeKind) Terminal() bool { return k == KindDone || k == KindFailed }

// Progress reports whether the kind moves the instance on to a step it names (next, await,
// spawn): it consumes the awaited signals the step saw.
func (k OutcomeKind) Progress() bool { return k == KindNext || k == KindAwait || k == KindSpawn }

// KeyChange is what a Next does to the row's concurrency key; the zero value keeps it.
type KeyChange string

// The key changes.
const (
	KeyKeep    KeyChange = ""
	KeySet     KeyChange = "set"     // to Outcome.NewKey
	KeyRelease KeyChange = "release" // no key from the next step on
)

// GateSlot is the gate slot an execution holds: the shard of its key's gate its claim debited.
type GateSlot struct {
	Key   string
	Shard int16
}

// Outcome is one step's outcome, the one value that goes from the executor to the outcome
// statement. A machine's Run fills in what the step decided; Fence fills in the claim it applies
// to and what the claimed row held.
type Outcome struct {
	Kind OutcomeKind
	// Step is the step to run next (next, await, spawn).
	Step string
	// State is the new state, JSON; nil keeps the stored one.
	State []byte
	// Delay makes the row runnable only once it has passed (next, retry, released).
	Delay time.Duration
	// Result is the instance's result, JSON (done; nil for none).
	Result []byte
	// AwaitNames and AwaitTimeout (0: none) park the row (await).
	AwaitNames   []string
	AwaitTimeout time.Duration
	// Children are the instances a spawn starts.
	Children []InsertRow
	// Key changes the concurrency key (next): KeySet to NewKey, or KeyRelease.
	Key    KeyChange
	NewKey string
	// RateLimit ("" for none) and Weight are the rate limit the next step runs under (next).
	RateLimit string
	Weight    int
	// Version is the machine version an upgrade brings the row to (upgrade).
	Version int
	// FairSet makes FairKey the row's fairness key (next). FairWeight is the weight of the row's
	// key after the outcome (0 is 1): set by the caller when the row has a key.
	FairSet    bool
	FairKey    string
	FairWeight float64
	// ErrKind and ErrMsg, when ErrKind is not empty, are recorded in the row's error history.
	ErrKind string
	ErrMsg  string
	// Cause is the error (or, with Panic, the recovered panic) the machine's handler was given.
	// Events report it; the statement stores ErrMsg only.
	Cause error
	Panic bool

	// Claim is the claim the outcome applies to: the statement applies it only while the row
	// still holds exactly that claim (the fence).
	Claim Claim
	// Seen are the awaited signals the step saw; progress consumes them.
	Seen []int64
	// Signalled says the row had signals in its inbox when it was claimed: a terminal outcome
	// clears them.
	Signalled bool
	// Child says the row has a parent: its terminal outcome settles the parent's join.
	Child bool
	// Credit is the gate slot the execution held, which the outcome gives back (nil: none, or
	// the slot goes back to a gate lease instead).
	Credit *GateSlot
	// Queue, Priority and Fair are the row's queue, priority and fairness key ("" for none) as
	// claimed, for its place in the fair order.
	Queue    string
	Priority int
	Fair     string
}

// fairKey returns the row's fairness key after the outcome ("" for none).
func (o *Outcome) fairKey() string {
	if o.FairSet {
		return o.FairKey
	}
	return o.Fair
}

// fairNow reports whether the outcome makes the row runnable at once with a fairness key: it then
// gets a new place in its queue's fair order.
func (o *Outcome) fairNow() bool {
	if o.fairKey() == "" || o.Delay > 0 {
		return false
	}
	switch o.Kind {
	case KindNext, KindRetry, KindReleased, KindUpgrade:
		return true
	case KindSpawn:
		return len(o.Children) == 0
	}
	return false
}

// Fence makes o apply to c's claim, with what c's row held: its inbox, parent and gate slot,
// and its fairness key, which after the outcome weighs what fair gives it (nil: weight 1).
// The kind must be final: progress consumes the awaited signals the step saw (Ctx.Awaited).
func (o *Outcome) Fence(c *Claimed, fair *FairWeights) {
	o.Claim = Claim{ID: c.ID, Owner: c.Owner}
	o.Signalled, o.Child, o.Credit = c.Signalled, c.Child, c.Slot()
	o.Queue, o.Priority, o.Fair = c.Queue, c.Priority, ""
	if c.FairKey != nil {
		o.Fair = *c.FairKey
	}
	if k := o.fairKey(); k != "" {
		o.FairWeight = fair.Of(k)
	}
	o.Seen = nil
	if o.Kind.Progress() {
		for _, s := range c.Inbox {
			if slices.Contains(c.AwaitNames, s.Name) {
				o.Seen = append(o.Seen, s.ID)
			}
		}
	}
}

// FailInstead returns an outcome that fails the instance with the error recorded, on o's claim,
// in place of o (one the database refused).
func (o *Outcome) FailInstead(errKind, errMsg string, cause error) Outcome {
	return Outcome{Kind: KindFailed, ErrKind: errKind, ErrMsg: errMsg, Cause: cause,
		Claim: o.Claim, Signalled: o.Signalled, Child: o.Child, Credit: o.Credit}
}

// HandBack is the outcome that hands a claim back untouched, due again after delay, with its gate
// slot credited.
func HandBack(claim Claim, credit *GateSlot, delay time.Duration) Outcome {
	return Outcome{Kind: KindReleased, Delay: delay, Claim: claim, Credit: credit}
}

// Recovery is the outcome of c's claim lost for a reason that is not the step's (kind and err say
// which): handed back like HandBack, due after delay, with the error recorded and a recovery
// counted; or, once the step has had max recoveries (the reaper's limit), failed, so that a step
// that loses its claim every time cannot loop for ever. credit is the gate slot to credit back.
func Recovery(c *Claimed, credit *GateSlot, delay time.Duration, kind string, max int, err error) Outcome {
	if c.Recoveries < max {
		out := HandBack(Claim{ID: c.ID, Owner: c.Owner}, credit, delay)
		out.ErrKind, out.ErrMsg = kind, err.Error()
		return out
	}
	err = fmt.Errorf("%w; recovery %d of this step, past the limit of %d", err, c.Recoveries+1, max)
	out := Outcome{Kind: KindFailed, ErrKind: kind, ErrMsg: err.Error(), Cause: err}
	out.Fence(c, nil) // a failed row settles its parent's join and clears its inbox
	out.Credit = credit
	return out
}

// Woken is an instance an outcome batch made runnable (a park whose awaited signal had already
// arrived, a parent whose last child settled, a spawn with no children).
type Woken struct {
	ID    int64
	Queue string
}

// Claim names one claim: a row and the token it was claimed under.
type Claim struct {
	ID    int64
	Owner string
}

// ApplyOutcomes commits outcomes in one round trip and returns the set of claims that were
// applied (the others were stale: their claim is gone) and the instances it made runnable.
//
// The outcome statement is assembled for the batch: the signal-consuming, spawning and
// join-settling parts are included only when some outcome needs them, so the common batch is one
// plain UPDATE. After it, in the same implicit transaction, come the statements that need a fresh
// snapshot: clearing finished rows' inboxes, re-checking parked rows, recounting spawns. Applied
// on a pool or connection, or in an EndingTx (not in a caller's transaction that goes on after
// it), the batch runs under outcome_settings (outcomeSettings), sent first in the same round trip.
func (s *Store) ApplyOutcomes(ctx context.Context, db DB, outs []Outcome) (map[Claim]struct{}, []Woken, error) {
	applied, woken, _, err := s.ApplyOutcomesProbing(ctx, db, outs, ProbeReq{})
	return applied, woken, err
}

// EndingTx is a top-level transaction the caller commits as soon as an outcome batch applied in it
// returns (the engine's commit of a step's Ctx.Tx): the batch sets its settings in it as in a
// transaction of its own, the engine's statement timeout among them, since they end with it (the
// deferred constraint checks of the transaction's writes, run by its commit, run under them too).
// Without them a role's short statement_timeout cancelled a large spawn's outcome at every try, as
// it once did the committer's batches (TestSpawnInStepTxOutlastsTheRolesStatementTimeout). Never a
// savepoint: SET LOCAL outlives its release, into the rest of the enclosing transaction.
type EndingTx struct{ pgx.Tx }

// ProbeReq names rows a commit reads back for this node's Await callers (await_probe's ids and
// flags), so that they are answered without a read of their own.
type ProbeReq struct {
	IDs           []int64
	Parked, Whole []bool
}

// ApplyOutcomesProbing is ApplyOutcomes that also reads the rows of probe, with await_probe, last
// in the same implicit transaction (so as the outcomes left them) and in the same round trip.
// The probes are valid once the call returns without error: the transaction has committed. A
// chaos build that sends a park's statements one by one reads no probe.
func (s *Store) ApplyOutcomesProbing(ctx context.Context, db DB, outs []Outcome, probe ProbeReq) (map[Claim]struct{}, []Woken, []Probe, error) {
	n := len(outs)
	ids := make([]int64, n)
	owners := make([]string, n)
	kinds := make([]string, n)
	steps := make([]*string, n)
	states := make([]*string, n)
	delays := make([]int64, n)
	results := make([]*string, n)
	errKinds := make([]*string, n)
	errMsgs := make([]*string, n)
	awaitNames := make([]*string, n)
	awaitMs := make([]*int64, n)
	spawned := make([]int32, n)
	keyChanges := make([]string, n)
	keys := make([]*string, n)
	rateLimits := make([]*string, n)
	weights := make([]int32, n)
	crKeys := make([]*string, n)
	crShards := make([]*int16, n)
	versions := make([]int32, n)
	// The fair arrays, only for a batch with a fairness key to set or a fair tag to give (see
	// outcome_update_fair).
	var fairSets []bool
	var fairKeys []*string
	var fairRanks []*int32
	var fairWeights []float64
	var ranks fairRankings
	credits := false
	var seenInst, seenSig, purge, parked, spawners []int64
	var children childArrays
	settles := false
	isTerminal := make(map[int64]bool)
	for i := range outs {
		o := &outs[i]
		id := o.Claim.ID
		ids[i], owners[i], kinds[i] = id, o.Claim.Owner, string(o.Kind)
		if o.Kind.Progress() || o.Kind == KindUpgrade {
			steps[i] = &o.Step
		}
		if o.Kind == KindUpgrade {
			versions[i] = int32(o.Version)
		}
		st, err := s.sealDoc(o.State)
		if err != nil {
			return nil, nil, nil, err
		}
		states[i], delays[i] = jsonText(st), o.Delay.Milliseconds()
		if o.Kind == KindDone {
			res, err := s.sealDoc(o.Result)
			if err != nil {
				return nil, nil, nil, err
			}
			results[i] = jsonText(res)
		}
		if o.ErrKind != "" {
			msg := storableText(o.ErrMsg)
			if o.ErrKind != ErrKindCodec { // that one names keys, for readers who lack them
				if msg, err = s.seal(msg); err != nil {
					return nil, nil, nil, err
				}
			}
			errKinds[i], errMsgs[i] = &o.ErrKind, &msg
		}
		keyChanges[i] = string(o.Key)
		if o.Key == KeySet {
			keys[i] = &o.NewKey
		}
		weights[i] = 1
		if o.RateLimit != "" {
			rateLimits[i], weights[i] = &o.RateLimit, int32(max(o.Weight, 1))
		}
		if o.Credit != nil {
			crKeys[i], crShards[i], credits = &o.Credit.Key, &o.Credit.Shard, true
		}
		if now := o.fairNow(); now || o.FairSet {
			if fairSets == nil {
				fairSets, fairKeys, fairRanks = make([]bool, n), make([]*string, n), make([]*int32, n)
				fairWeights = make([]float64, n)
			}
			fairSets[i], fairWeights[i] = o.FairSet, 1
			if o.FairWeight > 0 {
				fairWeights[i] = o.FairWeight
			}
			if o.FairSet && o.FairKey != "" {
				fairKeys[i] = &o.FairKey
			}
			if now {
				fairRanks[i] = ranks.next(o.Queue, o.Priority, o.fairKey())
			}
		}
		switch o.Kind {
		case KindDone, KindFailed:
			isTerminal[id] = true
			if o.Signalled {
				purge = append(purge, id)
			}
			settles = settles || o.Child
		case KindAwait:
			parked = append(parked, id)
			names := strings.Join(o.AwaitNames, "\x1f")
			awaitNames[i] = &names
			if o.AwaitTimeout > 0 {
				ms := max(o.AwaitTimeout.Milliseconds(), 1)
				awaitMs[i] = &ms
			}
		case KindSpawn:
			spawned[i] = int32(len(o.Children))
			if len(o.Children) > 0 {
				spawners = append(spawners, id)
				if err := children.add(s, id, o.Children); err != nil {
					return nil, nil, nil, err
				}
			}
		}
		for _, sig := range o.Seen {
			seenInst = append(seenInst, id)
			seenSig = append(seenSig, sig)
		}
	}
	// An array whose every element is its default goes as NULL (see outcome.sql).
	args := pgx.NamedArgs{
		"ids": ids, "owners": owners, "kinds": kinds, "steps": unlessAll(steps, nil), "states": unlessAll(states, nil),
		"delays": unlessAll(delays, 0), "results": unlessAll(results, nil), "err_kinds": unlessAll(errKinds, nil),
		"err_msgs": unlessAll(errMsgs, nil), "await_names": unlessAll(awaitNames, nil), "await_ms": unlessAll(awaitMs, nil),
		"spawned": unlessAll(spawned, 0), "key_changes": unlessAll(keyChanges, ""), "ckeys": unlessAll(keys, nil),
		"rate_limits": unlessAll(rateLimits, nil), "weights": unlessAll(weights, 1), "cr_keys": unlessAll(crKeys, nil),
		"cr_shards": unlessAll(crShards, nil), "versions": unlessAll(versions, 0),
	}
	update := "outcome_update"
	if fairSets != nil {
		update = "outcome_update_fair"
		args["fair_sets"], args["fair_keys"], args["fair_ranks"], args["fair_weights"] = fairSets, fairKeys, fairRanks, fairWeights
	}
	var stmt string
	plain := len(seenSig) == 0 && len(spawners) == 0 && !settles && !credits
	if plain {
		stmt = s.frag(update) // the hot path: one plain UPDATE
	} else {
		var b strings.Builder
		b.WriteString("WITH upd AS (\n" + s.frag(update) + "\n)")
		if len(seenSig) > 0 {
			b.WriteString(",\nconsumed AS (\n" + s.frag("outcome_consume") + "\n)")
			args["seen_inst"], args["seen_sig"] = seenInst, seenSig
		}
		if len(spawners) > 0 {
			b.WriteString(",\nkids AS (\n" + s.frag("outcome_spawn") + "\n)")
			children.into(args)
		}
		if credits {
			b.WriteString(",\ncredited AS (\n" + s.frag("outcome_credit") + "\n)")
		}
		if settles {
			b.WriteString(",\nfinished AS (\n" + s.frag("outcome_finished") + "\n)")
			b.WriteString(",\nsettled AS (\n" + s.frag("outcome_settle") + "\n)")
		}
		b.WriteString("\n" + s.frag("outcome_applied"))
		if len(spawners) > 0 {
			// The children go in right after the outcomes, before any join is settled or gate
			// slot credited (see outcome_spawn).
			b.WriteString("\nUNION ALL " + s.frag("outcome_kids_first"))
		}
		if settles {
			b.WriteString("\nUNION ALL " + s.frag("outcome_woken"))
		}
		stmt = b.String()
	}

	applied := make(map[Claim]struct{}, n)
	var probes []Probe
	var woken []Woken
	var late []int64 // finished rows whose first signal arrived while their step ran
	scanOutcomes := func(rows pgx.Rows) error {
		var id int64
		var owner, queue *string
		var signalled *bool
		var kind *string
		var parentID *int64
		var wave *int32
		dest := []any{&id, &owner, &signalled, &kind, &queue}
		if plain {
			var crKey *string
			var crShard *int16
			dest = []any{&id, &owner, &signalled, &kind, &parentID, &wave, &crKey, &crShard}
		}
		_, err := pgx.ForEachRow(rows, dest, func() error {
			if owner == nil { // a parent the batch's children made runnable
				woken = append(woken, Woken{ID: id, Queue: *queue})
				return nil
			}
			applied[Claim{ID: id, Owner: *owner}] = struct{}{}
			if *signalled && isTerminal[id] && !slices.Contains(purge, id) {
				late = append(late, id)
			}
			return nil
		})
		return err
	}
	scanWoken := func(rows pgx.Rows) error {
		var w Woken
		_, err := pgx.ForEachRow(rows, []any{&w.ID, &w.Queue}, func() error {
			woken = append(woken, w)
			return nil
		})
		return err
	}
	if fault.Enabled {
		for _, k := range crKeys {
			if k == nil {
				continue
			}
			if err := fault.PointFor(fault.GateBeforeCredit, *k); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	// A batch of its own runs under its settings, sent first; so does one in a transaction that
	// commits right after it (EndingTx). A caller's transaction that goes on runs the statements
	// as they are (the settings would outlive them, to the caller's commit).
	settings := s.sql(outcomeSettings(plain))
	switch db.(type) {
	case EndingTx:
	case pgx.Tx:
		settings = ""
	}
	if fault.Enabled && len(parked) > 0 {
		// A chaos build sends the park's statements one by one in an explicit transaction, with
		// the await_between_stmts point between the park and the re-check. The transaction, the
		// statements and their order are those of the batch below (READ COMMITTED: each
		// statement takes its own snapshot; locks are held to the commit), so the protocol is
		// the same; only the window between them can be held open.
		if err := s.applyParkedStepwise(ctx, db, outs, parked, purge, spawners, settings, stmt, args, scanOutcomes, scanWoken); err != nil {
			return nil, nil, nil, err
		}
	} else if settings == "" && len(purge) == 0 && len(parked) == 0 && len(spawners) == 0 && len(probe.IDs) == 0 {
		rows, err := db.Query(ctx, stmt, s.named(args))
		if err != nil {
			return nil, nil, nil, err
		}
		if err := scanOutcomes(rows); err != nil {
			return nil, nil, nil, err
		}
	} else {
		b := &pgx.Batch{}
		if settings != "" {
			b.Queue(settings)
		}
		b.Queue(stmt, s.named(args))
		if len(purge) > 0 {
			b.Queue(s.sql("purge_terminal_inboxes"), purge)
		}
		if len(parked) > 0 {
			b.Queue(s.sql("recheck_parked"), parked)
		}
		if len(spawners) > 0 {
			b.Queue(s.sql("recount_spawned"), spawners)
		}
		if len(probe.IDs) > 0 {
			b.Queue(s.sql("await_probe"), probe.IDs, probe.Parked, probe.Whole)
		}
		br := db.SendBatch(ctx, b)
		err := func() error {
			if settings != "" {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			rows, err := br.Query()
			if err != nil {
				return err
			}
			if err := scanOutcomes(rows); err != nil {
				return err
			}
			if len(purge) > 0 {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			for _, more := range [][]int64{parked, spawners} {
				if len(more) == 0 {
					continue
				}
				rows, err := br.Query()
				if err != nil {
					return err
				}
				if err := scanWoken(rows); err != nil {
					return err
				}
			}
			if len(probe.IDs) > 0 {
				rows, err := br.Query()
				if err != nil {
					return err
				}
				if probes, err = s.scanProbes(rows); err != nil {
					return err
				}
			}
			return nil
		}()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	if len(late) > 0 {
		// A fresh statement sees those signals; a delivery after the outcome found the row
		// finished and stored nothing. Run on a pool, this is after the outcomes committed: its
		// failure is an *InboxPurgeError, and the outcomes stand.
		if err := s.PurgeTerminalInboxes(ctx, db, late); err != nil {
			if _, inTx := db.(pgx.Tx); inTx {
				return nil, nil, nil, fmt.Errorf("clear the inboxes of finished instances: %w", err)
			}
			return applied, woken, probes, &InboxPurgeError{IDs: late, Err: err}
		}
	}
	return applied, woken, probes, nil
}

// InboxPurgeError is ApplyOutcomes' error when the outcomes were applied but the statement that
// follows them, clearing the inboxes of instances that finished while a signal arrived, failed.
// Applied to a pool, the outcomes have committed: the caller treats them as applied and clears
// IDs' inboxes later (PurgeTerminalInboxes; a signal left in a finished instance's inbox is never
// consumed, and goes with the instance when GC deletes it). Applied in a transaction, the failure
// aborts it, and is an ordinary error.
type InboxPurgeError struct {
	IDs []int64
	Err error
}

func (e *InboxPurgeError) Error() string {
	return fmt.Sprintf("clear the inboxes of %d finished instances: %v", len(e.IDs), e.Err)
}

func (e *InboxPurgeError) Unwrap() error { return e.Err }

// PurgeTerminalInboxes deletes the signals in the inboxes of those of ids that are finished
// (done, failed or cancelled); it is idempotent.
func (s *Store) PurgeTerminalInboxes(ctx context.Context, db DB, ids []int64) error {
	if fault.Enabled {
		subject := ""
		if _, inTx := db.(pgx.Tx); inTx {
			subject = "tx"
		}
		if err := fault.PointFor(fault.InboxPurge, subject); err != nil {
			return err
		}
	}
	_, err := db.Exec(ctx, s.sql("purge_terminal_inboxes"), ids)
	return err
}

// applyParkedStepwise is the outcome batch of ApplyOutcomes for a chaos build when the batch
// parks rows: the same statements in the same order and one transaction, sent one at a time, with
// the await_between_stmts fault point between the park and the re-check.
func (s *Store) applyParkedStepwise(ctx context.Context, db DB, outs []Outcome, parked, purge, spawners []int64,
	settings, stmt string, args pgx.NamedArgs, scanOutcomes, scanWoken func(pgx.Rows) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if settings != "" {
		if _, err := tx.Exec(ctx, settings); err != nil {
			return err
		}
	}
	rows, err := tx.Query(ctx, stmt, s.named(args))
	if err != nil {
		return err
	}
	if err := scanOutcomes(rows); err != nil {
		return err
	}
	if len(purge) > 0 {
		if _, err := tx.Exec(ctx, s.sql("purge_terminal_inboxes"), purge); err != nil {
			return err
		}
	}
	if fault.Enabled { // (the only caller is a chaos build's)
		for _, o := range outs {
			if o.Kind == KindAwait {
				if err := fault.PointFor(fault.AwaitBetweenStmts, o.Claim.Owner); err != nil {
					return err
				}
			}
		}
	}
	for _, q := range []struct {
		name string
		ids  []int64
	}{{"recheck_parked", parked}, {"recount_spawned", spawners}} {
		if len(q.ids) == 0 {
			continue
		}
		rows, err := tx.Query(ctx, s.sql(q.name), q.ids)
		if err != nil {
			return err
		}
		if err := scanWoken(rows); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// childArrays are a batch's spawned children as parallel arrays.
type childArrays struct {
	parent      []int64
	machine     []string
	step        []string
	state       []string
	queue       []string
	priority    []int16
	scheduledAt []*time.Time
	delay       []int64
	maxAttempts []int32
	key         []*string
	ord         []int32
	ckey        []*string
	rate        []*string
	weight      []int32
	version     []int32
	fairKey     []*string
}

func (c *childArrays) add(s *Store, parent int64, rows []InsertRow) error {
	for i := range rows {
		r := &rows[i]
		st, err := s.sealDocText(r.State)
		if err != nil {
			return err
		}
		c.parent = append(c.parent, parent)
		c.machine = append(c.machine, r.Machine)
		c.step = append(c.step, r.Step)
		c.state = append(c.state, st)
		c.queue = append(c.queue, r.Queue)
		c.priority = append(c.priority, int16(r.Priority))
		c.scheduledAt = append(c.scheduledAt, r.ScheduledAt)
		c.delay = append(c.delay, r.Delay.Milliseconds())
		c.maxAttempts = append(c.maxAttempts, int32(r.MaxAttempts))
		var key *string
		if r.CorrelationKey != "" {
			key = &r.CorrelationKey
		}
		c.key = append(c.key, key)
		c.ord = append(c.ord, int32(len(c.ord)))
		var ckey *string
		if r.ConcurrencyKey != "" {
			ckey = &r.ConcurrencyKey
		}
		c.ckey = append(c.ckey, ckey)
		var rate *string
		if r.RateLimit != "" {
			rate = &r.RateLimit
		}
		c.rate = append(c.rate, rate)
		c.weight = append(c.weight, int32(max(r.Weight, 1)))
		c.version = append(c.version, int32(r.version()))
		var fk *string
		if r.FairKey != "" {
			fk = &r.FairKey
		}
		c.fairKey = append(c.fairKey, fk)
	}
	return nil
}

func (c *childArrays) into(args pgx.NamedArgs) {
	args["c_parent"], args["c_machine"], args["c_step"], args["c_state"] = c.parent, c.machine, c.step, c.state
	args["c_queue"], args["c_priority"], args["c_scheduled_at"], args["c_delay"] = c.queue, c.priority, c.scheduledAt, c.delay
	args["c_max_attempts"], args["c_key"], args["c_ord"], args["c_ckey"] = c.maxAttempts, c.key, c.ord, c.ckey
	args["c_rate"], args["c_weight"], args["c_version"] = c.rate, c.weight, c.version
	args["c_fair_key"] = c.fairKey
}

// maxErrorText caps the error text recorded in an instance's history.
const maxErrorText = 8000

// jsonText is JSON as the statement's text parameter (nil for none).
func jsonText(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// outcomeSettings names the settings an outcome batch of its own runs under: a plain batch's, or
// those of a batch whose statement joins its own sets (see outcome.sql).
func outcomeSettings(plain bool) string {
	if plain {
		return "outcome_settings"
	}
	return "outcome_settings_joined"
}

// unlessAll returns xs, or nil when every element is v: an array parameter that is NULL rather
// than one of defaults.
func unlessAll[T comparable](xs []T, v T) []T {
	for _, x := range xs {
		if x != v {
			return xs
		}
	}
	return nil
}

// storableText makes error text storable: valid UTF-8 and no NUL (Postgres text rejects both),
// at most maxErrorText bytes, cut on a character boundary. Every error an outcome records goes
// through it, whoever wrote the text (a step, a handler, the database).
func storableText(msg string) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(msg, "\uFFFD"), "\x00", "\\0")
	if len(s) > maxErrorText {
		cut := maxErrorText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
