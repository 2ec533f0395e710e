// Package e2e drives the dashboard (durableui) in a headless Chromium, against a real Postgres.
// It is its own module so that the browser driver stays out of the core module's dependencies.
package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durableui"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// chromium is the browser binary, found (or installed) once by TestMain.
var chromium string

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	p, err := chromiumPath(ctx, os.Stderr)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	chromium = p
	durabledbtest.Main(m)
}

// checkout is the machine the pages show: it reserves, charges, parks for a shipping
// confirmation, then fans out one notification per channel.
type checkout struct {
	Order string `json:"order"`
	Items int    `json:"items"`
	Total string `json:"total"`
}

var checkoutFSM = gendurable.FSM[checkout]{
	Name: "checkout", Start: "reserve", Queue: "default",
	Steps: map[string]gendurable.StepFunc[checkout]{
		"reserve": func(ctx *gendurable.Ctx, c checkout) (gendurable.Outcome, error) {
			return gendurable.Next("charge", c), nil
		},
		"charge": func(ctx *gendurable.Ctx, c checkout) (gendurable.Outcome, error) {
			return gendurable.Next("ship", c), nil
		},
		"ship": func(ctx *gendurable.Ctx, c checkout) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"shipped"}, "notify", c), nil
		},
		"notify": func(ctx *gendurable.Ctx, c checkout) (gendurable.Outcome, error) { return gendurable.Done(c), nil },
	},
}

var emailJob = gendurable.Job[struct {
	To string `json:"to"`
}]{Name: "email", Queue: "mail", Perform: func(*gendurable.Ctx, struct {
	To string `json:"to"`
}) error {
	return nil
}}

// site is a dashboard over a schema of its own, with rows in every status. The client is not
// started: rows stay where the test puts them.
type site struct {
	pool   *pgxpool.Pool
	schema string
	client *gendurable.Client
	url    string
	// ids of the instances the pages are about: a parked checkout with children and an inbox,
	// a failed one, and every parked one.
	parked, failed int64
	awaiting       []int64
	failedIDs      []int64 // the six failed checkouts
	// fired is the instance the "nightly-reconcile" schedule fired.
	fired int64
}

func (s *site) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := s.pool.Exec(context.Background(), strings.ReplaceAll(q, "{schema}", `"`+s.schema+`"`), args...)
	require.NoError(t, err)
}

