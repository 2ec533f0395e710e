package durableui_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durableui"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// order is the machine of the tests: it parks for an approval, then ships.
type order struct {
	Item string `json:"item"`
}

var orderFSM = gendurable.FSM[order]{
	Name: "order", Start: "reserve", Queue: "orders",
	Steps: map[string]gendurable.StepFunc[order]{
		"reserve": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) {
			return gendurable.Await([]string{"approve"}, "ship", o), nil
		},
		"ship": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) { return gendurable.Done(o), nil },
	},
}

// env is one test's schema and a client on it (not started: rows stay where a test puts them).
type env struct {
	pool   *pgxpool.Pool
	schema string
	client *gendurable.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := durabledbtest.Pool(t, 8)
	schema := durabledbtest.Schema(t, pool)
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{orderFSM}})
	require.NoError(t, err)
	return &env{pool: pool, schema: schema, client: cl}
}

// insert adds an order and moves its row to status with SQL ("" leaves it available).
func (e *env) insert(t *testing.T, status gendurable.Status, opts *gendurable.InsertOpts) int64 {
	t.Helper()
	res, err := e.client.Insert(context.Background(), orderFSM.With(order{Item: "book"}), opts)
	require.NoError(t, err)
	switch status {
	case "", gendurable.StatusAvailable:
	case gendurable.StatusAwaiting:
		e.exec(t, `UPDATE {schema}.instances SET status = 'awaiting', await_names = '{approve}', step = 'ship',
		             path = '{reserve}' WHERE id = $1`, res.ID)
	default:
		e.exec(t, `UPDATE {schema}.instances SET status = $2::text::{schema}.status, finalized_at = now(),
		             errors = CASE WHEN $2 = 'failed' THEN '[{"at":"2025-01-01T00:00:00Z","step":"reserve","attempt":1,"kind":"error","error":"out of stock"}]'::jsonb END
		           WHERE id = $1`, res.ID, string(status))
	}
	return res.ID
}

func (e *env) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), strings.ReplaceAll(q, "{schema}", `"`+e.schema+`"`), args...)
	require.NoError(t, err)
}

// rows is every row of the schema's instances and signals, as JSON: equal snapshots mean that
// nothing was written.
func (e *env) rows(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, e.pool.QueryRow(context.Background(), strings.ReplaceAll(`
		SELECT (SELECT coalesce(jsonb_agg(to_jsonb(i) ORDER BY i.id), '[]') FROM {schema}.instances AS i)::text ||
		       (SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.id), '[]') FROM {schema}.signals AS s)::text`,
		"{schema}", `"`+e.schema+`"`)).Scan(&s))
	return s
}

func (e *env) status(t *testing.T, id int64) gendurable.Status {
	t.Helper()
	in, err := e.client.Get(context.Background(), id)
	require.NoError(t, err)
	return in.Status
}

// browser is a dashboard served over HTTP and a client that keeps its cookies and does not
// follow redirects.
type browser struct {
	srv    *httptest.Server
	hc     *http.Client
	h      http.Handler
	prefix string
}

