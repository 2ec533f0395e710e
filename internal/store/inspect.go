package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/jackc/pgx/v5"
)

// QueueStats counts instances by queue and status, for the statuses asked for (each at the cost
// its statement states in inspect.sql: available, executing and parked rows from their partial
// indexes, finished rows from the counts the triggers keep), in one round trip. Every queue with
// a row in one of those statuses is returned, in name order, with an entry for each status asked
// for.
func (s *Store) QueueStats(ctx context.Context, db DB, statuses []durabletype.Status) ([]durabletype.QueueStats, error) {
	var wantAvailable, wantExecuting bool
	var parked, finished []string
	for _, st := range statuses {
		switch st {
		case durabletype.StatusAvailable:
			wantAvailable = true
		case durabletype.StatusExecuting:
			wantExecuting = true
		case durabletype.StatusAwaiting, durabletype.StatusJoining:
			parked = append(parked, string(st))
		default:
			finished = append(finished, string(st))
		}
	}
	b := &pgx.Batch{}
	if wantAvailable {
		b.Queue(s.sql("queue_stats_available"))
	}
	if wantExecuting {
		b.Queue(s.sql("queue_stats_executing"))
	}
	if len(parked) > 0 {
		b.Queue(s.sql("queue_stats_parked"), pgx.NamedArgs{"statuses": parked})
	}
	if len(finished) > 0 {
		b.Queue(s.sql("queue_stats_finished"), pgx.NamedArgs{"statuses": finished})
	}
	if b.Len() == 0 {
		return nil, nil
	}
	byQueue := map[string]*durabletype.QueueStats{}
	get := func(queue string) *durabletype.QueueStats {
		q, ok := byQueue[queue]
		if !ok {
			q = &durabletype.QueueStats{Queue: queue, Counts: make(map[durabletype.Status]int64, len(statuses))}
			for _, st := range statuses {
				q.Counts[st] = 0
			}
			byQueue[queue] = q
		}
		return q
	}
	br := db.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	var queue, status string
	var n, due, oldestMicros int64
	if wantAvailable {
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("available rows: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&queue, &n, &due, &oldestMicros}, func() error {
			q := get(queue)
			q.Counts[durabletype.StatusAvailable] = n
			q.Runnable, q.OldestRunnable = due, time.Duration(oldestMicros)*time.Microsecond
			return nil
		}); err != nil {
			return nil, fmt.Errorf("available rows: %w", err)
		}
	}
	if wantExecuting {
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("executing rows: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&queue, &n}, func() error {
			get(queue).Counts[durabletype.StatusExecuting] = n
			return nil
		}); err != nil {
			return nil, fmt.Errorf("executing rows: %w", err)
		}
	}
	for _, part := range []struct {
		statuses []string
		what     string
	}{{parked, "parked rows"}, {finished, "finished rows"}} {
		if len(part.statuses) == 0 {
			continue
		}
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", part.what, err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&queue, &status, &n}, func() error {
			get(queue).Counts[durabletype.Status(status)] = n
			return nil
		}); err != nil {
			return nil, fmt.Errorf("%s: %w", part.what, err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	out := make([]durabletype.QueueStats, 0, len(byQueue))
	for _, q := range byQueue {
		out = append(out, *q)
	}
	slices.SortFunc(out, func(a, b durabletype.QueueStats) int { return cmp.Compare(a.Queue, b.Queue) })
	return out, nil
}

// Known is what a client knows: the (machine, step) pairs it registers, the queues it works and
// the rate limits it configures. Stuck reports rows that fall outside it.
type Known struct {
	Machines []string // parallel to Steps: one entry per registered step
	Steps    []string
	Queues   []string
	Rates    []string
}

// Stuck reports the groups of stuck instances (see durabletype.StuckKind) in one round trip:
// rows stalled on a rate limit outside known.Rates; rows of a machine or step outside known (in
// known.Queues, or every queue if it is empty; not checked at all when known registers no
// machine); parked rows past their await deadline. Groups are sorted by kind, queue, machine,
// step and rate limit.
func (s *Store) Stuck(ctx context.Context, db DB, known *Known) ([]durabletype.StuckGroup, error) {
	rates, queues := known.Rates, known.Queues
	if rates == nil {
		rates = []string{}
	}
	if queues == nil {
		queues = []string{}
	}
	checkMachines := len(known.Machines) > 0
	b := &pgx.Batch{}
	b.Queue(s.sql("stuck_unknown_rate_limits"), pgx.NamedArgs{"r_names": rates})
	if checkMachines {
		b.Queue(s.sql("stuck_unknown_machines"), pgx.NamedArgs{
			"machines": known.Machines, "steps": known.Steps, "queues": queues})
	}
	b.Queue(s.sql("stuck_overdue_awaits"))
	br := db.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()

	var out []durabletype.StuckGroup
	var g durabletype.StuckGroup
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("unknown rate limits: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&g.Queue, &g.RateLimit, &g.Count, &g.Oldest, &g.FirstID}, func() error {
		out = append(out, durabletype.StuckGroup{Kind: durabletype.StuckUnknownRateLimit, Queue: g.Queue,
			RateLimit: g.RateLimit, Count: g.Count, Oldest: g.Oldest, FirstID: g.FirstID})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("unknown rate limits: %w", err)
	}
	if checkMachines {
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("unknown machines: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&g.Queue, &g.Machine, &g.Step, &g.Count, &g.Oldest, &g.FirstID}, func() error {
			kind := durabletype.StuckUnknownMachine
			if g.Step != "" {
				kind = durabletype.StuckUnknownStep
			}
			out = append(out, durabletype.StuckGroup{Kind: kind, Queue: g.Queue, Machine: g.Machine, Step: g.Step,
				Count: g.Count, Oldest: g.Oldest, FirstID: g.FirstID})
			return nil
		}); err != nil {
			return nil, fmt.Errorf("unknown machines: %w", err)
		}
	}
	rows, err = br.Query()
	if err != nil {
		return nil, fmt.Errorf("overdue awaits: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&g.Queue, &g.Machine, &g.Count, &g.Oldest, &g.FirstID}, func() error {
		out = append(out, durabletype.StuckGroup{Kind: durabletype.StuckAwaitOverdue, Queue: g.Queue,
			Machine: g.Machine, Count: g.Count, Oldest: g.Oldest, FirstID: g.FirstID})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("overdue awaits: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b durabletype.StuckGroup) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Machine, b.Machine),
			cmp.Compare(a.Step, b.Step), cmp.Compare(a.RateLimit, b.RateLimit))
	})
	return out, nil
}

