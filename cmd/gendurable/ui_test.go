package main

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/stretchr/testify/require"
)

// lines hands what a command prints to the test, a write at a time.
type lines chan string

func (l lines) Write(p []byte) (int, error) {
	l <- string(p)
	return len(p), nil
}

func TestUIServesTheDashboard(t *testing.T) {
	pool := durabledbtest.Pool(t, 2)
	schema := durabledbtest.Schema(t, pool)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(lines, 4)
	done := make(chan error, 1)
	go func() {
		done <- runUI(ctx, []string{"--database-url", durabledbtest.URL(t), "--schema", schema,
			"--addr", "127.0.0.1:0", "--token", "s3cret", "--allow-host", "ops.example.com"}, out)
	}()
	var base string
	select {
	case line := <-out:
		m := regexp.MustCompile(`on (http://\S+/) \(pages and actions need the token\)`).FindStringSubmatch(line)
		require.NotNil(t, m, line)
		base = m[1]
	case err := <-done:
		t.Fatalf("runUI returned before serving: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("runUI did not start serving")
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	get := func(host, auth string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", base, nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	// Reading needs the token too.
	code, body := get("", "")
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "<h1>Sign in</h1>")
	code, body = get("", "Bearer s3cret")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "<h1>Queues</h1>")
	// A name the dashboard was not told about (DNS rebinding) is refused, token or not; a name
	// on --allow-host is served.
	code, body = get("attacker.example", "Bearer s3cret")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, `does not answer to the host "attacker.example"`)
	code, _ = get("ops.example.com:8080", "Bearer s3cret")
	require.Equal(t, http.StatusOK, code)
	// No CSRF token: refused before the token is even looked at.
	resp, err := hc.PostForm(base+"instances/1/cancel", url.Values{"token": {"s3cret"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("runUI did not stop")
	}
}

func TestUIRefusesToOpenOnANetworkAddressWithoutAToken(t *testing.T) {
	t.Setenv("GENDURABLE_UI_TOKEN", "")
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--addr", "0.0.0.0:0"}, "pass --token"},
		{[]string{"--addr", "0.0.0.0:0", "--read-only"}, "read-only or not"},
		{[]string{"--addr", "nonsense"}, "--addr"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := runUI(context.Background(), c.args, io.Discard)
		require.Error(t, err)
		require.True(t, strings.Contains(err.Error(), c.says), "%v: %v", c.args, err)
	}
}