func (e *env) serve(t *testing.T, opts *durableui.Options) *browser {
	t.Helper()
	if opts == nil {
		opts = &durableui.Options{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := durableui.New(e.client, opts)
	require.NoError(t, err)
	mux := http.NewServeMux()
	prefix := "/"
	if opts.Prefix != "" {
		prefix = opts.Prefix
	}
	mux.Handle(prefix, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(hc.CloseIdleConnections)
	return &browser{srv: srv, hc: hc, h: h, prefix: prefix}
}

// signIn posts the sign-in form with token and returns the status and the redirect.
func (b *browser) signIn(t *testing.T, token, next string) (int, string) {
	t.Helper()
	code, _, hdr := b.post(t, b.prefix+"signin", url.Values{"token": {token}, "next": {next}}, nil)
	return code, hdr.Get("Location")
}

// csrfSignedOut is csrf for a browser that has not signed in to a dashboard with a token: the
// sign-in page (401) carries the CSRF token of the session too.
func (b *browser) csrfSignedOut(t *testing.T, path string) string {
	t.Helper()
	code, body := b.get(t, path)
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Contains(t, body, "<h1>Sign in</h1>")
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(t, m, "no CSRF field on the sign-in page")
	return m[1]
}

func (b *browser) do(t *testing.T, req *http.Request) (int, string, http.Header) {
	t.Helper()
	resp, err := b.hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body), resp.Header
}

func (b *browser) get(t *testing.T, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	require.NoError(t, err)
	code, body, _ := b.do(t, req)
	return code, body
}

func (b *browser) post(t *testing.T, path string, form url.Values, header http.Header) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	return b.do(t, req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf loads a page that holds forms (setting the session cookie) and returns its token.
func (b *browser) csrf(t *testing.T, path string) string {
	t.Helper()
	code, body := b.get(t, path)
	require.Equal(t, http.StatusOK, code, body)
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(t, m, "no CSRF field on %s", path)
	return m[1]
}

func TestPagesRenderAndEscape(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	parked := e.insert(t, gendurable.StatusAwaiting, &gendurable.InsertOpts{CorrelationKey: `<script>alert("k")</script>`})
	e.exec(t, `UPDATE {schema}.instances SET state = '{"item": "<b>bold</b>", "n": 1}' WHERE id = $1`, parked)
	_, err := e.client.Signal(ctx, gendurable.ByID(parked), "note", map[string]string{"text": "</pre><script>x()</script>"})
	require.NoError(t, err)
	failed := e.insert(t, gendurable.StatusFailed, nil)
	done := e.insert(t, gendurable.StatusDone, &gendurable.InsertOpts{Queue: "mail"})
	e.insert(t, "", &gendurable.InsertOpts{RateLimit: "ghost"})
	child := e.insert(t, "", nil)
	e.exec(t, `UPDATE {schema}.instances SET parent_id = $2, parent_wave = 1 WHERE id = $1`, child, parked)
	b := e.serve(t, nil)

	code, body := b.get(t, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<meta http-equiv="refresh" content="5">`)
	require.Contains(t, body, `href="/instances?queue=orders"`)
	require.Contains(t, body, `>mail</a>`)
	require.Contains(t, body, "All queues")

	code, body = b.get(t, "/instances")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `<script>alert`)
	require.Contains(t, body, `&lt;script&gt;alert(&#34;k&#34;)&lt;/script&gt;`)
	require.Contains(t, body, "out of stock")

	code, body = b.get(t, fmt.Sprintf("/instances/%d", parked))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "&#34;item&#34;: &#34;&lt;b&gt;bold&lt;/b&gt;&#34;", "state, indented and escaped")
	require.NotContains(t, body, "<script>x()")
	require.Contains(t, body, `<li>reserve</li>`)
	require.Contains(t, body, `<li class="current" title="where it is now">ship</li>`)
	require.Contains(t, body, `<code>note</code>`)
	require.Contains(t, body, fmt.Sprintf(`href="/instances/%d"`, child))
	require.Contains(t, body, `id="signal-form"`)
	require.Contains(t, body, `id="cancel-form"`)
	require.NotContains(t, body, `id="retry-form"`)

	code, body = b.get(t, fmt.Sprintf("/instances/%d", child))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, fmt.Sprintf(`<a href="/instances/%d">%d</a>`, parked, parked), "parent link")

	code, body = b.get(t, fmt.Sprintf("/instances/%d", failed))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="retry-form"`)
	require.NotContains(t, body, `id="cancel-form"`)
	require.Contains(t, body, "out of stock")

	code, body = b.get(t, fmt.Sprintf("/instances/%d", done))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "A finished instance takes no actions.")

	code, body = b.get(t, "/stuck")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "unknown_rate_limit")
	require.Contains(t, body, "ghost")
	// The checkup: rows are due, and no node works a queue.
	require.Contains(t, body, "<h2>Database checkup</h2>")
	require.Regexp(t, `<td><strong>problem</strong></td>\s*<td>workers</td>\s*<td>rows are due in queues no live node works: [^<]+</td>`, body)

	code, body = b.get(t, "/static/style.css")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "--accent")
}

func TestQueuesPageCountsAndThroughput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for range 3 {
		e.insert(t, "", nil)
	}
	late := e.insert(t, "", nil)
	e.exec(t, `UPDATE {schema}.instances SET scheduled_at = now() - interval '2 hours' WHERE id = $1`, late)
	e.insert(t, "", &gendurable.InsertOpts{In: time.Hour})
	for range 6 {
		e.insert(t, gendurable.StatusDone, nil)
	}
	e.insert(t, gendurable.StatusFailed, nil)
	e.insert(t, gendurable.StatusAwaiting, nil)
	b := e.serve(t, &durableui.Options{Refresh: -1})

	code, body := b.get(t, "/")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `http-equiv="refresh"`)
	row := regexp.MustCompile(`(?s)<td data-queue="orders"><a href="/instances\?queue=orders">orders</a></td>(.*?)</tr>`).FindStringSubmatch(body)
	require.NotNil(t, row, body)
	cells := regexp.MustCompile(`<td class="num[^"]*">(?:<a [^>]*>)?([^<]*)`).FindAllStringSubmatch(row[1], -1)
	var got []string
	for _, c := range cells {
		got = append(got, c[1])
	}
	// available, due, oldest due, executing, awaiting, joining, done, failed, cancelled, then
	// per minute: done, failed, cancelled.
	require.Equal(t, []string{"5", "4", "2h 0m", "0", "1", "0", "6", "1", "0", "6.0", "1.0", "0"}, got)
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var ids []int64
	for range 7 {
		ids = append(ids, e.insert(t, "", nil))
	}
	failed := e.insert(t, gendurable.StatusFailed, nil)
	cancelled := e.insert(t, gendurable.StatusCancelled, nil)
	keyed := e.insert(t, "", &gendurable.InsertOpts{CorrelationKey: "order-42", Queue: "vip"})
	e.exec(t, `UPDATE {schema}.instances SET inserted_at = now() - interval '3 days' WHERE id = ANY($1)`, ids[:2])
	b := e.serve(t, nil)
	listed := regexp.MustCompile(`<td class="num"><a href="/instances/(\d+)">`)
	idsOf := func(body string) []string {
		var out []string
		for _, m := range listed.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	str := func(ids ...int64) []string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = fmt.Sprint(id)
		}
		return out
	}

	code, body := b.get(t, "/instances?status=failed&status=cancelled")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, str(cancelled, failed), idsOf(body))
	require.Contains(t, body, `value="failed" checked`)

	code, body = b.get(t, "/instances?machine=order&key=order-42")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, str(keyed), idsOf(body))
	code, body = b.get(t, "/instances?queue=vip")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, str(keyed), idsOf(body))

	code, body = b.get(t, "/instances?since=1d&status=available")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, str(keyed, ids[6], ids[5], ids[4], ids[3], ids[2]), idsOf(body))

	// Keyset pages of 3, newest first, following the Older link until there is none.
	var seen []string
	next := "/instances?status=available&limit=3"
	for pages := 0; next != ""; pages++ {
		require.Less(t, pages, 5)
		code, body = b.get(t, next)
		require.Equal(t, http.StatusOK, code)
		seen = append(seen, idsOf(body)...)
		m := regexp.MustCompile(`<a rel="next" href="([^"]+)">`).FindStringSubmatch(body)
		next = ""
		if m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
			require.Contains(t, next, "status=available")
			require.Contains(t, next, "limit=3")
		}
	}
	require.Equal(t, str(keyed, ids[6], ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]), seen)

	// The go-to box.
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+fmt.Sprintf("/instances?id=%d", failed), nil)
	require.NoError(t, err)
	code, _, hdr := b.do(t, req)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, fmt.Sprintf("/instances/%d", failed), hdr.Get("Location"))
}

func TestActionsSignalRetryAndCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var logs bytes.Buffer
	b := e.serve(t, &durableui.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	parked := e.insert(t, gendurable.StatusAwaiting, nil)
	failed := e.insert(t, gendurable.StatusFailed, nil)
	page := func(id int64) string { return fmt.Sprintf("/instances/%d", id) }

	tok := b.csrf(t, page(parked))
	code, _, hdr := b.post(t, page(parked)+"/signal", url.Values{"csrf": {tok}, "name": {"approve"},
		"payload": {`{"by": "secret-approver"}`}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, hdr.Get("Location"), page(parked)+"?done=signal")
	require.Equal(t, gendurable.StatusAvailable, e.status(t, parked), "the signal woke it")
	code, body := b.get(t, hdr.Get("Location"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "it woke the instance")
	require.Contains(t, body, "secret-approver", "the inbox shows the payload")
	require.NotContains(t, logs.String(), "secret-approver", "payloads never reach the logs")
	require.Contains(t, logs.String(), "action=signal")

	code, _, _ = b.post(t, page(failed)+"/retry", url.Values{"csrf": {tok}, "step": {"ship"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	in, err := e.client.Get(context.Background(), failed)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAvailable, in.Status)
	require.Equal(t, "ship", in.Step)

	code, _, hdr = b.post(t, page(parked)+"/cancel", url.Values{"csrf": {tok}, "reason": {"customer called"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, page(parked)+"?done=cancel", hdr.Get("Location"))
	in, err = e.client.Get(context.Background(), parked)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusCancelled, in.Status)
	require.Equal(t, "customer called", in.Errors[len(in.Errors)-1].Error)
	// Once more: the instance is finished now; the error page leads back to it.
	code, body, _ = b.post(t, page(parked)+"/cancel", url.Values{"csrf": {tok}}, nil)
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, body, fmt.Sprintf(`<a href="%s">Back to the instance</a>`, page(parked)))

	_, body = b.get(t, page(parked))
	require.Contains(t, body, `id="retry-form"`, "a cancelled instance can be retried")
	require.NotContains(t, body, `id="cancel-form"`)
	require.NotContains(t, body, `id="signal-form"`)
}

// Every request that cannot be served gets a status that fits and a message that says why, and
// changes no row.
func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	live := e.insert(t, gendurable.StatusAwaiting, nil)
	done := e.insert(t, gendurable.StatusDone, nil)
	failed := e.insert(t, gendurable.StatusFailed, nil)
	page := func(id int64) string { return fmt.Sprintf("/instances/%d", id) }
	const maxPayload = 1024
	denied := errors.New("operators only")

	type req struct {
		method, path string
		form         url.Values // POST: the csrf field is added unless noCSRF
		raw          string     // POST: a body to send as it is, before the csrf field
		header       http.Header
	}
	cases := []struct {
		name     string
		opts     durableui.Options
		req      req
		noCSRF   bool
		otherKey bool // the CSRF token of another handler (another key)
		want     int
		says     string
	}{
		{name: "unknown id", req: req{method: "GET", path: "/instances/987654321"}, want: 404, says: "There is no instance 987654321"},
		{name: "id not a number", req: req{method: "GET", path: "/instances/abc"}, want: 404, says: "There is no instance &#34;abc&#34;"},
		{name: "no such page", req: req{method: "GET", path: "/nowhere"}, want: 404, says: "There is no page at /nowhere"},
		{name: "go to a non-id", req: req{method: "GET", path: "/instances?id=x1"}, want: 400, says: "is not an instance id"},
		{name: "bad status filter", req: req{method: "GET", path: "/instances?status=sleeping"}, want: 400, says: "The filter &#34;status&#34;"},
		{name: "bad since filter", req: req{method: "GET", path: "/instances?since=yesterday"}, want: 400, says: "The filter &#34;since&#34;"},
		{name: "bad before filter", req: req{method: "GET", path: "/instances?before=-3"}, want: 400, says: "The filter &#34;before&#34;"},
		{name: "bad limit filter", req: req{method: "GET", path: "/instances?limit=5000"}, want: 400, says: "The filter &#34;limit&#34;"},
		{name: "bad queue filter", req: req{method: "GET", path: "/instances?queue=" + strings.Repeat("q", 129)}, want: 400, says: "The filter &#34;queue&#34;"},
		{name: "bad key filter", req: req{method: "GET", path: "/instances?key=" + strings.Repeat("k", 513)}, want: 400, says: "The filter &#34;key&#34;"},
		{name: "bad inbox cursor", req: req{method: "GET", path: page(live) + "?inbox_after=x"}, want: 400, says: "inbox_after"},

		{name: "payload over the limit", opts: durableui.Options{MaxPayloadBytes: maxPayload},
			req:  req{method: "POST", path: page(live) + "/signal", form: url.Values{"name": {"approve"}, "payload": {`"` + strings.Repeat("x", maxPayload) + `"`}}},
			want: 413, says: "the limit is 1024"},
		{name: "body far over the limit", opts: durableui.Options{MaxPayloadBytes: maxPayload},
			req:  req{method: "POST", path: page(live) + "/signal", form: url.Values{"name": {"approve"}, "payload": {strings.Repeat("%", 80_000)}}},
			want: 413, says: "The form is too large"},
		{name: "payload not JSON", req: req{method: "POST", path: page(live) + "/signal", form: url.Values{"name": {"approve"}, "payload": {`{"a": }`}}},
			want: 400, says: "The payload is not valid JSON"},
		{name: "payload with NUL", req: req{method: "POST", path: page(live) + "/signal", form: url.Values{"name": {"approve"}, "payload": {`{"a": "\u0000"}`}}},
			want: 400, says: "NUL"},
		{name: "signal without name", req: req{method: "POST", path: page(live) + "/signal", form: url.Values{"payload": {`{}`}}},
			want: 400, says: "A signal needs a name"},
		{name: "signal name too long", req: req{method: "POST", path: page(live) + "/signal", form: url.Values{"name": {strings.Repeat("n", 129)}}},
			want: 400, says: "name"},
		{name: "signal to a finished instance", req: req{method: "POST", path: page(done) + "/signal", form: url.Values{"name": {"approve"}}},
			want: 409, says: "finished or does not exist"},
		{name: "cancel a finished instance", req: req{method: "POST", path: page(done) + "/cancel", form: url.Values{}},
			want: 409, says: "status does not allow this"},
		{name: "cancel an unknown id", req: req{method: "POST", path: "/instances/987654321/cancel", form: url.Values{}},
			want: 404, says: "not found"},
		{name: "cancel a non-id", req: req{method: "POST", path: "/instances/x/cancel", form: url.Values{}},
			want: 404, says: "There is no instance"},
		{name: "cancel reason too long", req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{"reason": {strings.Repeat("r", 1001)}}},
			want: 400, says: "The reason is too long: at most 1000 characters"},
		{name: "retry a live instance", req: req{method: "POST", path: page(live) + "/retry", form: url.Values{}},
			want: 409, says: "status does not allow this"},
		{name: "retry at an unknown step", req: req{method: "POST", path: page(failed) + "/retry", form: url.Values{"step": {"teleport"}}},
			want: 400, says: "has no step &#34;teleport&#34;"},
		{name: "malformed form", req: req{method: "POST", path: page(live) + "/cancel", raw: "reason=%zz"},
			want: 400, says: "could not be read"},

		{name: "forged form without CSRF token", noCSRF: true,
			req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{}}, want: 403, says: "CSRF token"},
		{name: "CSRF token of another key", otherKey: true,
			req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{}}, want: 403, says: "CSRF token"},
		{name: "cross-origin browser request",
			req:  req{method: "POST", path: page(live) + "/cancel", form: url.Values{}, header: http.Header{"Sec-Fetch-Site": {"cross-site"}}},
			want: 403, says: "another site"},
		{name: "read-only", opts: durableui.Options{ReadOnly: true}, noCSRF: true,
			req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{}}, want: 403, says: "read-only"},
		{name: "missing token", opts: durableui.Options{Token: "s3cret"},
			req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{}}, want: 401, says: "needs the dashboard&#39;s token"},
		{name: "wrong token", opts: durableui.Options{Token: "s3cret"},
			req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{"token": {"s3cret!"}}}, want: 403, says: "The token is wrong"},
		{name: "authorize: unauthenticated", opts: durableui.Options{Authorize: func(*http.Request) error {
			return fmt.Errorf("no session: %w", durableui.ErrUnauthenticated)
		}}, req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{}}, want: 401, says: "no session"},
		{name: "authorize: forbidden", opts: durableui.Options{Authorize: func(*http.Request) error { return denied }},
			req: req{method: "POST", path: page(live) + "/cancel", form: url.Values{}}, want: 403, says: "operators only"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			b := e.serve(t, &opts)
			form := url.Values{}
			for k, v := range c.req.form {
				form[k] = v
			}
			if c.req.method == "POST" && !c.noCSRF {
				if opts.Token != "" {
					form.Set("csrf", b.csrfSignedOut(t, page(live)))
				} else {
					form.Set("csrf", b.csrf(t, page(live)))
				}
				if c.otherKey {
					other := e.serve(t, nil)
					form.Set("csrf", other.csrf(t, page(live)))
				}
			}
			before := e.rows(t)
			var body io.Reader
			if c.req.method == "POST" {
				body = strings.NewReader(form.Encode())
				if c.req.raw != "" {
					body = strings.NewReader(c.req.raw + "&csrf=" + url.QueryEscape(form.Get("csrf")))
				}
			}
			r, err := http.NewRequest(c.req.method, b.srv.URL+c.req.path, body)
			require.NoError(t, err)
			if body != nil {
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			for k, v := range c.req.header {
				r.Header[k] = v
			}
			code, text, hdr := b.do(t, r)
			require.Equal(t, c.want, code, text)
			require.Contains(t, text, c.says)
			require.Contains(t, hdr.Get("Content-Type"), "text/html")
			require.Equal(t, before, e.rows(t), "the rows changed")
		})
	}
	require.Equal(t, gendurable.StatusAwaiting, e.status(t, live))
}