// Page selects a page of a list ordered by id: up to Limit entries with an id above After.
type Page struct {
	After int64
	Limit int
}

// Inspect reads an instance with a page of its inbox and a page of its children, in one
// statement; ErrNotFound if there is no such instance.
func (s *Store) Inspect(ctx context.Context, db DB, id int64, inbox, children Page) (*durabletype.InstanceDetail, error) {
	var inboxSize int64
	var inboxJSON, countsJSON, childrenJSON []byte
	var pausedAt *time.Time
	in, err := scanInstance(db.QueryRow(ctx, s.sql("inspect_instance"), pgx.NamedArgs{
		"id": id, "inbox_after": inbox.After, "inbox_limit": inbox.Limit,
		"children_after": children.After, "children_limit": children.Limit,
	}), nil, &inboxSize, &inboxJSON, &countsJSON, &childrenJSON, &pausedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", durabletype.ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	s.openInstance(in)
	o := opener{s: s}
	d := &durabletype.InstanceDetail{Instance: *in, InboxSize: inboxSize, PausedAt: pausedAt}
	var sigs []SignalRow
	if err := json.Unmarshal(inboxJSON, &sigs); err != nil {
		return nil, fmt.Errorf("decode inbox of %d: %w", id, err)
	}
	d.Inbox = make([]durabletype.Signal, len(sigs))
	for i, sg := range sigs {
		d.Inbox[i] = durabletype.Signal{ID: sg.ID, Name: sg.Name, At: sg.At}
		if len(sg.Payload) > 0 && string(sg.Payload) != "null" {
			d.Inbox[i].Payload = sg.Payload
			o.doc(&d.Inbox[i].Payload)
		}
	}
	var counts map[durabletype.Status]int64
	if err := json.Unmarshal(countsJSON, &counts); err != nil {
		return nil, fmt.Errorf("decode child counts of %d: %w", id, err)
	}
	d.ChildCounts = counts
	var kids []struct {
		ID        int64              `json:"id"`
		Machine   string             `json:"machine"`
		Step      string             `json:"step"`
		Queue     string             `json:"queue"`
		Status    durabletype.Status `json:"status"`
		Attempt   int                `json:"attempt"`
		Wave      int                `json:"wave"`
		Error     *string            `json:"error"`
		UpdatedAt time.Time          `json:"updated_at"`
	}
	if err := json.Unmarshal(childrenJSON, &kids); err != nil {
		return nil, fmt.Errorf("decode children of %d: %w", id, err)
	}
	d.Children = make([]durabletype.ChildSummary, len(kids))
	for i, k := range kids {
		d.Children[i] = durabletype.ChildSummary{ID: k.ID, Machine: k.Machine, Step: k.Step, Queue: k.Queue,
			Status: k.Status, Attempt: k.Attempt, Wave: k.Wave, UpdatedAt: k.UpdatedAt}
		if k.Error != nil {
			d.Children[i].Error = *k.Error
			o.text(&d.Children[i].Error)
		}
	}
	if d.Instance.CodecError == "" {
		d.Instance.CodecError = o.message()
	}
	return d, nil
}

// Throughput counts the instances finished in the last window (database clock), by queue and
// terminal status, in name order; queues with none are left out.
func (s *Store) Throughput(ctx context.Context, db DB, window time.Duration) ([]durabletype.QueueThroughput, error) {
	rows, err := db.Query(ctx, s.sql("throughput"), pgx.NamedArgs{"window_ms": window.Milliseconds()})
	if err != nil {
		return nil, err
	}
	byQueue := map[string]*durabletype.QueueThroughput{}
	var queue, status string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&queue, &status, &n}, func() error {
		q, ok := byQueue[queue]
		if !ok {
			q = &durabletype.QueueThroughput{Queue: queue}
			byQueue[queue] = q
		}
		switch durabletype.Status(status) {
		case durabletype.StatusDone:
			q.Done = n
		case durabletype.StatusFailed:
			q.Failed = n
		case durabletype.StatusCancelled:
			q.Cancelled = n
		}
		return nil
	}); err != nil {
		return nil, err
	}
	out := make([]durabletype.QueueThroughput, 0, len(byQueue))
	for _, q := range byQueue {
		out = append(out, *q)
	}
	slices.SortFunc(out, func(a, b durabletype.QueueThroughput) int { return cmp.Compare(a.Queue, b.Queue) })
	return out, nil
}

// GetInstance reads one instance row.
func (s *Store) GetInstance(ctx context.Context, db DB, id int64) (*durabletype.Instance, error) {
	in, err := scanInstance(db.QueryRow(ctx, s.sql("get_instance"), id), nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", durabletype.ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	s.openInstance(in)
	return in, nil
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
	at := map[string]int{}
	_, err = pgx.ForEachRow(rows, []any{&r.Reason, &r.Count}, func() error {
		// Sealed texts differ even when their plaintexts are equal: group them again opened.
		o := opener{s: s}
		o.text(&r.Reason)
		if i, ok := at[r.Reason]; ok {
			out[i].Count += r.Count
			return nil
		}
		at[r.Reason] = len(out)
		out = append(out, r)
		return nil
	})
	slices.SortFunc(out, func(a, b Reason) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Reason, b.Reason)) })
	return out, err
}
