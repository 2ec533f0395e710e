package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DBTime is a point in time read from the database's clock (now(), or a column), or computed
// from one: what the schedule statements take, never a worker's clock reading.
type DBTime = time.Time

// ScheduleInput is what a schedule inserts at each fire: an InsertRow without its time and
// correlation key (the firing loop sets both), as stored in the schedule's input column.
type ScheduleInput struct {
	Step           string          `json:"step"`
	State          json.RawMessage `json:"state"`
	Queue          string          `json:"queue"`
	Priority       int             `json:"priority"`
	MaxAttempts    int             `json:"max_attempts"`
	ConcurrencyKey string          `json:"concurrency_key,omitempty"`
	RateLimit      string          `json:"rate_limit,omitempty"`
	Weight         int             `json:"weight,omitempty"`
	Version        int             `json:"version,omitempty"`
}

// Row is the insert of one fire of machine at (its correlation key set by the caller).
func (in *ScheduleInput) Row(machine string, at *time.Time) InsertRow {
	return InsertRow{Machine: machine, Step: in.Step, State: string(in.State), Queue: in.Queue, Priority: in.Priority,
		ScheduledAt: at, MaxAttempts: in.MaxAttempts, ConcurrencyKey: in.ConcurrencyKey, RateLimit: in.RateLimit,
		Weight: in.Weight, MachineVersion: in.Version}
}

// ScheduleDef is a schedule as declared: its name, what it fires, when and by which policies.
type ScheduleDef struct {
	Name     string
	Machine  string
	Input    ScheduleInput
	Cron     string
	Every    time.Duration
	TimeZone string
	Overlap  string // "allow", "skip" or "cancel"
	CatchUp  time.Duration
	Jitter   time.Duration
	// DeclaredBy is the service whose Config declares the schedule ("": added at runtime).
	DeclaredBy string
}

// ScheduleRow is a schedule as stored, with its fire history.
type ScheduleRow struct {
	ScheduleDef
	Paused         bool
	NextFireAt     time.Time
	LastFireAt     *time.Time
	LastInstanceID *int64
	// LastStatus is the status of the last instance fired ("" when there is none any more).
	LastStatus     string
	Fired, Skipped int64
	LastSkip       json.RawMessage
	LastError      string
	LastErrorAt    *time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// ScheduleLocked is the part of a stored schedule its writers need, read under its row lock.
type ScheduleLocked struct {
	// DeclaredBy is the service that declares it ("": set at run time).
	DeclaredBy string
	Machine    string
	Input      ScheduleInput
	Cron       string
	Every      time.Duration
	TimeZone   string
	Paused     bool
	NextFireAt time.Time
}

// LockSchedule returns the database's clock and locks the schedule named name in tx
// (schedule_lock); cur is nil when there is no such schedule.
func (s *Store) LockSchedule(ctx context.Context, tx pgx.Tx, name string) (now time.Time, cur *ScheduleLocked, err error) {
	var c ScheduleLocked
	var every int64
	var input []byte
	err = tx.QueryRow(ctx, s.sql("schedule_lock"), pgx.NamedArgs{"name": name}).Scan(&now, &c.DeclaredBy, &c.Machine,
		&input, &c.Cron, &every, &c.TimeZone, &c.Paused, &c.NextFireAt)
	if errors.Is(err, pgx.ErrNoRows) {
		err = tx.QueryRow(ctx, s.sql("schedule_now")).Scan(&now)
		return now, nil, err
	}
	if err != nil {
		return now, nil, err
	}
	if err := json.Unmarshal(input, &c.Input); err != nil {
		return now, nil, fmt.Errorf("schedule %q: decode its input: %w", name, err)
	}
	c.Every = ms(every)
	return now, &c, nil
}

// UpsertSchedule creates or rewrites d, to fire next at next (schedule_upsert); tx holds the
// row's lock (LockSchedule).
func (s *Store) UpsertSchedule(ctx context.Context, tx pgx.Tx, d *ScheduleDef, next DBTime) error {
	in := d.Input
	// The input's state is stored sealed, and stays sealed in the rows each fire inserts.
	st, err := s.sealDoc(in.State)
	if err != nil {
		return err
	}
	in.State = st
	input, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode the schedule's input: %w", err)
	}
	var by *string
	if d.DeclaredBy != "" {
		by = &d.DeclaredBy
	}
	_, err = tx.Exec(ctx, s.sql("schedule_upsert"), pgx.NamedArgs{"name": d.Name, "machine": d.Machine,
		"input": string(input), "cron": d.Cron, "every_ms": d.Every.Milliseconds(), "time_zone": d.TimeZone,
		"overlap": d.Overlap, "catch_up_ms": d.CatchUp.Milliseconds(), "jitter_ms": d.Jitter.Milliseconds(),
		"declared_by": by, "next_fire_at": next})
	return err
}

// PauseSchedule pauses or resumes the schedule named name (schedule_pause); next, if not nil,
// is its new next fire time. It reports whether the schedule exists.
func (s *Store) PauseSchedule(ctx context.Context, db DB, name string, paused bool, next *time.Time) (bool, error) {
	tag, err := db.Exec(ctx, s.sql("schedule_pause"), pgx.NamedArgs{"name": name, "paused": paused, "next_fire_at": next})
	return tag.RowsAffected() > 0, err
}

// DeleteSchedule removes the schedule named name (schedule_delete) and reports whether it
// existed.
func (s *Store) DeleteSchedule(ctx context.Context, db DB, name string) (bool, error) {
	tag, err := db.Exec(ctx, s.sql("schedule_delete"), pgx.NamedArgs{"name": name})
	return tag.RowsAffected() > 0, err
}

