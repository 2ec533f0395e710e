package durableui

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
)

// bulkPage is the bulk action's confirmation (Result nil) or its outcome.
type bulkPage struct {
	Action gendurable.BulkAction
	// Fields are the form's filter fields, carried from the preview to the confirmation.
	Fields url.Values
	// Filter describes the filter for a person, one clause per entry.
	Filter  []string
	All     bool // the filter matches every instance
	Matched int64
	Result  *gendurable.BulkResult
	Back    string // the instance list the action started from
}

// bulkFields are the form fields that make a bulk action's filter.
var bulkFields = []string{"queue", "machine", "step", "status", "error", "since", "until", "key_prefix", "all"}

// bulk previews (the count, and a confirmation form stating it) or, with confirm=1, applies a
// bulk action to the instances its form's filter matches.
func (h *handler) bulk(w http.ResponseWriter, r *http.Request) {
	back := backLink{h.prefix + "instances", "Back to the instances"}
	if !h.guard(w, r, "bulk", back) {
		return
	}
	form := r.PostForm
	action := gendurable.BulkAction(form.Get("action"))
	f := gendurable.BulkFilter{Queue: strings.TrimSpace(form.Get("queue")), Machine: strings.TrimSpace(form.Get("machine")),
		Step: strings.TrimSpace(form.Get("step")), ErrorContains: strings.TrimSpace(form.Get("error")),
		KeyPrefix: strings.TrimSpace(form.Get("key_prefix")), All: form.Get("all") == "1"}
	for _, s := range form["status"] {
		f.Statuses = append(f.Statuses, gendurable.Status(s))
	}
	for _, t := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if s := strings.TrimSpace(form.Get(t.name)); s != "" {
			at, err := parseSince(s, time.Now())
			if err != nil {
				h.failTo(w, r, http.StatusBadRequest, fmt.Sprintf("The filter %q is not valid: %v. Nothing was changed.", t.name, err), back)
				return
			}
			*t.dst = at
		}
	}
	reason := strings.TrimSpace(form.Get("reason"))
	if utf8.RuneCountInString(reason) > maxReason {
		h.failTo(w, r, http.StatusBadRequest, fmt.Sprintf("The reason is too long: at most %d characters.", maxReason), back)
		return
	}
	p := bulkPage{Action: action, Fields: url.Values{}, Back: h.prefix + "instances?" + filterQuery(&f)}
	for _, name := range bulkFields {
		if v, ok := form[name]; ok {
			p.Fields[name] = v
		}
	}
	if reason != "" {
		p.Fields.Set("reason", reason)
	}
	p.Filter, p.All = describeFilter(&f), f.MatchesEverything()
	opts := &gendurable.BulkOpts{DryRun: form.Get("confirm") != "1", Reason: reason}
	if reason == "" {
		opts.Reason = "cancelled in bulk from the dashboard"
	}
	if p.All && !f.All {
		// The preview of a filter that matches everything: counted with All, confirmed only with
		// the confirmation's explicit checkbox.
		f.All = opts.DryRun
	}
	res, err := h.client.Bulk(r.Context(), action, f, opts)
	if err != nil {
		if res != nil && !opts.DryRun {
			err = fmt.Errorf("%w; %d instances were changed before it, in batches that are kept, and the rest are untouched", err, res.Changed)
		}
		h.failErrTo(w, r, "bulk "+string(action), err, back)
		return
	}
	p.Matched = res.Matched
	if !opts.DryRun {
		p.Result = res
		h.log.InfoContext(r.Context(), "durableui: action", "action", "bulk "+string(action), "changed", res.Changed,
			"skipped", res.Skipped, "remote", r.RemoteAddr)
	}
	h.render(w, r, http.StatusOK, "bulk", "Bulk "+string(action), "instances", p)
}

// describeFilter says what a bulk filter matches, a clause per entry.
func describeFilter(f *gendurable.BulkFilter) []string {
	var out []string
	add := func(format string, v any) { out = append(out, fmt.Sprintf(format, v)) }
	if f.Queue != "" {
		add("queue %s", f.Queue)
	}
	if f.Machine != "" {
		add("machine %s", f.Machine)
	}
	if f.Step != "" {
		add("at step %s", f.Step)
	}
	if len(f.Statuses) > 0 {
		st := make([]string, len(f.Statuses))
		for i, s := range f.Statuses {
			st[i] = string(s)
		}
		add("status %s", strings.Join(st, " or "))
	}
	if f.ErrorContains != "" {
		add("last error containing %q", f.ErrorContains)
	}
	if !f.Since.IsZero() {
		add("inserted since %s", formatTime(f.Since))
	}
	if !f.Until.IsZero() {
		add("inserted before %s", formatTime(f.Until))
	}
	if f.KeyPrefix != "" {
		add("correlation key beginning with %q", f.KeyPrefix)
	}
	return out
}

// filterQuery is the instance list's query for a bulk filter's fields that the list has.
func filterQuery(f *gendurable.BulkFilter) string {
	v := url.Values{}
	if f.Queue != "" {
		v.Set("queue", f.Queue)
	}
	if f.Machine != "" {
		v.Set("machine", f.Machine)
	}
	for _, s := range f.Statuses {
		v.Add("status", string(s))
	}
	if !f.Since.IsZero() {
		v.Set("since", f.Since.UTC().Format(time.RFC3339))
	}
	return v.Encode()
}
