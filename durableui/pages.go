package durableui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
)

// statuses in the order of an instance's life, for the filters and the tables.
var statuses = []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting, gendurable.StatusAwaiting,
	gendurable.StatusJoining, gendurable.StatusDone, gendurable.StatusFailed, gendurable.StatusCancelled}

// slowStatuses are the ones the queues page counts at most every Options.CountEvery: the parked
// ones (a read of every parked row) and the finished ones.
var slowStatuses = []gendurable.Status{gendurable.StatusAwaiting, gendurable.StatusJoining,
	gendurable.StatusDone, gendurable.StatusFailed, gendurable.StatusCancelled}

// queueRow is one queue on the queues page.
type queueRow struct {
	Queue string
	// From the partial indexes, on every load.
	Available, Runnable, Executing int64
	Lag                            time.Duration
	// From the shared scan (CountedAt), when there is one.
	Counts map[gendurable.Status]int64
	// Finished in the throughput window, per minute.
	DonePerMin, FailedPerMin, CancelledPerMin float64
	// Paused says no node claims the queue's rows (Client.Pause).
	Paused bool
}

type queuesPage struct {
	// Charts are each queue's pictures of the last hour; ChartsTo the end of the throughput
	// charts (the current minute), LagSince when the lag was first sampled.
	Charts             []queueCharts
	ChartsTo, LagSince time.Time
	// Pauses are the paused queues and machines.
	Pauses []gendurable.PauseInfo
	// What the pause or resume that brought the browser here did, if any.
	Done, DoneQueue, DoneMachine string
	Queues                       []queueRow
	Total                        queueRow
	Window                       time.Duration
	Counted                      bool
	CountedAt                    time.Time
	Slow                         []gendurable.Status
}

func (h *handler) queues(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	fast, err := h.client.QueueStats(ctx, &gendurable.QueueStatsOpts{
		Statuses: []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting}})
	if err != nil {
		h.failErr(w, r, "queue stats", err)
		return
	}
	tp, err := h.client.Throughput(ctx, h.opts.ThroughputWindow)
	if err != nil {
		h.failErr(w, r, "throughput", err)
		return
	}
	slow, countedAt, err := h.slowCounts(ctx)
	if err != nil {
		h.failErr(w, r, "queue counts", err)
		return
	}
	rows := map[string]*queueRow{}
	row := func(q string) *queueRow {
		if rows[q] == nil {
			rows[q] = &queueRow{Queue: q}
		}
		return rows[q]
	}
	for _, s := range fast {
		q := row(s.Queue)
		q.Available, q.Runnable, q.Executing, q.Lag = s.Counts[gendurable.StatusAvailable], s.Runnable,
			s.Counts[gendurable.StatusExecuting], s.OldestRunnable
	}
	pauses, err := h.client.Pauses(ctx)
	if err != nil {
		h.failErr(w, r, "pauses", err)
		return
	}
	for _, p := range pauses {
		if p.Kind == "queue" {
			row(p.Name).Paused = true // listed even while it holds no row
		}
	}
	for _, s := range slow {
		row(s.Queue).Counts = s.Counts
	}
	perMin := func(n int64) float64 { return float64(n) / h.opts.ThroughputWindow.Minutes() }
	for _, t := range tp {
		q := row(t.Queue)
		q.DonePerMin, q.FailedPerMin, q.CancelledPerMin = perMin(t.Done), perMin(t.Failed), perMin(t.Cancelled)
	}
	page := queuesPage{Window: h.opts.ThroughputWindow, Counted: !countedAt.IsZero(), CountedAt: countedAt,
		Slow: slowStatuses, Total: queueRow{Counts: map[gendurable.Status]int64{}}, Pauses: pauses}
	if q := r.URL.Query(); q.Get("done") == "pause" || q.Get("done") == "resume" {
		page.Done, page.DoneQueue, page.DoneMachine = q.Get("done"), q.Get("queue"), q.Get("machine")
	}
	for _, q := range rows {
		page.Queues = append(page.Queues, *q)
		t := &page.Total
		t.Available += q.Available
		t.Runnable += q.Runnable
		t.Executing += q.Executing
		t.Lag = max(t.Lag, q.Lag)
		for s, n := range q.Counts {
			t.Counts[s] += n
		}
		t.DonePerMin += q.DonePerMin
		t.FailedPerMin += q.FailedPerMin
		t.CancelledPerMin += q.CancelledPerMin
	}
	slices.SortFunc(page.Queues, func(a, b queueRow) int { return strings.Compare(a.Queue, b.Queue) })
	lags := map[string]time.Duration{}
	for _, q := range page.Queues {
		lags[q.Queue] = q.Lag
	}
	if err := h.hist.refresh(ctx, h.client, lags); err != nil {
		h.failErr(w, r, "charts", err)
		return
	}
	page.Charts, page.ChartsTo, page.LagSince = h.hist.charts()
	h.render(w, r, http.StatusOK, "queues", "Queues", "queues", page)
}