func TestReadOnlyRendersNoForms(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	live := e.insert(t, gendurable.StatusAwaiting, nil)
	failed := e.insert(t, gendurable.StatusFailed, nil)
	b := e.serve(t, &durableui.Options{ReadOnly: true})
	for _, id := range []int64{live, failed} {
		code, body := b.get(t, fmt.Sprintf("/instances/%d", id))
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, body, "<form method=\"post\"")
		require.NotContains(t, body, `name="csrf"`)
		require.Contains(t, body, "read-only")
	}
	u, err := url.Parse(b.srv.URL)
	require.NoError(t, err)
	require.Empty(t, b.hc.Jar.Cookies(u), "a read-only dashboard sets no cookie")
}

// With a token, every page needs it: a browser that has not signed in gets the sign-in page
// (401), signs in once, and then reads and acts without typing it again; a script sends it as a
// bearer token. The sign-in only ever sends the browser on to a page of the dashboard.
func TestTokenGuardsEveryPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	live := e.insert(t, gendurable.StatusAwaiting, nil)
	b := e.serve(t, &durableui.Options{Prefix: "/ops/durable/", Token: "s3cret"})
	path := fmt.Sprintf("/ops/durable/instances/%d", live)
	for _, p := range []string{path, "/ops/durable/", "/ops/durable/instances", "/ops/durable/schedules", "/ops/durable/stuck",
		"/ops/durable/machines"} {
		code, body := b.get(t, p)
		require.Equal(t, http.StatusUnauthorized, code, p)
		require.Contains(t, body, "<h1>Sign in</h1>", p)
		require.NotContains(t, body, "order", p)
		require.Contains(t, body, `action="/ops/durable/signin"`)
	}
	_, body := b.get(t, path)
	require.Contains(t, body, fmt.Sprintf(`name="next" value="%s"`, path))
	code, _ := b.get(t, "/ops/durable/static/ui.js")
	require.Equal(t, http.StatusOK, code, "the sign-in page's assets are open")

	// A script: a bearer token.
	bearer := func(tok string) int {
		req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		code, _, _ := b.do(t, req)
		return code
	}
	require.Equal(t, http.StatusOK, bearer("s3cret"))
	require.Equal(t, http.StatusForbidden, bearer("s3cret!"))

	// A browser: a wrong token, then the right one.
	code, body, _ = b.post(t, "/ops/durable/signin", url.Values{"token": {"nope"}, "next": {path}}, nil)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "The token is wrong")
	code, loc := b.signIn(t, "s3cret", path)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, path, loc)
	code, body = b.get(t, path)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="/ops/durable/static/style.css?v=`)
	require.Contains(t, body, `action="/ops/durable/instances/`+fmt.Sprint(live)+`/cancel"`)
	require.NotContains(t, body, `name="token"`)
	require.Contains(t, body, `action="/ops/durable/signout"`)
	u, err := url.Parse(b.srv.URL + "/ops/durable/")
	require.NoError(t, err)
	for _, c := range b.hc.Jar.Cookies(u) {
		require.NotContains(t, c.Value, "s3cret", "the cookie %s holds the token", c.Name)
	}

	tok := b.csrf(t, path)
	code, _, hdr := b.post(t, path+"/cancel", url.Values{"csrf": {tok}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, path+"?done=cancel", hdr.Get("Location"))
	require.Equal(t, gendurable.StatusCancelled, e.status(t, live))

	// The sign-in sends the browser nowhere but the dashboard.
	for _, next := range []string{"//evil.example/x", "https://evil.example/", "/elsewhere", "/ops/durable\\evil", "javascript:alert(1)"} {
		code, loc := b.signIn(t, "s3cret", next)
		require.Equal(t, http.StatusSeeOther, code)
		require.Equal(t, "/ops/durable/", loc, next)
	}
	// Signed out, the pages need the token again; a dashboard with another token does not
	// take this one's sign-in.
	code, _, _ = b.post(t, "/ops/durable/signout", nil, nil)
	require.Equal(t, http.StatusSeeOther, code)
	code, _ = b.get(t, path)
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = b.signIn(t, "s3cret", path)
	require.Equal(t, http.StatusSeeOther, code)
	key := []byte(strings.Repeat("k", 32))
	first := e.serve(t, &durableui.Options{Token: "one", CSRFKey: key})
	code, _ = first.signIn(t, "one", "/")
	require.Equal(t, http.StatusSeeOther, code)
	req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
	firstURL, err := url.Parse(first.srv.URL)
	require.NoError(t, err)
	for _, c := range first.hc.Jar.Cookies(firstURL) {
		req.AddCookie(c)
	}
	rotated, err := durableui.New(e.client, &durableui.Options{Token: "two", CSRFKey: key, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	rotated.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code, "a new token signs every browser out")
}

// Wrong tokens from one address are slowed down: after five, that address is refused (429, with
// Retry-After), even with the right token, while another address is not.
func TestWrongTokensAreSlowedDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := durableui.New(e.client, &durableui.Options{Token: "s3cret", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	try := func(from, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = from
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := range 5 {
		require.Equal(t, http.StatusForbidden, try("192.0.2.7:4000", "guess").Code, "guess %d", i+1)
	}
	rec := try("192.0.2.7:4001", "s3cret")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Contains(t, rec.Body.String(), "Too many wrong tokens from your address")
	retry, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	require.NoError(t, err)
	require.InDelta(t, 30, retry, 2)
	// A bearer token from that address is refused the same way.
	req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
	req.RemoteAddr = "192.0.2.7:4002"
	req.Header.Set("Authorization", "Bearer s3cret")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	// Another address signs in.
	require.Equal(t, http.StatusSeeOther, try("198.51.100.3:5000", "s3cret").Code)
}

// The dashboard answers to IP addresses, localhost and the names it is told about, and to no
// other Host: a page of an attacker's name that resolves to 127.0.0.1 (DNS rebinding) gets
// nothing.
func TestUnknownHostsAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	get := func(opts *durableui.Options, host string) *httptest.ResponseRecorder {
		opts.Logger = slog.New(slog.DiscardHandler)
		h, err := durableui.New(e.client, opts)
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, host := range []string{"127.0.0.1:8080", "localhost:8080", "[::1]:8080", "10.1.2.3", "LOCALHOST"} {
		require.Equal(t, http.StatusOK, get(&durableui.Options{}, host).Code, host)
	}
	for _, host := range []string{"attacker.example:8080", "attacker.example", "127.0.0.1.nip.io:8080"} {
		rec := get(&durableui.Options{}, host)
		require.Equal(t, http.StatusForbidden, rec.Code, host)
		require.Contains(t, rec.Body.String(), "does not answer to the host")
		require.Empty(t, rec.Header().Values("Set-Cookie"))
	}
	allowed := &durableui.Options{AllowedHosts: []string{"ops.example.com", "jobs.example.com:8443"}}
	require.Equal(t, http.StatusOK, get(allowed, "ops.example.com:443").Code)
	require.Equal(t, http.StatusOK, get(allowed, "OPS.example.com").Code)
	require.Equal(t, http.StatusOK, get(allowed, "jobs.example.com:8443").Code)
	require.Equal(t, http.StatusForbidden, get(allowed, "jobs.example.com:9999").Code)
	require.Equal(t, http.StatusOK, get(&durableui.Options{AllowedHosts: []string{"*"}}, "anything.example").Code)
	_, err := durableui.New(e.client, &durableui.Options{AllowedHosts: []string{"a b"}})
	require.ErrorContains(t, err, "AllowedHosts")
}

func TestNewValidatesOptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := durableui.New(nil, nil)
	require.ErrorContains(t, err, "nil client")
	for _, c := range []struct {
		opts durableui.Options
		says string
	}{
		{durableui.Options{Prefix: "admin"}, "Prefix"},
		{durableui.Options{Prefix: "/admin"}, "Prefix"},
		{durableui.Options{Prefix: "/{x}/"}, "Prefix"},
		{durableui.Options{Refresh: time.Millisecond}, "Refresh"},
		{durableui.Options{ThroughputWindow: 2 * time.Hour}, "ThroughputWindow"},
		{durableui.Options{MaxPayloadBytes: -1}, "MaxPayloadBytes"},
		{durableui.Options{CSRFKey: []byte("short")}, "CSRFKey"},
	} {
		_, err := durableui.New(e.client, &c.opts)
		require.ErrorContains(t, err, c.says)
	}
	h, err := durableui.New(e.client, &durableui.Options{Prefix: "/a/b-c/", CSRFKey: bytes.Repeat([]byte{7}, 32)})
	require.NoError(t, err)
	require.NotNil(t, h)
}

// schedules is every row of the schema's schedules, as JSON: equal snapshots mean that nothing
// was written.
func (e *env) schedules(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, e.pool.QueryRow(context.Background(), strings.ReplaceAll(
		`SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.name), '[]')::text FROM {schema}.schedules AS s`,
		"{schema}", `"`+e.schema+`"`)).Scan(&s))
	return s
}

func (e *env) schedule(t *testing.T, name string) *gendurable.ScheduleInfo {
	t.Helper()
	info, err := e.client.GetSchedule(context.Background(), name)
	require.NoError(t, err)
	return info
}

// scheduleRow is the table row of the schedule named name on a schedules page.
func scheduleRow(t *testing.T, body, name string) string {
	t.Helper()
	attr := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;").Replace(name)
	m := regexp.MustCompile(`(?s)<tr data-schedule="` + regexp.QuoteMeta(attr) + `">(.*?)</tr>`).FindStringSubmatch(body)
	require.NotNil(t, m, "no row for schedule %q", name)
	return m[1]
}

// oddName is a schedule name with what a path or HTML could trip on.
const oddName = `a/../b <c> & "d"`

func TestSchedulesPageListsEverySchedule(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: "nightly-report", Input: orderFSM.With(order{Item: "report"}),
		Cron: "0 3 * * *", TimeZone: "Europe/Berlin", CatchUp: time.Hour}))
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: "every-5m", Input: orderFSM.With(order{Item: "tick"}),
		Opts: &gendurable.InsertOpts{Queue: "ticks"}, Every: 5 * time.Minute, Overlap: gendurable.OverlapAllow, Jitter: 10 * time.Second}))
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: oddName, Input: orderFSM.With(order{}),
		Every: 90 * time.Second, Overlap: gendurable.OverlapCancel}))
	// History: a fire (through the API), then counts, a skip and an error as the firing loop
	// stores them.
	fired, err := e.client.TriggerSchedule(ctx, "nightly-report")
	require.NoError(t, err)
	e.exec(t, `UPDATE {schema}.schedules SET fired = 41, skipped = 3,
	             last_skip = '{"reason": "overlap", "count": 3, "first": "2025-01-01T03:00:00Z", "last": "2025-01-03T03:00:00Z", "at": "2025-01-03T03:00:01Z"}',
	             last_error = 'insert the fired instances: <boom>', last_error_at = now()
	           WHERE name = 'nightly-report'`)
	require.NoError(t, e.client.PauseSchedule(ctx, "every-5m"))
	nightly := e.schedule(t, "nightly-report")
	b := e.serve(t, nil)

	code, body := b.get(t, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<a href="/schedules">Schedules</a>`, "the navigation links the page")

	code, body = b.get(t, "/schedules")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<a href="/schedules" aria-current="page">Schedules</a>`)
	require.NotContains(t, body, "<c>", "names are escaped")
	// By name.
	iEvery, iNightly, iOdd := strings.Index(body, `data-schedule="every-5m"`), strings.Index(body, `data-schedule="nightly-report"`),
		strings.Index(body, `data-schedule="a/`)
	require.True(t, iOdd < iEvery && iEvery < iNightly, "%d %d %d", iOdd, iEvery, iNightly)

	row := scheduleRow(t, body, "nightly-report")
	for _, want := range []string{
		`<span class="key name">nightly-report</span> <span class="st st-active">active</span>`, `<small>set at run time</small>`,
		`<a href="/instances?machine=order">order</a>`, `<a href="/instances?queue=orders">orders</a>`,
		`<code>0 3 * * *</code> <small>Europe/Berlin</small>`, `catch-up 1h`,
		`<small class="overlap">overlap: skip</small>`,
		nightly.NextFireAt.UTC().Format("2006-01-02 15:04:05Z07:00"),
		nightly.LastFireAt.UTC().Format("2006-01-02 15:04:05Z07:00"),
		fmt.Sprintf(`<a href="/instances/%d">instance %d</a> <span class="st st-available">available</span>`, fired, fired),
		`<td class="num">41</td>`, `<td class="num warn">3</td>`,
		`<strong>overlap</strong>: 3 fire times`, `<span class="t">2025-01-01 03:00:00Z</span> – <span class="t">2025-01-03 03:00:00Z</span>`,
		`insert the fired instances: &lt;boom&gt;`,
		`action="/schedules/pause"`, `action="/schedules/trigger"`, `action="/schedules/remove"`,
		`<input type="hidden" name="schedule" value="nightly-report">`,
	} {
		require.Contains(t, row, want)
	}
	require.NotContains(t, row, `action="/schedules/resume"`)

	row = scheduleRow(t, body, "every-5m")
	for _, want := range []string{`<code>every 5m</code>`, `jitter up to 10s`, `overlap: allow`, `<span class="st st-paused">paused</span>`,
		`was due`, `<span class="empty">never</span>`, `<a href="/instances?queue=ticks">ticks</a>`, `action="/schedules/resume"`} {
		require.Contains(t, row, want)
	}
	require.NotContains(t, row, `action="/schedules/pause"`)

	row = scheduleRow(t, body, oddName)
	require.Contains(t, row, `<code>every 1m 30s</code>`)
	require.Contains(t, row, `overlap: cancel`)
	require.Contains(t, row, `<input type="hidden" name="schedule" value="a/../b &lt;c&gt; &amp; &#34;d&#34;">`)

	// No schedule at all.
	for _, name := range []string{"nightly-report", "every-5m", oddName} {
		require.NoError(t, e.client.RemoveSchedule(ctx, name))
	}
	code, body = b.get(t, "/schedules")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No schedule.")
}

