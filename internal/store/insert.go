package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

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
	// MachineVersion is the version of the machine the row starts at (0 is 1).
	MachineVersion int
	// FairKey is the row's fairness key ("" for none) and FairWeight the key's weight (0 is 1):
	// a row due at once with a key gets its place in its queue's fair order.
	FairKey    string
	FairWeight float64
}

// fairNow reports whether r gets a fair tag as it is inserted: it has a key and is due at once.
func (r *InsertRow) fairNow() bool {
	return r.FairKey != "" && r.ScheduledAt == nil && r.Delay <= 0
}

func (r *InsertRow) version() int { return max(r.MachineVersion, 1) }

// Inserted is the result of one input row.
type Inserted struct {
	ID        int64
	Duplicate bool
}

// Runnable reports whether an Insert of r may be claimed by its own client as it is inserted
// (InsertClaim): no correlation key, concurrency key, rate limit or fairness key, and due now.
func (r *InsertRow) Runnable() bool {
	return r.CorrelationKey == "" && r.ConcurrencyKey == "" && r.RateLimit == "" && r.FairKey == "" &&
		r.ScheduledAt == nil && r.Delay == 0
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
	stored, err := s.sealDocText(r.State)
	if err != nil {
		return 0, nil, err
	}
	if err := db.QueryRow(ctx, s.sql("insert_claim"), r.Machine, r.Step, stored, r.Queue, int16(r.Priority),
		int32(r.MaxAttempts), owner, lease.Milliseconds(), int32(r.version())).Scan(&id, &claimed, &state, &at); err != nil {
		return 0, nil, err
	}
	if !claimed {
		return id, nil, nil
	}
	if s.Codec != nil {
		state = []byte(r.State) // the step reads the plaintext it was given, not the sealed copy
	}
	return id, &Claimed{ID: id, Machine: r.Machine, Step: r.Step, State: state, Attempt: 1, MaxAttempts: r.MaxAttempts,
		Priority: r.Priority, InsertedAt: at, Owner: owner, MachineVersion: r.version()}, nil
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
	versions := make([]int32, n)
	// The fairness arrays stay nil (NULL arrays: unnest reads NULLs) for a batch without keys:
	// insert_many reads only the keys, and only insert_many_fair the ranks and weights.
	var fairKeys []*string
	var fairRanks []*int32
	var fairWeights []float64
	var ranks fairRankings
	for j, i := range idx {
		r := &in[i]
		st, err := s.sealDocText(r.State)
		if err != nil {
			return nil, err
		}
		machines[j], steps[j], states[j], queues[j] = r.Machine, r.Step, st, r.Queue
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
		versions[j] = int32(r.version())
		if r.FairKey != "" {
			if fairKeys == nil {
				fairKeys, fairRanks, fairWeights = make([]*string, n), make([]*int32, n), make([]float64, n)
			}
			fairKeys[j], fairWeights[j] = &in[i].FairKey, 1
			if r.FairWeight > 0 {
				fairWeights[j] = r.FairWeight
			}
			if r.fairNow() {
				fairRanks[j] = ranks.next(r.Queue, r.Priority, r.FairKey)
			}
		}
	}
	var rows pgx.Rows
	var err error
	if n == 1 {
		stmt := "insert_one"
		var fairKey *string
		var fairRank *int32
		fairWeight := 1.0
		if fairKeys != nil {
			fairKey, fairRank, fairWeight = fairKeys[0], fairRanks[0], fairWeights[0]
		}
		if fairRank != nil {
			stmt = "insert_one_fair"
		}
		rows, err = db.Query(ctx, s.sql(stmt), machines[0], steps[0], states[0], queues[0], prios[0], sched[0],
			delays[0], maxAtt[0], keys[0], masks[0], ords[0], ckeys[0], rates[0], weights[0], versions[0],
			fairKey, fairRank, fairWeight)
	} else {
		stmt := "insert_many"
		if ranks != nil {
			stmt = "insert_many_fair"
		}
		rows, err = db.Query(ctx, s.sql(stmt), machines, steps, states, queues, prios, sched, delays, maxAtt,
			keys, masks, ords, ckeys, rates, weights, versions, fairKeys, fairRanks, fairWeights)
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