// slowCounts returns the parked and finished counts by queue, counting at most once per
// Options.CountEvery for every viewer together; a zero time when counting is off.
func (h *handler) slowCounts(ctx context.Context) ([]gendurable.QueueStats, time.Time, error) {
	if h.opts.CountEvery < 0 {
		return nil, time.Time{}, nil
	}
	h.countMu.Lock()
	defer h.countMu.Unlock()
	if h.counted.IsZero() || time.Since(h.counted) >= h.opts.CountEvery {
		stats, err := h.client.QueueStats(ctx, &gendurable.QueueStatsOpts{Statuses: slowStatuses})
		if err != nil {
			return nil, time.Time{}, err
		}
		h.counts, h.counted = stats, time.Now().UTC()
	}
	return h.counts, h.counted, nil
}

// filters is the instance list's query, as given (to refill the form) and as parsed.
type filters struct {
	Queue, Machine, Key, Since string
	Status                     map[gendurable.Status]bool
	Limit                      int
	opts                       gendurable.ListOpts
}

type instancesPage struct {
	// The list's status filter and its since bound (RFC 3339, fixed at the first page), for
	// the bulk form.
	BulkStatuses []gendurable.Status
	SinceAt      string
	F            filters
	Statuses     []gendurable.Status
	Instances    []gendurable.InstanceSummary
	Paged        bool   // this is not the first page
	First        string // the first page's URL
	Next         string // the next page's URL, or ""
}

// badFilter is a filter the list cannot use; the message names it.
func badFilter(name, format string, args ...any) error {
	return &formError{http.StatusBadRequest, fmt.Sprintf("The filter %q is not valid: ", name) + fmt.Sprintf(format, args...)}
}

// parseFilters reads the list's query. Relative times ("since=1h") are fixed to an instant
// here, so that every page of one listing has the same bound.
func parseFilters(q url.Values, now time.Time) (filters, error) {
	f := filters{Queue: q.Get("queue"), Machine: q.Get("machine"), Key: q.Get("key"), Since: q.Get("since"),
		Status: map[gendurable.Status]bool{}}
	f.opts = gendurable.ListOpts{Queue: f.Queue, Machine: f.Machine, CorrelationKey: f.Key}
	for _, s := range q["status"] {
		st := gendurable.Status(s)
		if !st.Valid() {
			return f, badFilter("status", "%q is not a status (one of available, executing, awaiting, joining, done, failed, cancelled).", s)
		}
		if !f.Status[st] {
			f.Status[st] = true
			f.opts.Statuses = append(f.opts.Statuses, st)
		}
	}
	if f.Since != "" {
		t, err := parseSince(f.Since, now)
		if err != nil {
			return f, badFilter("since", "%v.", err)
		}
		f.opts.Since = t
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return f, badFilter("before", "%q is not an instance id.", s)
		}
		f.opts.Before = n
	}
	f.Limit = gendurable.DefaultListLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > gendurable.MaxListLimit {
			return f, badFilter("limit", "%q: a page holds 1 to %d instances.", s, gendurable.MaxListLimit)
		}
		f.Limit = n
	}
	f.opts.Limit = f.Limit
	return f, nil
}