// PruneSchedules removes the schedules service declared that are not in keep (schedule_prune)
// and returns their names.
func (s *Store) PruneSchedules(ctx context.Context, db DB, service string, keep []string) ([]string, error) {
	if keep == nil {
		keep = []string{}
	}
	rows, err := db.Query(ctx, s.sql("schedule_prune"), pgx.NamedArgs{"service": service, "keep": keep})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// DueSchedule is a schedule the firing loop claimed.
type DueSchedule struct {
	ScheduleDef
	NextFireAt     time.Time
	LastInstanceID int64
	// LastStatus is the status of the instance it fired last ("" if none or gone).
	LastStatus string
}

// ClaimSchedules locks up to batch due schedules in tx (only the one named only, if not ""),
// skipping those another transaction holds (schedule_claim), and returns them with the
// database's clock.
func (s *Store) ClaimSchedules(ctx context.Context, tx pgx.Tx, batch int, only string) (now time.Time, due []DueSchedule, err error) {
	var name *string
	if only != "" {
		name = &only
	}
	rows, err := tx.Query(ctx, s.sql("schedule_claim"), pgx.NamedArgs{"batch": batch, "only": name})
	if err != nil {
		return now, nil, err
	}
	var d DueSchedule
	var input []byte
	var every, catchUp, jitter int64
	_, err = pgx.ForEachRow(rows, []any{&d.Name, &d.Machine, &input, &d.Cron, &every, &d.TimeZone, &d.Overlap, &catchUp,
		&jitter, &d.NextFireAt, &d.LastInstanceID, &d.LastStatus, &now}, func() error {
		c := d
		c.Every, c.CatchUp, c.Jitter = ms(every), ms(catchUp), ms(jitter)
		if err := json.Unmarshal(input, &c.Input); err != nil {
			return fmt.Errorf("schedule %q: decode its input: %w", d.Name, err)
		}
		due = append(due, c)
		return nil
	})
	return now, due, err
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// ScheduleAdvance is what one claimed schedule's fire did.
type ScheduleAdvance struct {
	Name       string
	Next       time.Time
	LastFire   *time.Time
	LastID     *int64
	Fired      int
	Skipped    int
	SkipReport json.RawMessage // nil keeps the last one
}

// AdvanceSchedules records the fires of schedules claimed in tx (schedule_advance).
func (s *Store) AdvanceSchedules(ctx context.Context, tx pgx.Tx, adv []ScheduleAdvance) error {
	n := len(adv)
	names, next := make([]string, n), make([]time.Time, n)
	last, ids := make([]*time.Time, n), make([]*int64, n)
	fired, skipped, reports := make([]int64, n), make([]int64, n), make([]*string, n)
	for i, a := range adv {
		names[i], next[i], last[i], ids[i] = a.Name, a.Next, a.LastFire, a.LastID
		fired[i], skipped[i] = int64(a.Fired), int64(a.Skipped)
		if a.SkipReport != nil {
			r := string(a.SkipReport)
			reports[i] = &r
		}
	}
	_, err := tx.Exec(ctx, s.sql("schedule_advance"), pgx.NamedArgs{"names": names, "next": next, "last_fire": last,
		"last_instance": ids, "fired": fired, "skipped": skipped, "last_skip": reports})
	return err
}

// ScheduleFailed records that the schedule named name failed to fire, to be tried again after
// retry (schedule_failed).
func (s *Store) ScheduleFailed(ctx context.Context, db DB, name string, cause error, retry time.Duration) error {
	_, err := db.Exec(ctx, s.sql("schedule_failed"), pgx.NamedArgs{"name": name, "error": storableText(cause.Error()),
		"retry_ms": retry.Milliseconds()})
	return err
}

// NextScheduleDue returns the earliest fire time of an unpaused schedule (nil: none) and the
// database's clock (schedule_next_due).
func (s *Store) NextScheduleDue(ctx context.Context, db DB) (next *time.Time, now time.Time, err error) {
	err = db.QueryRow(ctx, s.sql("schedule_next_due")).Scan(&next, &now)
	return next, now, err
}

// ListSchedules returns every schedule, or the one named name when name is not "" (schedule_list).
func (s *Store) ListSchedules(ctx context.Context, db DB, name string) ([]ScheduleRow, error) {
	var only *string
	if name != "" {
		only = &name
	}
	rows, err := db.Query(ctx, s.sql("schedule_list"), pgx.NamedArgs{"name": only})
	if err != nil {
		return nil, err
	}
	var out []ScheduleRow
	var r ScheduleRow
	var input, skip []byte
	var every, catchUp, jitter int64
	_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Machine, &input, &r.Cron, &every, &r.TimeZone, &r.Overlap, &catchUp,
		&jitter, &r.DeclaredBy, &r.Paused, &r.NextFireAt, &r.LastFireAt, &r.LastInstanceID, &r.LastStatus, &r.Fired,
		&r.Skipped, &skip, &r.LastError, &r.LastErrorAt, &r.CreatedAt, &r.UpdatedAt}, func() error {
		c := r
		c.Every, c.CatchUp, c.Jitter = ms(every), ms(catchUp), ms(jitter)
		if err := json.Unmarshal(input, &c.Input); err != nil {
			return fmt.Errorf("schedule %q: decode its input: %w", r.Name, err)
		}
		if skip != nil {
			c.LastSkip = append(json.RawMessage(nil), skip...)
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

// ScheduleTriggered records a manual fire of the schedule named name at at, which inserted
// instance id (schedule_triggered); tx holds the row's lock.
func (s *Store) ScheduleTriggered(ctx context.Context, tx pgx.Tx, name string, at DBTime, id int64) error {
	_, err := tx.Exec(ctx, s.sql("schedule_triggered"), pgx.NamedArgs{"name": name, "at": at, "instance": id})
	return err
}
