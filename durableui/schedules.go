package durableui

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gendurable/gendurable"
)

// scheduleRow is one schedule on the schedules page.
type scheduleRow struct {
	gendurable.ScheduleInfo
	// When is its timing: the cron expression or "every 5m".
	When string
	// Zone is the time zone Cron is read in ("" for an interval).
	Zone string
	// Skip is its last skip report, read from LastSkip; SkipText is LastSkip as stored when it
	// is not the report expected.
	Skip     *skipReport
	SkipText string
}

// skipReport is a schedule's LastSkip: fire times skipped, why and when.
type skipReport struct {
	Reason string    `json:"reason"`
	Count  int64     `json:"count"`
	Capped bool      `json:"capped"`
	First  time.Time `json:"first"`
	Last   time.Time `json:"last"`
	At     time.Time `json:"at"`
}

type schedulesPage struct {
	Schedules []scheduleRow
	// What the action that brought the browser here did, if any.
	Done     string
	Name     string
	Instance int64
	// Next is the resumed schedule's next fire time (Done "resume"), if it is still listed.
	Next time.Time
}

// newScheduleRow prepares s for the page.
func newScheduleRow(s *gendurable.ScheduleInfo) scheduleRow {
	row := scheduleRow{ScheduleInfo: *s}
	if s.Cron != "" {
		row.When, row.Zone = s.Cron, s.TimeZone
		if row.Zone == "" {
			row.Zone = "UTC"
		}
	} else {
		row.When = "every " + exactDuration(s.Every)
	}
	if len(s.LastSkip) > 0 && string(s.LastSkip) != "null" {
		var rep skipReport
		if err := json.Unmarshal(s.LastSkip, &rep); err == nil && rep.Reason != "" {
			row.Skip = &rep
		} else {
			row.SkipText = string(s.LastSkip)
		}
	}
	return row
}

// Span is the fire times skipped: one time, or the first and the last.
func (s *skipReport) Span() []string {
	if s.First.Equal(s.Last) || s.Last.IsZero() {
		return []string{formatTime(s.First)}
	}
	return []string{formatTime(s.First), formatTime(s.Last)}
}

// Why explains the reason of a skip.
func (s *skipReport) Why() string {
	switch s.Reason {
	case "overlap":
		return "the instance of the fire before was still live (overlap policy skip)"
	case "catch-up":
		return "missed while no node fired the schedule, and older than its catch-up window"
	}
	return s.Reason
}

func (h *handler) schedules(w http.ResponseWriter, r *http.Request) {
	list, err := h.client.Schedules(r.Context())
	if err != nil {
		h.failErr(w, r, "schedules", err)
		return
	}
	p := schedulesPage{Schedules: make([]scheduleRow, len(list))}
	for i := range list {
		p.Schedules[i] = newScheduleRow(&list[i])
	}
	q := r.URL.Query()
	switch done := q.Get("done"); done {
	case "pause", "resume", "trigger", "remove":
		p.Done, p.Name = done, q.Get("schedule")
		if done == "trigger" {
			if n, err := strconv.ParseInt(q.Get("instance"), 10, 64); err == nil && n > 0 {
				p.Instance = n
			}
		}
		if done == "resume" {
			for _, s := range list {
				if s.Name == p.Name && !s.Paused {
					p.Next = s.NextFireAt
				}
			}
		}
	}
	h.render(w, r, http.StatusOK, "schedules", "Schedules", "schedules", p)
}

// scheduleAct is one action on the schedule named name, called once every check has passed.
// It returns what to add to the query of the schedules page the browser is sent back to.
type scheduleAct func(r *http.Request, name string) (url.Values, error)

// scheduleAction wraps a scheduleAct with the checks every POST passes (guard). The schedule is
// the form's "schedule" field.
func (h *handler) scheduleAction(do scheduleAct) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		action := actionName(r)
		back := h.toSchedules()
		if !h.guard(w, r, action, back) {
			return
		}
		name := r.PostForm.Get("schedule")
		if name == "" {
			h.failTo(w, r, http.StatusBadRequest, "The form names no schedule.", back)
			return
		}
		q, err := do(r, name)
		if err != nil {
			if status := statusOf(err); status != http.StatusInternalServerError {
				h.log.InfoContext(r.Context(), "durableui: action failed", "action", action, "schedule", name, "status", status)
			}
			if errors.Is(err, gendurable.ErrUnknownSchedule) {
				h.failTo(w, r, http.StatusNotFound,
					fmt.Sprintf("There is no schedule %q: it was removed, or it never existed. Nothing was changed.", name), back)
				return
			}
			h.failErrTo(w, r, action+" schedule", err, back)
			return
		}
		h.log.InfoContext(r.Context(), "durableui: action", "action", action, "schedule", name, "remote", r.RemoteAddr)
		q.Set("done", action)
		q.Set("schedule", name)
		http.Redirect(w, r, h.prefix+"schedules?"+q.Encode(), http.StatusSeeOther)
	}
}

func (h *handler) pauseSchedule(r *http.Request, name string) (url.Values, error) {
	return url.Values{}, h.client.PauseSchedule(r.Context(), name)
}

func (h *handler) resumeSchedule(r *http.Request, name string) (url.Values, error) {
	return url.Values{}, h.client.ResumeSchedule(r.Context(), name)
}

func (h *handler) triggerSchedule(r *http.Request, name string) (url.Values, error) {
	id, err := h.client.TriggerSchedule(r.Context(), name)
	if err != nil {
		return nil, err
	}
	return url.Values{"instance": {strconv.FormatInt(id, 10)}}, nil
}

func (h *handler) removeSchedule(r *http.Request, name string) (url.Values, error) {
	return url.Values{}, h.client.RemoveSchedule(r.Context(), name)
}