func TestScheduleActionsPauseResumeTriggerAndRemove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: "nightly", Input: orderFSM.With(order{Item: "report"}),
		Cron: "0 3 * * *"}))
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: oddName, Input: orderFSM.With(order{}), Every: time.Hour}))
	var logs bytes.Buffer
	b := e.serve(t, &durableui.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	tok := b.csrf(t, "/schedules")
	act := func(action, name string) (int, string, http.Header) {
		t.Helper()
		return b.post(t, "/schedules/"+action, url.Values{"csrf": {tok}, "schedule": {name}}, nil)
	}
	follow := func(hdr http.Header) string {
		t.Helper()
		code, body := b.get(t, hdr.Get("Location"))
		require.Equal(t, http.StatusOK, code)
		return body
	}

	// Pause and resume, by a name that holds "/", "..", and HTML.
	code, _, hdr := act("pause", oddName)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/schedules?done=pause&schedule="+url.QueryEscape(oddName), hdr.Get("Location"))
	require.True(t, e.schedule(t, oddName).Paused)
	require.False(t, e.schedule(t, "nightly").Paused, "only the schedule named")
	body := follow(hdr)
	require.Contains(t, body, "Schedule <strong>a/../b &lt;c&gt; &amp; &#34;d&#34;</strong> paused")
	require.Contains(t, scheduleRow(t, body, oddName), `action="/schedules/resume"`)
	require.Contains(t, logs.String(), "action=pause")

	code, _, hdr = act("resume", oddName)
	require.Equal(t, http.StatusSeeOther, code)
	info := e.schedule(t, oddName)
	require.False(t, info.Paused)
	body = follow(hdr)
	require.Contains(t, body, "resumed: it fires next at "+info.NextFireAt.UTC().Format("2006-01-02 15:04:05Z07:00"))
	require.Contains(t, scheduleRow(t, body, oddName), `action="/schedules/pause"`)

	// Trigger: an instance now, linked from the message and from the row.
	before := e.schedule(t, "nightly")
	code, _, hdr = act("trigger", "nightly")
	require.Equal(t, http.StatusSeeOther, code)
	loc, err := url.Parse(hdr.Get("Location"))
	require.NoError(t, err)
	require.Equal(t, "trigger", loc.Query().Get("done"))
	var id int64
	_, err = fmt.Sscan(loc.Query().Get("instance"), &id)
	require.NoError(t, err)
	after := e.schedule(t, "nightly")
	require.NotNil(t, after.LastInstanceID)
	require.Equal(t, id, *after.LastInstanceID)
	require.Equal(t, before.Fired+1, after.Fired)
	require.Equal(t, before.NextFireAt, after.NextFireAt, "a trigger does not move the next fire time")
	in, err := e.client.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "order", in.Machine)
	require.True(t, strings.HasPrefix(in.CorrelationKey, "schedule/nightly/"), in.CorrelationKey)
	body = follow(hdr)
	require.Contains(t, body, fmt.Sprintf(`Schedule <strong>nightly</strong> fired: <a href="/instances/%d">instance %d</a>.`, id, id))
	require.Contains(t, scheduleRow(t, body, "nightly"), fmt.Sprintf(`<a href="/instances/%d">instance %d</a>`, id, id))

	// Remove: the schedule goes, its instance stays.
	code, _, hdr = act("remove", "nightly")
	require.Equal(t, http.StatusSeeOther, code)
	_, err = e.client.GetSchedule(ctx, "nightly")
	require.ErrorIs(t, err, gendurable.ErrUnknownSchedule)
	require.Equal(t, gendurable.StatusAvailable, e.status(t, id))
	body = follow(hdr)
	require.Contains(t, body, "Schedule <strong>nightly</strong> removed.")
	require.NotContains(t, body, `data-schedule="nightly"`)

	// An unknown schedule: 404 for each action, a message naming it, a link back, no change.
	snap := e.schedules(t) + e.rows(t)
	for _, action := range []string{"pause", "resume", "trigger", "remove"} {
		code, body, _ = act(action, "nightly")
		require.Equal(t, http.StatusNotFound, code, action)
		require.Contains(t, body, "There is no schedule &#34;nightly&#34;", action)
		require.Contains(t, body, `<a href="/schedules">Back to the schedules</a>`, action)
	}
	code, body, _ = act("pause", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "The form names no schedule.")
	require.Equal(t, snap, e.schedules(t)+e.rows(t))
}

