package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	pool := durabledbtest.Pool(t, 8)
	schema := durabledbtest.Schema(t, pool)
	client, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{checkout},
		Queues: map[string]gendurable.QueueConfig{gendurable.DefaultQueue: {Concurrency: 4}}})
	require.NoError(t, err)
	require.NoError(t, client.Start(context.Background()))
	srv := httptest.NewServer(newHandler(client))
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(ctx))
	})
	return srv
}

func call(t *testing.T, method, url, body string, header ...string) (int, reply, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out reply
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out, resp.Header
}

func TestCheckoutAnswersWithinTheRequest(t *testing.T) {
	srv := newServer(t)
	code, out, _ := call(t, "POST", srv.URL+"/checkouts", `{"items": 2}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "done", out.Status)
	var c Checkout
	require.NoError(t, json.Unmarshal(out.Result, &c))
	require.Equal(t, Checkout{Items: 2, Reserved: true, Receipt: "R-" + itoa(out.ID)}, c)
}

func TestSlowCheckoutGivesARetryToken(t *testing.T) {
	srv := newServer(t)
	code, out, h := call(t, "POST", srv.URL+"/checkouts?wait=100ms", `{"items": 1, "payment_ms": 600}`)
	require.Equal(t, http.StatusAccepted, code)
	require.Equal(t, "busy", out.Status)
	require.Equal(t, "/checkouts/"+itoa(out.ID), out.Retry)
	require.Equal(t, out.Retry, h.Get("Location"))

	code, again, _ := call(t, "GET", srv.URL+out.Retry+"?wait=5s", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "done", again.Status)
	require.Equal(t, out.ID, again.ID)
}

func TestIdempotencyKeyReturnsTheSameCheckout(t *testing.T) {
	srv := newServer(t)
	_, first, _ := call(t, "POST", srv.URL+"/checkouts", `{"items": 3}`, "Idempotency-Key", "cart-77")
	_, second, _ := call(t, "POST", srv.URL+"/checkouts", `{"items": 3}`, "Idempotency-Key", "cart-77")
	require.Equal(t, first.ID, second.ID)
	require.Equal(t, "done", second.Status)
}

func TestCheckoutErrors(t *testing.T) {
	srv := newServer(t)
	code, out, _ := call(t, "POST", srv.URL+"/checkouts", `{"items": 0}`)
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Equal(t, "failed", out.Status)
	require.Contains(t, out.Error, "the cart is empty")

	code, out, _ = call(t, "GET", srv.URL+"/checkouts/999999999", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "not_found", out.Status)

	for _, tc := range []struct{ method, path, body, want string }{
		{"POST", "/checkouts", `{"items": `, "not a checkout"},
		{"POST", "/checkouts?wait=forever", `{"items": 1}`, "wait="},
		{"POST", "/checkouts?wait=-1s", `{"items": 1}`, "wait="},
		{"GET", "/checkouts/abc", "", "positive number"},
		{"POST", "/checkouts", `{"items": 1}`, "CorrelationKey"},
	} {
		var hdr []string
		if tc.want == "CorrelationKey" {
			hdr = []string{"Idempotency-Key", strings.Repeat("k", 600)}
		}
		code, out, _ := call(t, tc.method, srv.URL+tc.path, tc.body, hdr...)
		require.Equal(t, http.StatusBadRequest, code, tc.path)
		require.Contains(t, out.Error, tc.want, tc.path)
	}
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }
