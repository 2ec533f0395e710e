package main

import (
	"context"
	"io"
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
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// The application's login guards the pages, the Authorize hook the actions: an admin looks, an
// operator approves an expense, and the worker pays it.
func TestAdminsLookOperatorsAct(t *testing.T) {
	pool := durabledbtest.Pool(t, 8)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{expense},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 2}}})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(stop))
	})
	res, err := client.Insert(ctx, expense.With(Expense{Amount: 120}), nil)
	require.NoError(t, err)
	a, err := client.Await(ctx, res.ID, 10*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitAwaiting, a.Status)

	mux := http.NewServeMux()
	users := map[string]user{"ada": {password: "look"}, "ops": {password: "act", operator: true}}
	require.NoError(t, adminRoutes(mux, client, users))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	page := srv.URL + "/admin/durable/instances/" + itoa(res.ID)

	browse := func(name, password string) func(method, url string, form url.Values) (int, string) {
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		hc := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		t.Cleanup(hc.CloseIdleConnections)
		return func(method, url string, form url.Values) (int, string) {
			req, err := http.NewRequest(method, url, strings.NewReader(form.Encode()))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if name != "" {
				req.SetBasicAuth(name, password)
			}
			resp, err := hc.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(b)
		}
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`)

	code, _ := browse("", "")("GET", page, nil)
	require.Equal(t, http.StatusUnauthorized, code, "no login, no page")
	code, _ = browse("ada", "wrong")("GET", page, nil)
	require.Equal(t, http.StatusUnauthorized, code)

	ada := browse("ada", "look")
	code, body := ada("GET", page, nil)
	require.Equal(t, http.StatusOK, code)
	approve := url.Values{"csrf": {csrf.FindStringSubmatch(body)[1]}, "name": {"approve"}, "payload": {`{"by": "ada"}`}}
	code, body = ada("POST", page+"/signal", approve)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "only operators may signal, retry or cancel")
	in, err := client.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusAwaiting, in.Status, "nothing was sent")

	ops := browse("ops", "act")
	code, body = ops("GET", page, nil)
	require.Equal(t, http.StatusOK, code)
	approve.Set("csrf", csrf.FindStringSubmatch(body)[1])
	approve.Set("payload", `{"by": "ops"}`)
	code, _ = ops("POST", page+"/signal", approve)
	require.Equal(t, http.StatusSeeOther, code)
	a, err = client.Await(ctx, res.ID, 10*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, a.Status)
	var e Expense
	require.NoError(t, a.Decode(&e))
	require.Equal(t, Expense{Amount: 120, Approver: "ops", Paid: true}, e)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