// newSite is the site with the dashboard's default options; opts, if given, change them.
func newSite(t *testing.T, opts ...func(*durableui.Options)) *site {
	t.Helper()
	pool := durabledbtest.Pool(t, 8)
	s := &site{pool: pool, schema: durabledbtest.Schema(t, pool)}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: s.schema,
		Machines: []gendurable.Machine{checkoutFSM, emailJob}})
	require.NoError(t, err)
	s.client = cl
	ctx := context.Background()

	var params []gendurable.InsertManyParams
	for i := range 60 {
		params = append(params, gendurable.InsertManyParams{Input: checkoutFSM.With(checkout{
			Order: fmt.Sprintf("A-%04d", 1000+i), Items: 1 + i%4, Total: fmt.Sprintf("%d.%02d", 10+i*3, i%100)}),
			Opts: &gendurable.InsertOpts{CorrelationKey: fmt.Sprintf("order-%d", 1000+i)}})
	}
	for i := range 25 {
		params = append(params, gendurable.InsertManyParams{Input: emailJob.With(struct {
			To string `json:"to"`
		}{fmt.Sprintf("customer%d@example.com", i)})})
	}
	params = append(params, gendurable.InsertManyParams{Input: checkoutFSM.With(checkout{Order: "B-1", Items: 1, Total: "9.99"}),
		Opts: &gendurable.InsertOpts{Queue: "payments", RateLimit: "psp"}})
	res, err := cl.InsertMany(ctx, params)
	require.NoError(t, err)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	checkouts, emails := ids[:60], ids[60:85]
	// Checkouts: 30 done (in the last minute, for the throughput), 6 failed, 4 cancelled, 5
	// awaiting their shipping, 3 executing, the rest available (2 of them waiting for an hour).
	s.exec(t, `UPDATE {schema}.instances SET status = 'done', step = 'notify', path = '{reserve,charge,ship,notify}',
	             result = state, finalized_at = now() - (id % 50) * interval '1 second' WHERE id = ANY($1)`, checkouts[:30])
	s.exec(t, `UPDATE {schema}.instances SET status = 'failed', step = 'charge', path = '{reserve}', attempt = 3, max_attempts = 3,
	             finalized_at = now() - interval '20 seconds',
	             errors = jsonb_build_array(
	               jsonb_build_object('at', now() - interval '3 minutes', 'step', 'charge', 'attempt', 1, 'kind', 'error', 'error', 'psp: card declined (insufficient funds)'),
	               jsonb_build_object('at', now() - interval '2 minutes', 'step', 'charge', 'attempt', 2, 'kind', 'error', 'error', 'psp: card declined (insufficient funds)'),
	               jsonb_build_object('at', now() - interval '20 seconds', 'step', 'charge', 'attempt', 3, 'kind', 'error', 'error', 'psp: card declined (insufficient funds)'))
	           WHERE id = ANY($1)`, checkouts[30:36])
	s.exec(t, `UPDATE {schema}.instances SET status = 'cancelled', finalized_at = now() - interval '5 minutes',
	             errors = jsonb_build_array(jsonb_build_object('at', now() - interval '5 minutes', 'step', 'reserve', 'attempt', 0,
	               'kind', 'cancel', 'error', 'customer asked to cancel'))
	           WHERE id = ANY($1)`, checkouts[36:40])
	s.exec(t, `UPDATE {schema}.instances SET status = 'awaiting', step = 'notify', path = '{reserve,charge,ship}',
	             await_names = '{shipped}', await_deadline = now() + interval '2 days' WHERE id = ANY($1)`, checkouts[40:45])
	s.exec(t, `UPDATE {schema}.instances SET status = 'executing', step = 'charge', path = '{reserve}', attempt = 1,
	             locked_by = 'web-1:default#17', locked_until = now() + interval '30 seconds' WHERE id = ANY($1)`, checkouts[45:48])
	s.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() - interval '95 seconds' WHERE id = ANY($1)`, checkouts[48:50])
	// Emails: 15 done, 1 failed, the rest available; the first 3 are children of a parked
	// checkout.
	s.exec(t, `UPDATE {schema}.instances SET status = 'done', finalized_at = now() - (id % 40) * interval '1 second', result = '{}'
	           WHERE id = ANY($1)`, emails[:15])
	s.exec(t, `UPDATE {schema}.instances SET status = 'failed', finalized_at = now(), attempt = 20,
	             errors = jsonb_build_array(jsonb_build_object('at', now(), 'step', 'perform', 'attempt', 20, 'kind', 'error',
	               'error', 'smtp: 550 mailbox unavailable'))
	           WHERE id = $1`, emails[15])
	s.parked, s.failed, s.awaiting, s.failedIDs = checkouts[40], checkouts[30], checkouts[40:45], checkouts[30:36]
	s.exec(t, `UPDATE {schema}.instances SET parent_id = $2, parent_wave = 1 WHERE id = ANY($1)`, emails[:3], s.parked)
	_, err = cl.Signal(ctx, gendurable.ByID(s.parked), "address-changed", map[string]string{"city": "Lyon", "zip": "69002"})
	require.NoError(t, err)

	// Schedules: a cron one with a fire, a skip and an error behind it, an interval one that is
	// paused, and one a service declares.
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "nightly-reconcile",
		Input: checkoutFSM.With(checkout{Order: "reconcile"}), Cron: "0 3 * * *", TimeZone: "Europe/Paris", CatchUp: 6 * time.Hour}))
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "digest-email", Input: emailJob.With(struct {
		To string `json:"to"`
	}{"ops@example.com"}), Every: 15 * time.Minute, Overlap: gendurable.OverlapAllow, Jitter: 30 * time.Second}))
	require.NoError(t, cl.SetSchedule(ctx, gendurable.Schedule{Name: "hourly-sweep", Input: checkoutFSM.With(checkout{Order: "sweep"}),
		Cron: "@hourly", Overlap: gendurable.OverlapCancel}))
	s.fired, err = cl.TriggerSchedule(ctx, "nightly-reconcile")
	require.NoError(t, err)
	s.exec(t, `UPDATE {schema}.schedules SET fired = 212, skipped = 2,
	             last_skip = jsonb_build_object('reason', 'overlap', 'count', 2, 'first', now() - interval '2 days', 'last', now() - interval '1 day', 'at', now() - interval '1 day')
	           WHERE name = 'nightly-reconcile'`)
	s.exec(t, `UPDATE {schema}.schedules SET declared_by = 'billing', fired = 1440,
	             last_error = 'insert the fired instances: rate limit "psp" is not configured', last_error_at = now() - interval '4 minutes'
	           WHERE name = 'hourly-sweep'`)
	require.NoError(t, cl.PauseSchedule(ctx, "digest-email"))

	o := &durableui.Options{Refresh: -1}
	for _, f := range opts {
		f(o)
	}
	h, err := durableui.New(cl, o)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *site) status(t *testing.T, id int64) *gendurable.Instance {
	t.Helper()
	in, err := s.client.Get(context.Background(), id)
	require.NoError(t, err)
	return in
}

func TestPagesLoad(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	for _, p := range []struct {
		path, name, heading string
		status              int
	}{
		{"/", "dashboard-queues", "Queues", http.StatusOK},
		{"/instances?limit=20", "dashboard-instances", "Instances", http.StatusOK},
		{fmt.Sprintf("/instances/%d", s.parked), "dashboard-instance", fmt.Sprintf("Instance %d", s.parked), http.StatusOK},
		{fmt.Sprintf("/instances/%d", s.failed), "dashboard-instance-failed", fmt.Sprintf("Instance %d", s.failed), http.StatusOK},
		{"/stuck", "dashboard-stuck", "Stuck instances", http.StatusOK},
		{"/schedules", "dashboard-schedules", "Schedules", http.StatusOK},
		{"/machines", "dashboard-machines", "Machines", http.StatusOK},
		{"/machines/checkout", "dashboard-machine", "Machine checkout", http.StatusOK},
		{"/machines/nosuch", "dashboard-machine-unknown", "404 Not Found", http.StatusNotFound},
		{"/instances/999999999", "dashboard-not-found", "404 Not Found", http.StatusNotFound},
	} {
		resp := get(t, ctx, chromedp.NavigateResponse(s.url+p.path))
		require.Equal(t, p.status, int(resp.Status), p.path)
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS("h1")), shoot(t, p.name))
		h1 := get(t, ctx, chromedp.Text(chromedp.CSS("h1")))
		require.True(t, strings.HasPrefix(strings.TrimSpace(h1), p.heading), "%s: %q", p.path, h1)
	}
	// The stylesheet applied (it is the page's only source of colour): the header is dark.
	bg := get(t, ctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector("header.top")).backgroundColor`))
	require.Equal(t, "rgb(19, 26, 42)", bg)
}

