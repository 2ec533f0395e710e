package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/schedule"
	"github.com/gendurable/gendurable/internal/store"
	"github.com/jackc/pgx/v5"
)

// Schedule fires an instance of a machine at the times of a cron expression or of a fixed
// interval. Schedules are rows: declared in Config.Schedules (written at Start) or managed at
// run time (Client.SetSchedule and the rest); every node that runs the reaper fires due
// schedules, one instance per fire time however many nodes there are. docs/schedules.md is the
// guide.
type Schedule struct {
	// Name identifies the schedule (1 to 200 bytes of printable UTF-8).
	Name string
	// Input is the instance each fire inserts (FSM.With or Job.With); its machine must be
	// registered on the client that declares the schedule.
	Input Input
	// Opts are the instance's insert options: Queue, Priority, MaxAttempts, ConcurrencyKey,
	// RateLimit and Weight. The schedule sets the time (the fire time, plus Jitter) and the
	// correlation key ("schedule/<name>/<fire time>"), so ScheduledAt, In, CorrelationKey and
	// CorrelationScope must be empty; FairnessKey must be empty too.
	Opts *InsertOpts
	// Cron is a cron expression: five fields (minute, hour, day of month, month, day of week) or
	// six (seconds first), or a descriptor (@hourly, @daily, @weekly, @monthly, @yearly). Set
	// Cron or Every.
	Cron string
	// Every fires at a fixed interval (at least a second), at the multiples of it since the Unix
	// epoch: every 5 minutes is :00, :05, :10, … UTC.
	Every time.Duration
	// TimeZone is the IANA zone Cron is read in ("Europe/Berlin"; default UTC). See
	// docs/schedules.md for daylight-saving transitions.
	TimeZone string
	// Overlap is what a fire does while the instance of the fire before is still live. Default
	// OverlapSkip.
	Overlap Overlap
	// CatchUp is how far back a schedule that missed fire times (no node fired it: all were
	// down, or it was failing) fires them when a node fires it again: the missed times within
	// CatchUp of now fire, older ones are skipped and reported (event schedule.skipped). The
	// latest missed time always fires; 0 (the default) fires it alone.
	CatchUp time.Duration
	// Jitter delays each fire's instance by up to Jitter (the same delay on every node: a
	// function of the name and the fire time), to spread schedules that share a fire time.
	Jitter time.Duration
}

// Overlap is a schedule's policy for a fire that comes while its previous instance is live.
type Overlap string

// The overlap policies.
const (
	// OverlapSkip skips the fire (reported as skipped, reason "overlap").
	OverlapSkip Overlap = "skip"
	// OverlapAllow fires anyway: instances of the schedule may run side by side.
	OverlapAllow Overlap = "allow"
	// OverlapCancel cancels the live instance, then fires.
	OverlapCancel Overlap = "cancel"
)