// A schedule action passes the checks the instance actions pass; a refused one changes nothing.
func TestScheduleActionsAreRefusedWithoutTheChecks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: "nightly", Input: orderFSM.With(order{}), Cron: "0 3 * * *"}))
	require.NoError(t, e.client.SetSchedule(ctx, gendurable.Schedule{Name: "held", Input: orderFSM.With(order{}), Every: time.Minute}))
	require.NoError(t, e.client.PauseSchedule(ctx, "held"))
	target := map[string]string{"pause": "nightly", "resume": "held", "trigger": "nightly", "remove": "nightly"}

	cases := []struct {
		name     string
		opts     durableui.Options
		form     url.Values
		header   http.Header
		noCSRF   bool
		otherKey bool
		want     int
		says     string
	}{
		{name: "no CSRF token", noCSRF: true, want: 403, says: "CSRF token"},
		{name: "CSRF token of another key", otherKey: true, want: 403, says: "CSRF token"},
		{name: "cross-origin", header: http.Header{"Sec-Fetch-Site": {"cross-site"}}, want: 403, says: "another site"},
		{name: "read-only", opts: durableui.Options{ReadOnly: true}, noCSRF: true, want: 403, says: "read-only"},
		{name: "missing token", opts: durableui.Options{Token: "s3cret"}, want: 401, says: "needs the dashboard&#39;s token"},
		{name: "wrong token", opts: durableui.Options{Token: "s3cret"}, form: url.Values{"token": {"nope"}}, want: 403, says: "The token is wrong"},
		{name: "authorize", opts: durableui.Options{Authorize: func(*http.Request) error { return errors.New("operators only") }},
			want: 403, says: "operators only"},
	}
	for _, c := range cases {
		for _, action := range []string{"pause", "resume", "trigger", "remove"} {
			t.Run(c.name+"/"+action, func(t *testing.T) {
				opts := c.opts
				b := e.serve(t, &opts)
				form := url.Values{"schedule": {target[action]}}
				for k, v := range c.form {
					form[k] = v
				}
				switch {
				case c.otherKey:
					form.Set("csrf", e.serve(t, nil).csrf(t, "/schedules"))
				case opts.Token != "":
					form.Set("csrf", b.csrfSignedOut(t, "/schedules"))
				case !c.noCSRF:
					form.Set("csrf", b.csrf(t, "/schedules"))
				}
				before := e.schedules(t) + e.rows(t)
				code, body, _ := b.post(t, "/schedules/"+action, form, c.header)
				require.Equal(t, c.want, code, body)
				require.Contains(t, body, c.says)
				require.Equal(t, before, e.schedules(t)+e.rows(t), "the rows changed")
			})
		}
	}
	require.False(t, e.schedule(t, "nightly").Paused)
	require.True(t, e.schedule(t, "held").Paused)

	// A read-only dashboard shows the schedules without a form, and sets no cookie.
	b := e.serve(t, &durableui.Options{ReadOnly: true})
	code, body := b.get(t, "/schedules")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-schedule="nightly"`)
	require.NotContains(t, body, `<form method="post"`)
	require.NotContains(t, body, `name="csrf"`)
	require.NotContains(t, body, "<th>Actions</th>")
	u, err := url.Parse(b.srv.URL)
	require.NoError(t, err)
	require.Empty(t, b.hc.Jar.Cookies(u))
}

func TestScheduleFormsWithTokenAndPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	require.NoError(t, e.client.SetSchedule(context.Background(), gendurable.Schedule{Name: "nightly", Input: orderFSM.With(order{}),
		Cron: "0 3 * * *"}))
	b := e.serve(t, &durableui.Options{Prefix: "/ops/durable/", Token: "s3cret"})
	code, loc := b.signIn(t, "s3cret", "/ops/durable/schedules")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ops/durable/schedules", loc)
	code, body := b.get(t, "/ops/durable/schedules")
	require.Equal(t, http.StatusOK, code)
	row := scheduleRow(t, body, "nightly")
	require.Contains(t, row, `action="/ops/durable/schedules/trigger"`)
	require.NotContains(t, row, `name="token"`, "a signed-in browser is not asked for the token again")
	require.Contains(t, body, `href="/ops/durable/schedules" aria-current="page"`)

	tok := b.csrf(t, "/ops/durable/schedules")
	code, _, hdr := b.post(t, "/ops/durable/schedules/pause", url.Values{"csrf": {tok}, "schedule": {"nightly"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/ops/durable/schedules?done=pause&schedule=nightly", hdr.Get("Location"))
	require.True(t, e.schedule(t, "nightly").Paused)
}

func TestPauseActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := e.serve(t, nil)
	e.insert(t, "", nil)
	tok := b.csrf(t, "/")
	pauses := func() int {
		list, err := e.client.Pauses(context.Background())
		require.NoError(t, err)
		return len(list)
	}
	// A form must name one queue or one machine.
	code, body, _ := b.post(t, "/pause", url.Values{"csrf": {tok}}, nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "must name one queue or one machine")
	code, _, _ = b.post(t, "/pause", url.Values{"csrf": {tok}, "queue": {"orders"}, "machine": {"order"}}, nil)
	require.Equal(t, http.StatusBadRequest, code)
	code, body, _ = b.post(t, "/pause", url.Values{"csrf": {tok}, "queue": {"nosuch"}}, nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "There is no queue &#34;nosuch&#34;")
	require.Zero(t, pauses())
	// Without the CSRF token nothing happens.
	code, _, _ = b.post(t, "/pause", url.Values{"queue": {"orders"}}, nil)
	require.Equal(t, http.StatusForbidden, code)
	require.Zero(t, pauses())

	code, _, hdr := b.post(t, "/pause", url.Values{"csrf": {tok}, "queue": {"orders"}, "reason": {"deploy"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/?done=pause&queue=orders", hdr.Get("Location"))
	require.Equal(t, 1, pauses())
	_, body = b.get(t, "/?done=pause&queue=orders")
	require.Contains(t, body, "Queue <strong>orders</strong> paused")
	require.Contains(t, body, `data-paused="queue:orders"`)
	code, _, _ = b.post(t, "/resume", url.Values{"csrf": {tok}, "queue": {"orders"}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Zero(t, pauses())

	// A read-only dashboard refuses.
	ro := e.serve(t, &durableui.Options{ReadOnly: true})
	code, _, _ = ro.post(t, "/pause", url.Values{"queue": {"orders"}}, nil)
	require.Equal(t, http.StatusForbidden, code)
	require.Zero(t, pauses())
}

// The machine page's graph is SVG written by hand: every name in it is escaped.
func TestMachineGraphEscapesNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := e.serve(t, nil)
	id := e.insert(t, gendurable.StatusDone, nil)
	e.exec(t, `UPDATE {schema}.instances SET path = ARRAY['reserve', '<img src=x onerror=alert(1)>'] WHERE id = $1`, id)
	code, body := b.get(t, "/machines/order")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-step="reserve"`)
	require.NotContains(t, body, "<img src=x")
	require.Contains(t, body, "&lt;img src=x onerror=alert(1)&gt;")
	code, _ = b.get(t, "/machines/nosuch")
	require.Equal(t, http.StatusNotFound, code)
}
