package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

// The command measures latency-remote through Redis and prints its figures.
func TestLatencyRemoteThroughRedis(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const addr = "127.0.0.1:6379"
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	err := rdb.Ping(ctx).Err()
	_ = rdb.Close()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Redis at %s: %v", addr, err)
		}
		t.Skipf("no Redis at %s: %v", addr, err)
	}
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"--database-url", durabledbtest.URL(t), "--schema", "t_redispoke_bench",
		"--redis", addr, "--n", "50", "--json"}, &out))
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out.String())), &r), out.String())
	require.Equal(t, "latency-remote", r["scenario"])
	require.Equal(t, float64(50), r["n"])
	for _, f := range []string{"p50_ms", "p95_ms", "p99_ms", "insert_p50_ms", "insert_p99_ms", "pick_p50_ms", "pick_p99_ms"} {
		require.Greater(t, r[f].(float64), 0.0, f)
	}
}