// parseSince accepts a duration back from now ("90m", "2h", "3d"), a date ("2025-01-31", UTC),
// a minute ("2025-01-31T14:05", UTC, what a datetime-local field sends) or RFC 3339.
func parseSince(s string, now time.Time) (time.Time, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.AddDate(0, 0, -n), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither a duration back from now (90m, 2h, 3d) nor a time (2025-01-31, 2025-01-31T14:05 in UTC, or RFC 3339)", s)
}

// query is the URL query of the listing f, starting before the id given (0: the first page).
func (f filters) query(before int64) string {
	v := url.Values{}
	for name, val := range map[string]string{"queue": f.Queue, "machine": f.Machine, "key": f.Key} {
		if val != "" {
			v.Set(name, val)
		}
	}
	for _, s := range statuses {
		if f.Status[s] {
			v.Add("status", string(s))
		}
	}
	if !f.opts.Since.IsZero() {
		v.Set("since", f.opts.Since.UTC().Format(time.RFC3339Nano))
	}
	if f.Limit != gendurable.DefaultListLimit {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	if before > 0 {
		v.Set("before", strconv.FormatInt(before, 10))
	}
	return v.Encode()
}

// listFields names List's fields by the query parameters that set them.
var listFields = map[string]string{"Queue": "queue", "Machine": "machine", "CorrelationKey": "key",
	"Statuses": "status", "Since": "since", "Before": "before", "Limit": "limit"}

func (h *handler) instances(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if s := strings.TrimSpace(q.Get("id")); s != "" { // the "go to instance" box
		id, err := strconv.ParseInt(strings.TrimPrefix(s, "#"), 10, 64)
		if err != nil || id <= 0 {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not an instance id: ids are positive whole numbers.", s))
			return
		}
		http.Redirect(w, r, fmt.Sprintf("%sinstances/%d", h.prefix, id), http.StatusSeeOther)
		return
	}
	f, err := parseFilters(q, time.Now())
	if err != nil {
		h.failErr(w, r, "list", err)
		return
	}
	page, err := h.client.List(r.Context(), &f.opts)
	if err != nil {
		if ie, ok := errors.AsType[*gendurable.InputError](err); ok {
			name := listFields[ie.Field]
			if name == "" {
				name = ie.Field
			}
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("The filter %q is not valid: %s.", name, ie.Reason))
			return
		}
		h.failErr(w, r, "list", err)
		return
	}
	p := instancesPage{F: f, Statuses: statuses, Instances: page.Instances, Paged: f.opts.Before > 0,
		First: h.prefix + "instances?" + f.query(0), BulkStatuses: f.opts.Statuses}
	if !f.opts.Since.IsZero() {
		p.SinceAt = f.opts.Since.UTC().Format(time.RFC3339Nano)
	}
	if page.Next > 0 {
		p.Next = h.prefix + "instances?" + f.query(page.Next)
	}
	h.render(w, r, http.StatusOK, "instances", "Instances", "instances", p)
}

// pathID reads the instance id of the path; a path whose id cannot be one gets the 404 page.
func (h *handler) pathID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("There is no instance %q: ids are positive whole numbers.", s))
		return 0, false
	}
	return id, true
}

type instancePage struct {
	D *gendurable.InstanceDetail
	// Why says why a live instance is not running now (Client.Explain); nil once it finished.
	Why *gendurable.Explanation
	// Path is the steps taken, then the current one unless the instance finished there.
	Path    []pathStep
	Errors  []gendurable.ErrorEntry // newest first
	Live    bool
	Parked  bool // awaiting a signal
	Retry   bool // failed or cancelled
	Steps   []string
	Done    string // the action that brought the browser here, if any
	Woke    bool
	Signal  string
	Inbox   string // the URL of the inbox's next page, or ""
	Kids    string // the URL of the children's next page, or ""
	Counts  []statusCount
	Signals int64
}

