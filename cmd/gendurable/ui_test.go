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
			"--addr", "127.0.0.1:0", "--token", "s3cret"}, out)
	}()
	var base string
	select {
	case line := <-out:
		m := regexp.MustCompile(`on (http://\S+/) \(actions need the token\)`).FindStringSubmatch(line)
		require.NotNil(t, m, line)
		base = m[1]
	case err := <-done:
		t.Fatalf("runUI returned before serving: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("runUI did not start serving")
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(base)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "<h1>Queues</h1>")
	// No CSRF token: refused before the token is even looked at.
	resp, err = hc.PostForm(base+"instances/1/cancel", url.Values{"token": {"s3cret"}})
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

func TestUIRefusesOpenActionsOnANetworkAddress(t *testing.T) {
	t.Setenv("GENDURABLE_UI_TOKEN", "")
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--addr", "0.0.0.0:0"}, "pass --token"},
		{[]string{"--addr", "nonsense"}, "--addr"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := runUI(context.Background(), c.args, io.Discard)
		require.Error(t, err)
		require.True(t, strings.Contains(err.Error(), c.says), "%v: %v", c.args, err)
	}
}