func TestFilterTheList(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	do(t, ctx,
		chromedp.Navigate(s.url+"/instances"),
		chromedp.WaitVisible(chromedp.CSS("form.filters")),
		chromedp.SendKeys(chromedp.CSS(`form.filters input[name="machine"]`), "checkout"),
		chromedp.Click(chromedp.CSS(`form.filters input[value="failed"]`)),
	)
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`), chromedp.NodeVisible)))
	loc := get(t, ctx, chromedp.Location())
	require.Contains(t, loc, "machine=checkout")
	require.Contains(t, loc, "status=failed")
	statuses := get(t, ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("table.instances tbody td:nth-child(5)")].map(e => e.textContent.trim())`))
	require.Len(t, statuses, 6)
	for _, st := range statuses {
		require.Equal(t, "failed", st)
	}
	do(t, ctx, shoot(t, "dashboard-instances-filtered"))

	// A malformed filter: 400 and a message naming it.
	resp := get(t, ctx, chromedp.NavigateResponse(s.url+"/instances?since=last+tuesday"))
	require.Equal(t, http.StatusBadRequest, int(resp.Status))
	msg := get(t, ctx, chromedp.Text(chromedp.CSS(".message")))
	require.Contains(t, msg, `The filter "since" is not valid`)
}

func TestOpenAnInstanceAndCancelIt(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	// The cancel form asks for a confirmation (ui.js): accept it, and note that it was asked.
	asked := acceptDialogs(t, ctx)
	victim := slices.Max(s.awaiting)
	do(t, ctx,
		chromedp.Navigate(s.url+"/instances?status=awaiting"),
		chromedp.WaitVisible(chromedp.CSS("table.instances")),
	)
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`table.instances a[href="/instances/%d"]`, victim)))))
	h1 := get(t, ctx, chromedp.Text(chromedp.CSS("h1")))
	require.Contains(t, h1, fmt.Sprintf("Instance %d", victim))
	// Why it is not running: it waits for its signal, until its timeout.
	require.Equal(t, "awaiting", get(t, ctx, chromedp.AttributeValue(chromedp.CSS("#why"), "data-reason")).Value)
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("#why"))), `It waits for a signal named "shipped", or its timeout at`)
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(`#cancel-form input[name="reason"]`), "duplicate order"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`#cancel-form button[type="submit"]`))),
		"the redirect after the POST lands on the instance")
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(".flash")), shoot(t, "dashboard-cancelled"))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(".flash"))), "Cancelled.")
	asked("never run again")
	in := s.status(t, victim)
	require.Equal(t, gendurable.StatusCancelled, in.Status)
	require.NotNil(t, in.FinalizedAt)
	require.Equal(t, "duplicate order", in.Errors[len(in.Errors)-1].Error)
	require.Equal(t, "cancel", in.Errors[len(in.Errors)-1].Kind)
	gone := get(t, ctx, chromedp.Evaluate[bool](`document.querySelector("#why") === null`))
	require.True(t, gone, "a finished instance has nothing to explain")
}