// ScheduleInfo is a schedule as stored, with its fire history.
type ScheduleInfo struct {
	Name     string
	Machine  string
	Queue    string
	Cron     string
	Every    time.Duration
	TimeZone string
	Overlap  Overlap
	CatchUp  time.Duration
	Jitter   time.Duration
	// DeclaredBy is the Config.Service that declares it ("": added at run time).
	DeclaredBy string
	Paused     bool
	// NextFireAt is its next fire time (while paused: when it was due when paused).
	NextFireAt time.Time
	// LastFireAt and LastInstanceID are its last fire and the instance it inserted;
	// LastStatus that instance's status ("" when it is gone).
	LastFireAt     *time.Time
	LastInstanceID *int64
	LastStatus     Status
	// Fired and Skipped count its fire times fired and skipped; LastSkip reports the last
	// skip ({"reason", "count", "first", "last", "at"}).
	Fired, Skipped int64
	LastSkip       json.RawMessage
	// LastError is why its last try to fire failed, until a fire succeeds.
	LastError   string
	LastErrorAt *time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// maxScheduleName bounds a schedule's name (its fire keys must fit a correlation key).
const maxScheduleName = 200

// scheduleDef validates s and builds its stored form; field prefixes the fields named in errors.
func (c *Client) scheduleDef(s *Schedule, declaredBy string) (store.ScheduleDef, error) {
	bad := func(field, format string, args ...any) error {
		return &InputError{Index: -1, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if s.Name == "" || len(s.Name) > maxScheduleName || !printable(s.Name) {
		return store.ScheduleDef{}, bad("Name", "%q: use 1 to %d bytes of printable characters", s.Name, maxScheduleName)
	}
	if _, err := schedule.Parse(s.Cron, s.Every, s.TimeZone); err != nil {
		field := "Cron"
		switch {
		case s.Every != 0 && s.Cron == "":
			field = "Every"
		case s.TimeZone != "" && errors.Is(err, schedule.ErrZone):
			field = "TimeZone"
		}
		return store.ScheduleDef{}, bad(field, "schedule %q: %v", s.Name, err)
	}
	opts := InsertOpts{}
	if s.Opts != nil {
		opts = *s.Opts
	}
	switch {
	case !opts.ScheduledAt.IsZero() || opts.In != 0:
		return store.ScheduleDef{}, bad("Opts", "schedule %q: ScheduledAt and In are set by the schedule", s.Name)
	case opts.CorrelationKey != "" || len(opts.CorrelationScope) > 0:
		return store.ScheduleDef{}, bad("Opts", "schedule %q: the correlation key is set by the schedule (one per fire time)", s.Name)
	case opts.FairnessKey != "":
		return store.ScheduleDef{}, bad("Opts", "schedule %q: a schedule's instances cannot take a FairnessKey (set it with the FairnessKey option of their first step's Next)", s.Name)
	}
	if s.Input.err == nil && s.Input.machine != "" && c.eng.Machine(s.Input.machine) == nil {
		return store.ScheduleDef{}, &InputError{Index: -1, Field: "Input", Err: ErrUnknownMachine,
			Reason: fmt.Sprintf("schedule %q: machine %q is not registered on this client", s.Name, s.Input.machine)}
	}
	var row store.InsertRow
	if err := c.row(&InsertManyParams{Input: s.Input, Opts: &opts}, -1, &row); err != nil {
		var ie *InputError
		if errors.As(err, &ie) {
			ie.Reason = fmt.Sprintf("schedule %q: %s", s.Name, ie.Reason)
		}
		return store.ScheduleDef{}, err
	}
	overlap := s.Overlap
	switch overlap {
	case "":
		overlap = OverlapSkip
	case OverlapSkip, OverlapAllow, OverlapCancel:
	default:
		return store.ScheduleDef{}, bad("Overlap", "schedule %q: %q: use OverlapSkip, OverlapAllow or OverlapCancel", s.Name, s.Overlap)
	}
	if s.CatchUp < 0 || s.Jitter < 0 {
		return store.ScheduleDef{}, bad("CatchUp", "schedule %q: CatchUp %v and Jitter %v must not be negative", s.Name, s.CatchUp, s.Jitter)
	}
	return store.ScheduleDef{
		Name: s.Name, Machine: row.Machine, Cron: s.Cron, Every: s.Every, TimeZone: s.TimeZone, Overlap: string(overlap),
		CatchUp: s.CatchUp, Jitter: s.Jitter, DeclaredBy: declaredBy,
		Input: store.ScheduleInput{Step: row.Step, State: json.RawMessage(row.State), Queue: row.Queue, Priority: row.Priority,
			MaxAttempts: row.MaxAttempts, ConcurrencyKey: row.ConcurrencyKey, RateLimit: row.RateLimit, Weight: row.Weight,
			Version: row.MachineVersion},
	}, nil
}

// SetSchedule creates the schedule, or rewrites the one with its name (what it fires, when and
// its policies; its fire history and paused flag are kept, and its next fire time is computed
// again only if its timing changed). A schedule set here is never removed by a service's
// reconciliation; one a service declares (Config.Schedules) is that service's, and SetSchedule
// refuses to rewrite it (ErrScheduleOwned: change the declaration instead). An invalid schedule is an
// *InputError naming the field, and nothing is stored.
func (c *Client) SetSchedule(ctx context.Context, s Schedule) error {
	def, err := c.scheduleDef(&s, "")
	if err != nil {
		return err
	}
	if err := c.inOwnTx(ctx, func(tx pgx.Tx) error { return c.putSchedule(ctx, tx, &def) }); err != nil {
		return err
	}
	c.eng.KickSchedules()
	return nil
}

// putSchedule writes def in tx under the row's lock. A declared schedule belongs to its
// service: another service, or a run-time SetSchedule, may not rewrite it.
func (c *Client) putSchedule(ctx context.Context, tx pgx.Tx, def *store.ScheduleDef) error {
	now, cur, err := c.store.LockSchedule(ctx, tx, def.Name)
	if err != nil {
		return fmt.Errorf("gendurable: schedule %q: %w", def.Name, err)
	}
	if cur != nil && cur.DeclaredBy != "" && cur.DeclaredBy != def.DeclaredBy {
		if def.DeclaredBy != "" {
			// Declared by two services: the first one's declaration stands, and only it
			// removes the schedule.
			c.eng.Config().Logger.Info("gendurable: schedule declared by another service as well; its declaration stands",
				"schedule", def.Name, "service", def.DeclaredBy, "declared_by", cur.DeclaredBy)
			return nil
		}
		return &InputError{Index: -1, Field: "Name", Err: durabletype.ErrScheduleOwned,
			Reason: fmt.Sprintf("schedule %q is declared by service %q", def.Name, cur.DeclaredBy)}
	}
	spec, err := schedule.Parse(def.Cron, def.Every, def.TimeZone)
	if err != nil {
		return err
	}
	next := spec.Next(now)
	if cur != nil && cur.Cron == def.Cron && cur.Every == def.Every && cur.TimeZone == def.TimeZone {
		next = cur.NextFireAt // same timing: keep its place, so a restart misses and repeats nothing
	}
	if err := c.store.UpsertSchedule(ctx, tx, def, next); err != nil {
		return fmt.Errorf("gendurable: schedule %q: %w", def.Name, err)
	}
	return nil
}

// reconcileSchedules writes the schedules this client's Config declares and removes the ones
// its service declared before and no longer does (Start). Schedules of other services and those
// set at run time are never touched.
func (c *Client) reconcileSchedules(ctx context.Context) error {
	if c.service == "" && len(c.declared) == 0 {
		return nil
	}
	err := c.inOwnTx(ctx, func(tx pgx.Tx) error {
		names := make([]string, len(c.declared))
		for i := range c.declared {
			names[i] = c.declared[i].Name
			if err := c.putSchedule(ctx, tx, &c.declared[i]); err != nil {
				return err
			}
		}
		if c.service == "" {
			return nil
		}
		removed, err := c.store.PruneSchedules(ctx, tx, c.service, names)
		if err != nil {
			return fmt.Errorf("gendurable: remove the schedules service %q no longer declares: %w", c.service, err)
		}
		if len(removed) > 0 {
			c.eng.Config().Logger.Info("gendurable: removed the schedules this service no longer declares",
				"service", c.service, "schedules", removed)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gendurable: start: schedules: %w", err)
	}
	return nil
}

// RemoveSchedule removes the schedule named name (ErrUnknownSchedule if there is none). The
// instances it fired stay. A schedule still declared in a service's Config comes back at that
// service's next Start.
func (c *Client) RemoveSchedule(ctx context.Context, name string) error {
	ok, err := c.store.DeleteSchedule(ctx, c.pool, name)
	if err != nil {
		return fmt.Errorf("gendurable: remove schedule %q: %w", name, err)
	}
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownSchedule, name)
	}
	return nil
}

// PauseSchedule stops the schedule named name from firing until ResumeSchedule (on every node;
// it survives restarts). The fire times that pass while it is paused are not caught up.
func (c *Client) PauseSchedule(ctx context.Context, name string) error {
	return c.pause(ctx, name, true)
}

// ResumeSchedule makes a paused schedule fire again, from its next fire time after now.
func (c *Client) ResumeSchedule(ctx context.Context, name string) error {
	if err := c.pause(ctx, name, false); err != nil {
		return err
	}
	c.eng.KickSchedules()
	return nil
}

func (c *Client) pause(ctx context.Context, name string, paused bool) error {
	err := c.inOwnTx(ctx, func(tx pgx.Tx) error {
		now, cur, err := c.store.LockSchedule(ctx, tx, name)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("%w: %q", ErrUnknownSchedule, name)
		}
		var next *time.Time
		if !paused && cur.Paused {
			spec, err := schedule.Parse(cur.Cron, cur.Every, cur.TimeZone)
			if err != nil {
				return err
			}
			n := spec.Next(now)
			next = &n
		}
		_, err = c.store.PauseSchedule(ctx, tx, name, paused, next)
		return err
	})
	if err != nil && !errors.Is(err, ErrUnknownSchedule) {
		return fmt.Errorf("gendurable: pause schedule %q: %w", name, err)
	}
	return err
}

// TriggerSchedule fires the schedule named name now, whatever its timing and overlap policy
// (also while paused), and returns the instance's id. Its next fire time does not move.
func (c *Client) TriggerSchedule(ctx context.Context, name string) (int64, error) {
	var id int64
	var queue, machine string
	var at time.Time
	err := c.inOwnTx(ctx, func(tx pgx.Tx) error {
		now, cur, err := c.store.LockSchedule(ctx, tx, name)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("%w: %q", ErrUnknownSchedule, name)
		}
		r := cur.Input.Row(cur.Machine, nil)
		r.CorrelationKey, r.ScopeMask = maintenance.FireKey(name, now), 7
		res, err := c.store.InsertMany(ctx, tx, []store.InsertRow{r})
		if err != nil {
			return err
		}
		id, queue, machine, at = res[0].ID, r.Queue, r.Machine, now
		return c.store.ScheduleTriggered(ctx, tx, name, now, id)
	})
	if err != nil {
		if errors.Is(err, ErrUnknownSchedule) {
			return 0, err
		}
		return 0, fmt.Errorf("gendurable: trigger schedule %q: %w", name, err)
	}
	c.eng.Poke(queue)
	c.eng.Emit(durabletype.Event{Name: durabletype.EventScheduleFired, Schedule: name, Machine: machine, Queue: queue,
		InstanceID: id, Count: 1, Duration: time.Since(at)})
	return id, nil
}

// Schedules lists every schedule, by name.
func (c *Client) Schedules(ctx context.Context) ([]ScheduleInfo, error) {
	return c.schedules(ctx, "")
}

// GetSchedule returns the schedule named name (ErrUnknownSchedule if there is none).
func (c *Client) GetSchedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: the empty name", ErrUnknownSchedule)
	}
	out, err := c.schedules(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSchedule, name)
	}
	return &out[0], nil
}

func (c *Client) schedules(ctx context.Context, name string) ([]ScheduleInfo, error) {
	rows, err := c.store.ListSchedules(ctx, c.pool, name)
	if err != nil {
		return nil, fmt.Errorf("gendurable: list schedules: %w", err)
	}
	out := make([]ScheduleInfo, len(rows))
	for i, r := range rows {
		out[i] = ScheduleInfo{Name: r.Name, Machine: r.Machine, Queue: r.Input.Queue, Cron: r.Cron, Every: r.Every,
			TimeZone: r.TimeZone, Overlap: Overlap(r.Overlap), CatchUp: r.CatchUp, Jitter: r.Jitter, DeclaredBy: r.DeclaredBy,
			Paused: r.Paused, NextFireAt: r.NextFireAt, LastFireAt: r.LastFireAt, LastInstanceID: r.LastInstanceID,
			LastStatus: Status(r.LastStatus), Fired: r.Fired, Skipped: r.Skipped, LastSkip: r.LastSkip,
			LastError: r.LastError, LastErrorAt: r.LastErrorAt, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	}
	return out, nil
}
