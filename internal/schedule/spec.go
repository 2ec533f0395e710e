// Package schedule computes when a schedule fires: a cron expression in a time zone, or a fixed
// interval. Parsing is robfig/cron's; this package adds the time-zone rules (daylight-saving
// transitions) and the catch-up arithmetic of a schedule that missed fire times.
package schedule

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
	// Every node reads time zones from the same database, the one built into the binary, so
	// that nodes agree on fire times whatever their system's zoneinfo holds.
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
)

// ErrZone is the error of a time zone name that is not in the IANA database.
var ErrZone = errors.New("not an IANA time zone name")

// MinInterval is the shortest interval schedule.
const MinInterval = time.Second

// parser reads five fields (minute to day of week) or six (seconds first), and the descriptors
// (@daily, @hourly, …); @every and a CRON_TZ= prefix are refused by Parse (Interval and the time
// zone have fields of their own).
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// allHours is the hour bits of a spec that fires in every hour of the day.
const allHours = 1<<24 - 1

// Spec is a parsed schedule: when it fires.
type Spec struct {
	cron  *cron.SpecSchedule
	every time.Duration
	loc   *time.Location
	// wall: the spec names hours, so it is read on the wall clock (see Next).
	wall bool
}

// Parse parses a cron expression in the IANA time zone tz ("" is UTC), or, when expr is empty,
// an interval of at least MinInterval. The error names what is wrong.
func Parse(expr string, every time.Duration, tz string) (*Spec, error) {
	expr = strings.TrimSpace(expr)
	switch {
	case expr == "" && every == 0:
		return nil, errors.New("neither a cron expression nor an interval")
	case expr != "" && every != 0:
		return nil, errors.New("a cron expression and an interval: set one")
	case every != 0:
		if every < MinInterval {
			return nil, fmt.Errorf("interval %v: at least %v", every, MinInterval)
		}
		if tz != "" {
			return nil, fmt.Errorf("time zone %q with an interval: an interval is the same in every zone", tz)
		}
		return &Spec{every: every, loc: time.UTC}, nil
	}
	if strings.HasPrefix(expr, "@every") {
		return nil, fmt.Errorf("cron expression %q: use the interval field for @every", expr)
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, fmt.Errorf("cron expression %q: put the time zone in its own field", expr)
	}
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil || tz == "Local" {
			return nil, fmt.Errorf("time zone %q: %w", tz, ErrZone)
		}
		loc = l
	}
	sched, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("cron expression %q: %w", expr, err)
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron expression %q: not a calendar expression", expr)
	}
	if spec.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return nil, fmt.Errorf("cron expression %q: never fires (no such date)", expr)
	}
	s := &Spec{loc: loc, wall: spec.Hour&allHours != allHours}
	c := *spec
	c.Location = loc
	if s.wall {
		c.Location = time.UTC // read on the wall clock, see Next
	}
	s.cron = &c
	return s, nil
}

// Interval is the spec's interval (0 for a cron expression).
func (s *Spec) Interval() time.Duration { return s.every }

// Next is the first fire time strictly after t (the zero time if there is none within five
// years, which only an expression like "0 0 30 2 *" reaches, and Parse refuses those).
//
// An interval fires at the multiples of itself since the Unix epoch, so that every node
// computes the same times. A cron expression that fires in every hour of the day (seconds,
// minutes, "*/5 * * * *") keeps its pace in real time across daylight-saving transitions. One
// that names hours is read on the wall clock of its time zone and fires once per matching wall
// time: a time that a spring-forward transition skips fires shifted by the gap (02:30 fires at
// 03:30, once), and a time that a fall-back transition repeats fires at its first occurrence
// only.
func (s *Spec) Next(t time.Time) time.Time {
	if s.every > 0 {
		n := t.UnixNano()/int64(s.every)*int64(s.every) + int64(s.every)
		return time.Unix(0, n).UTC()
	}
	if !s.wall {
		return s.cron.Next(t).UTC()
	}
	// The wall clock as if it were UTC: the cron fields are matched on it, then the matching
	// wall time is placed in the zone.
	local := t.In(s.loc)
	w := time.Date(local.Year(), local.Month(), local.Day(), local.Hour(), local.Minute(), local.Second(), local.Nanosecond(), time.UTC)
	for range 10_000 {
		w = s.cron.Next(w)
		if w.IsZero() {
			return time.Time{}
		}
		if at := s.place(w); at.After(t) {
			return at.UTC()
		}
	}
	return time.Time{}
}