func TestForgedPostsAreRefused(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	target := fmt.Sprintf("%s/instances/%d/cancel", s.url, s.parked)
	// Another site (another origin: localhost, not 127.0.0.1) with a button that posts a cancel
	// form to the dashboard.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>Win a prize</title>
<form id="f" method="post" action="%s"><input type="hidden" name="reason" value="forged"><button>Claim your prize</button></form>`, target)
	}))
	t.Cleanup(evil.Close)
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)

	// A visit to the dashboard first, so that the browser holds its session cookie.
	do(t, ctx,
		chromedp.Navigate(fmt.Sprintf("%s/instances/%d", s.url, s.parked)),
		chromedp.WaitVisible(chromedp.CSS("#cancel-form")),
		chromedp.Navigate(evilURL),
		chromedp.WaitVisible(chromedp.CSS("#f button")),
	)
	require.Equal(t, http.StatusForbidden, load(t, ctx, chromedp.Click(chromedp.CSS("#f button"))))
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(".message")), shoot(t, "dashboard-forged"))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(".message"))), "another site")
	require.Equal(t, gendurable.StatusAwaiting, s.status(t, s.parked).Status)

	// A form built on the dashboard's own origin (an injected script, say) without the CSRF
	// token: same origin, session cookie sent, and still refused.
	do(t, ctx,
		chromedp.Navigate(fmt.Sprintf("%s/instances/%d", s.url, s.parked)),
		chromedp.WaitVisible(chromedp.CSS("#cancel-form")),
	)
	require.Equal(t, http.StatusForbidden, load(t, ctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const f = document.createElement("form");
		f.method = "post";
		f.action = %q;
		const reason = document.createElement("input");
		reason.name = "reason";
		reason.value = "forged";
		f.appendChild(reason);
		document.body.appendChild(f);
		f.submit();
	})()`, target))))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(".message"))), "CSRF token")
	in := s.status(t, s.parked)
	require.Equal(t, gendurable.StatusAwaiting, in.Status)
	require.Empty(t, in.Errors)
}