type pathStep struct {
	Step    string
	Current bool
}

type statusCount struct {
	Status gendurable.Status
	N      int64
}

func (h *handler) instance(w http.ResponseWriter, r *http.Request) {
	id, ok := h.pathID(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var opts gendurable.InspectOpts
	for _, p := range []struct {
		name string
		dst  *int64
	}{{"inbox_after", &opts.InboxAfter}, {"children_after", &opts.ChildrenAfter}} {
		if s := q.Get(p.name); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%s=%q: a cursor is an id, a whole number of at least 0.", p.name, s))
				return
			}
			*p.dst = n
		}
	}
	d, err := h.client.Inspect(r.Context(), id, &opts)
	if err != nil {
		if errors.Is(err, gendurable.ErrNotFound) {
			h.fail(w, r, http.StatusNotFound, fmt.Sprintf("There is no instance %d: it never existed, or it finished and GC removed it.", id))
			return
		}
		h.failErr(w, r, "inspect", err)
		return
	}
	in := &d.Instance
	p := instancePage{D: d, Live: !in.Status.Terminal(), Parked: in.Status == gendurable.StatusAwaiting,
		Retry: in.Status == gendurable.StatusFailed || in.Status == gendurable.StatusCancelled}
	if p.Live {
		if p.Why, err = h.client.Explain(r.Context(), id); err != nil {
			h.failErr(w, r, "explain", err)
			return
		}
	}
	for _, s := range in.Path {
		p.Path = append(p.Path, pathStep{Step: s})
	}
	if p.Live || len(in.Path) == 0 || in.Path[len(in.Path)-1] != in.Step {
		p.Path = append(p.Path, pathStep{Step: in.Step, Current: true})
	}
	for _, s := range p.Path {
		if !slices.Contains(p.Steps, s.Step) {
			p.Steps = append(p.Steps, s.Step)
		}
	}
	p.Errors = slices.Clone(in.Errors)
	slices.Reverse(p.Errors)
	for _, s := range statuses {
		if n := d.ChildCounts[s]; n > 0 {
			p.Counts = append(p.Counts, statusCount{s, n})
		}
	}
	base := fmt.Sprintf("%sinstances/%d", h.prefix, id)
	if len(d.Inbox) == gendurable.DefaultInspectLimit {
		p.Inbox = fmt.Sprintf("%s?inbox_after=%d", base, d.Inbox[len(d.Inbox)-1].ID)
	}
	if len(d.Children) == gendurable.DefaultInspectLimit {
		p.Kids = fmt.Sprintf("%s?children_after=%d", base, d.Children[len(d.Children)-1].ID)
	}
	if done := q.Get("done"); done == "signal" || done == "retry" || done == "cancel" || done == "pause" || done == "resume" {
		p.Done, p.Woke = done, q.Get("woke") == "1"
		if n, err := strconv.ParseInt(q.Get("signal"), 10, 64); err == nil && n > 0 {
			p.Signal = strconv.FormatInt(n, 10)
		}
	}
	h.render(w, r, http.StatusOK, "instance", fmt.Sprintf("Instance %d", id), "instances", p)
}

type stuckPage struct {
	Groups []gendurable.StuckGroup
	// Findings are the database checkup's (Client.Checkup), problems first.
	Findings []gendurable.Finding
}

func (h *handler) stuck(w http.ResponseWriter, r *http.Request) {
	groups, err := h.client.Stuck(r.Context())
	if err != nil {
		h.failErr(w, r, "stuck", err)
		return
	}
	findings, err := h.client.Checkup(r.Context(), nil)
	if err != nil {
		h.failErr(w, r, "stuck", err)
		return
	}
	h.render(w, r, http.StatusOK, "stuck", "Stuck instances", "stuck", stuckPage{Groups: groups, Findings: findings})
}