// place is the instant at which the wall time w (its fields read in UTC) happens in the zone:
// its first occurrence when the zone repeats it, and, when the zone skips it, the instant it
// would be at the offset in force before the skip (02:30 in a gap from 02:00 to 03:00 is 03:30).
// time.Date's choice in both cases is unspecified, so the offsets of the days around are tried.
func (s *Spec) place(w time.Time) time.Time {
	_, before := time.Date(w.Year(), w.Month(), w.Day()-1, w.Hour(), w.Minute(), 0, 0, s.loc).Zone()
	_, after := time.Date(w.Year(), w.Month(), w.Day()+1, w.Hour(), w.Minute(), 0, 0, s.loc).Zone()
	a := w.Add(-time.Duration(before) * time.Second)
	b := w.Add(-time.Duration(after) * time.Second)
	if b.Before(a) {
		a, b = b, a
	}
	switch {
	case sameWall(a.In(s.loc), w):
		return a
	case sameWall(b.In(s.loc), w):
		return b
	}
	return w.Add(-time.Duration(before) * time.Second)
}

func sameWall(a, w time.Time) bool {
	return a.Year() == w.Year() && a.Month() == w.Month() && a.Day() == w.Day() && a.Hour() == w.Hour() &&
		a.Minute() == w.Minute() && a.Second() == w.Second()
}

// Catchup is what a schedule whose next fire time is due does now (Spec.Due).
type Catchup struct {
	// Fire are the fire times to fire now, oldest first.
	Fire []time.Time
	// Skipped counts the missed fire times not fired (older than the window); FirstSkipped and
	// LastSkipped bound them. Counting stops at maxCount (Capped).
	Skipped                   int
	Capped                    bool
	FirstSkipped, LastSkipped time.Time
	// Next is the next fire time after the ones fired and skipped.
	Next time.Time
}

// maxCount bounds the fire times counted while skipping an outage.
const maxCount = 10_000

// Due is what a schedule due at next (next ≤ now) fires at now: the missed fire times since
// next that fall within window of now, and always the latest one; at most limit of them (the
// rest stay due: Next is the first one left). The older ones are skipped.
func (s *Spec) Due(next, now time.Time, window time.Duration, limit int) Catchup {
	var c Catchup
	from := now.Add(-window)
	t := next
	// The fire times before the window are skipped, but the latest due one, which fires when no
	// fire time falls inside the window.
	for t.Before(from) {
		n := s.Next(t)
		if n.IsZero() || n.After(now) {
			break
		}
		c.note(t)
		if c.Capped {
			// A long outage: jump to the window (the count is a lower bound), or, when no fire
			// time falls inside it, to the latest due one.
			if j := s.Next(from.Add(-time.Nanosecond)); !j.IsZero() && !j.After(now) {
				t = j
			} else {
				t = s.latest(n, now)
			}
			break
		}
		t = n
	}
	for !t.IsZero() && !t.After(now) && len(c.Fire) < limit {
		c.Fire = append(c.Fire, t)
		t = s.Next(t)
	}
	c.Next = t
	return c
}

func (c *Catchup) note(t time.Time) {
	if c.Skipped == 0 {
		c.FirstSkipped = t
	}
	c.LastSkipped = t
	c.Skipped++
	c.Capped = c.Skipped >= maxCount
}

// latest is the last fire time at or before now, at or after after (which is one).
func (s *Spec) latest(after, now time.Time) time.Time {
	for back := time.Minute; ; back *= 8 {
		from := now.Add(-back)
		if from.Before(after) || back > 400*24*time.Hour {
			from = after
		}
		var last time.Time
		for t := s.Next(from.Add(-time.Nanosecond)); !t.IsZero() && !t.After(now); t = s.Next(t) {
			last = t
		}
		if !last.IsZero() || from.Equal(after) {
			return last
		}
	}
}

// Jitter is the delay, from 0 up to (not including) max, that a schedule's fire at fire time at
// waits: a function of the schedule's name and the time, so that every node agrees on it.
func Jitter(name string, at time.Time, max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "%s@%d", name, at.UnixNano())
	return time.Duration(h.Sum64() % uint64(max))
}