func TestPauseTriggerAndRemoveASchedule(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	// Trigger and remove ask for a confirmation (ui.js): accept it, and note what was asked.
	asked := acceptDialogs(t, ctx)
	schedule := func(name string) *gendurable.ScheduleInfo {
		t.Helper()
		info, err := s.client.GetSchedule(context.Background(), name)
		require.NoError(t, err)
		return info
	}
	button := func(name, action string) chromedp.Action[chromedp.Void] {
		return chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-schedule=%q] form[data-action=%q] button`, name, action)))
	}
	flash := func() string {
		t.Helper()
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(".flash")))
		return get(t, ctx, chromedp.Text(chromedp.CSS(".flash")))
	}

	do(t, ctx, chromedp.Navigate(s.url+"/"), chromedp.WaitVisible(chromedp.CSS("header.top nav")))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`header.top nav a[href="/schedules"]`))))
	require.Equal(t, "Schedules", strings.TrimSpace(get(t, ctx, chromedp.Text(chromedp.CSS("h1")))))
	rows := get(t, ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("table.schedules tbody tr")].map(e => e.dataset.schedule)`))
	require.Equal(t, []string{"digest-email", "hourly-sweep", "nightly-reconcile"}, rows)
	last := get(t, ctx, chromedp.Text(chromedp.CSS(`tr[data-schedule="nightly-reconcile"] td.last`)))
	require.Contains(t, last, fmt.Sprintf("instance %d", s.fired))
	require.Contains(t, last, "available")

	// Pause, then resume.
	require.Equal(t, http.StatusOK, load(t, ctx, button("nightly-reconcile", "pause")))
	require.Contains(t, flash(), "Schedule nightly-reconcile paused")
	require.True(t, schedule("nightly-reconcile").Paused)
	require.Equal(t, http.StatusOK, load(t, ctx, button("nightly-reconcile", "resume")))
	require.Contains(t, flash(), "Schedule nightly-reconcile resumed: it fires next at")
	require.False(t, schedule("nightly-reconcile").Paused)

	// Trigger: confirmed, an instance inserted, the message links it.
	require.Equal(t, http.StatusOK, load(t, ctx, button("nightly-reconcile", "trigger")))
	asked("Fire schedule nightly-reconcile now?")
	info := schedule("nightly-reconcile")
	require.NotNil(t, info.LastInstanceID)
	fired := *info.LastInstanceID
	require.NotEqual(t, s.fired, fired)
	require.Contains(t, flash(), fmt.Sprintf("Schedule nightly-reconcile fired: instance %d.", fired))
	do(t, ctx, shoot(t, "dashboard-schedules-triggered"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(".flash a"))))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("h1"))), fmt.Sprintf("Instance %d", fired))
	require.Equal(t, gendurable.StatusAvailable, s.status(t, fired).Status)

	// Remove a schedule a service declares: the confirmation says it comes back.
	do(t, ctx, chromedp.Navigate(s.url+"/schedules"), chromedp.WaitVisible(chromedp.CSS("table.schedules")))
	require.Equal(t, http.StatusOK, load(t, ctx, button("hourly-sweep", "remove")))
	asked("Service billing declares it")
	require.Contains(t, flash(), "Schedule hourly-sweep removed.")
	gone := get(t, ctx, chromedp.Evaluate[bool](`document.querySelector('tr[data-schedule="hourly-sweep"]') === null`))
	require.True(t, gone)
	_, err := s.client.GetSchedule(context.Background(), "hourly-sweep")
	require.ErrorIs(t, err, gendurable.ErrUnknownSchedule)

	// A stale page: its schedule removed behind its back (by another operator), then a form of
	// it sent: 404, a message naming it, a link back.
	require.NoError(t, s.client.RemoveSchedule(context.Background(), "digest-email"))
	require.Equal(t, http.StatusNotFound, load(t, ctx, button("digest-email", "resume")))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(".message"))), `There is no schedule "digest-email"`)
	do(t, ctx, shoot(t, "dashboard-schedules-unknown"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`main a[href="/schedules"]`))))
	require.Equal(t, "Schedules", strings.TrimSpace(get(t, ctx, chromedp.Text(chromedp.CSS("h1")))))
}

