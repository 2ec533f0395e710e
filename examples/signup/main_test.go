package main

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { durabledbtest.Main(m) }

func TestSignupRunsToDone(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	const schema = "example_signup"
	ctx := context.Background()
	require.NoError(t, durablemigrate.Drop(ctx, pool, schema))
	t.Cleanup(func() { _ = durablemigrate.Drop(context.Background(), pool, schema) })

	r, w, err := os.Pipe()
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = w
	runErr := run(ctx, durabledbtest.URL(t), schema)
	os.Stdout = stdout
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, runErr)
	require.Equal(t, "done after step send_welcome: {\"email\": \"ada@example.com\", \"account\": 1001, \"welcomed\": true}\n", string(out))
}