func TestPauseAndResumeAQueueAMachineAndAnInstance(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	asked := acceptDialogs(t, ctx) // pausing asks for a confirmation (ui.js)
	flash := func() string {
		t.Helper()
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(".flash")))
		return get(t, ctx, chromedp.Text(chromedp.CSS(".flash")))
	}
	pauses := func() []string {
		t.Helper()
		list, err := s.client.Pauses(context.Background())
		require.NoError(t, err)
		var out []string
		for _, p := range list {
			out = append(out, p.Kind+":"+p.Name)
		}
		return out
	}

	// A queue: confirmed, stored, shown paused with a Resume button.
	do(t, ctx, chromedp.Navigate(s.url+"/"), chromedp.WaitVisible(chromedp.CSS("table.queues")))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`tr:has(td[data-queue="mail"]) form[data-action="pause"] button`))))
	asked("Pause queue mail?")
	require.Contains(t, flash(), "Queue mail paused")
	require.Equal(t, []string{"queue:mail"}, pauses())
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(`td[data-queue="mail"]`))), "paused")

	// A machine, by name; then one nobody knows: refused, named, nothing changed.
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(`form.pause-machine input[name="machine"]`), "checkout"),
		chromedp.SendKeys(chromedp.CSS(`form.pause-machine input[name="reason"]`), "psp outage"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`form.pause-machine button`))))
	require.Contains(t, flash(), "Machine checkout paused")
	require.Equal(t, []string{"machine:checkout", "queue:mail"}, pauses())
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(`li[data-paused="machine:checkout"]`))), "psp outage")
	do(t, ctx, shoot(t, "dashboard-queues-paused"))
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(`form.pause-machine input[name="machine"]`), "nosuch"))
	require.Equal(t, http.StatusNotFound, load(t, ctx, chromedp.Click(chromedp.CSS(`form.pause-machine button`))))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(".message"))), `There is no machine "nosuch"`)
	do(t, ctx, shoot(t, "dashboard-pause-unknown-machine"))
	require.Equal(t, []string{"machine:checkout", "queue:mail"}, pauses())

	// Both resumed from the list of pauses.
	do(t, ctx, chromedp.Navigate(s.url+"/"), chromedp.WaitVisible(chromedp.CSS("section.pauses")))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`li[data-paused="machine:checkout"] button`))))
	require.Contains(t, flash(), "Machine checkout resumed")
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`li[data-paused="queue:mail"] button`))))
	require.Contains(t, flash(), "Queue mail resumed")
	require.Empty(t, pauses())
	gone := get(t, ctx, chromedp.Evaluate[bool](`document.querySelector("section.pauses") === null`))
	require.True(t, gone)

	// One instance: paused (confirmed), shown, resumed.
	id := s.awaiting[1]
	do(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/instances/%d", s.url, id)), chromedp.WaitVisible(chromedp.CSS("#pause-form")))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS("#pause-form button"))))
	asked(fmt.Sprintf("Pause instance %d?", id))
	require.Contains(t, flash(), "Paused")
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("#paused"))), "since")
	d, err := s.client.Inspect(context.Background(), id, nil)
	require.NoError(t, err)
	require.NotNil(t, d.PausedAt)
	do(t, ctx, shoot(t, "dashboard-instance-paused"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS("#resume-form button"))))
	require.Contains(t, flash(), "Resumed")
	d, err = s.client.Inspect(context.Background(), id, nil)
	require.NoError(t, err)
	require.Nil(t, d.PausedAt)
}

func TestBulkRetryWithItsConfirmationAndARefusedBulkAction(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, s.pool.QueryRow(context.Background(), strings.ReplaceAll(q, "{schema}", `"`+s.schema+`"`), args...).Scan(&n))
		return n
	}
	// The failed checkouts, filtered in the list; the bulk form carries the filter.
	do(t, ctx, chromedp.Navigate(s.url+"/instances?machine=checkout&status=failed"), chromedp.WaitVisible(chromedp.CSS("table.instances")),
		chromedp.Click(chromedp.CSS("details.bulk summary")), chromedp.WaitVisible(chromedp.CSS("#bulk-form")),
		chromedp.SetValue(chromedp.CSS(`#bulk-form select[name="action"]`), "retry"),
		chromedp.SendKeys(chromedp.CSS(`#bulk-form input[name="error"]`), "INSUFFICIENT funds"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS("#bulk-form button"))))
	// The confirmation states the count; nothing has changed yet.
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("#bulk-count"))), "This will retry 6 instances")
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("p.sub"))), `last error containing "INSUFFICIENT funds"`)
	require.Equal(t, 6, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'failed' AND machine = 'checkout'`))
	do(t, ctx, shoot(t, "dashboard-bulk-confirm"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS("#bulk-confirm button"))))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("#bulk-result"))), "retry: 6 instances changed, 0 skipped")
	require.Zero(t, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'failed' AND machine = 'checkout'`))
	require.Equal(t, 6, count(`SELECT count(*) FROM {schema}.instances WHERE id = ANY($1) AND status = 'available'`, s.failedIDs))

	// Refused: a retry of awaiting instances (a retry applies to failed and cancelled ones only).
	do(t, ctx, chromedp.Navigate(s.url+"/instances?status=awaiting"), chromedp.WaitVisible(chromedp.CSS("table.instances")),
		chromedp.Click(chromedp.CSS("details.bulk summary")), chromedp.WaitVisible(chromedp.CSS("#bulk-form")),
		chromedp.SetValue(chromedp.CSS(`#bulk-form select[name="action"]`), "retry"))
	require.Equal(t, http.StatusBadRequest, load(t, ctx, chromedp.Click(chromedp.CSS("#bulk-form button"))))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(".message"))), "retry applies to")
	do(t, ctx, shoot(t, "dashboard-bulk-refused"))
	require.Equal(t, 5, count(`SELECT count(*) FROM {schema}.instances WHERE status = 'awaiting'`))

	// A filter that matches everything: the confirmation asks for an explicit checkbox.
	do(t, ctx, chromedp.Navigate(s.url+"/instances"), chromedp.WaitVisible(chromedp.CSS("table.instances")),
		chromedp.Click(chromedp.CSS("details.bulk summary")), chromedp.WaitVisible(chromedp.CSS("#bulk-form")),
		chromedp.SetValue(chromedp.CSS(`#bulk-form select[name="action"]`), "cancel"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS("#bulk-form button"))))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("p.sub"))), "it matches every instance")
	required := get(t, ctx, chromedp.Evaluate[bool](`document.querySelector('#bulk-confirm input[name="all"]').required`))
	require.True(t, required)
	live := count(`SELECT count(*) FROM {schema}.instances WHERE status IN ('available', 'executing', 'awaiting', 'joining')`)
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("#bulk-count"))), fmt.Sprintf("This will cancel %d instances", live))
}

func TestMachineGraphAndQueueCharts(t *testing.T) {
	s := newSite(t)
	ctx := newBrowser(t)
	// The machine's page: a box per step with its live instances, an arrow per transition.
	do(t, ctx, chromedp.Navigate(s.url+"/machines"), chromedp.WaitVisible(chromedp.CSS("ul.machines")))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`ul.machines a[href="/machines/checkout"]`))))
	steps := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("svg.graph g.step")].map(e => e.dataset.step)`))
	require.Equal(t, []string{"reserve", "charge", "ship", "notify"}, steps)
	// 30 done paths and 5 parked ones went reserve → charge → ship; the 5 parked wait at notify.
	text := func(sel string) string { // SVG elements have no innerText: their textContent
		return strings.TrimSpace(get(t, ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel))))
	}
	edge := func(from, to string) string {
		return text(fmt.Sprintf(`svg.graph g.edge[data-from=%q][data-to=%q] text`, from, to))
	}
	require.Equal(t, "35", edge("charge", "ship"))
	require.Equal(t, "35", edge("ship", "notify"))
	notify := text(`svg.graph g.step[data-step="notify"] text.live`)
	require.Contains(t, notify, "5 awaiting")
	do(t, ctx, shoot(t, "dashboard-machine-graph"))
	// A live count links to those instances.
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`svg.graph g.step[data-step="notify"] a`))))
	rows := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("table.instances tbody tr").length`))
	require.Equal(t, 5, rows)

	// The queues page's charts: finished per minute and the lag, one row per queue.
	do(t, ctx, chromedp.Navigate(s.url+"/"), chromedp.WaitVisible(chromedp.CSS("section.charts")))
	charts := get(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.charts tr")].map(e => e.dataset.chart)`))
	require.Equal(t, []string{"default", "mail", "payments"}, charts)
	svgs := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("table.charts svg.chart").length`))
	require.Equal(t, 6, svgs)
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS(`tr[data-chart="default"] td:last-child`))), "lag now")
	do(t, ctx, shoot(t, "dashboard-queues-charts"))
}
