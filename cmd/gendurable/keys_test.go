package main

import (
	"context"
	"encoding/base64"
	"strconv"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/stretchr/testify/require"
)

// The commands open sealed values with the keys GENDURABLE_KEYS gives them; without it they show
// them as stored and say why; a malformed value is refused by name. A signal sent from the
// command line is sealed with the current key.
func TestCommandsOpenSealedValuesWithTheirKeys(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	key := make([]byte, 32)
	key[0] = 7
	codec, err := gendurable.NewAESGCM("k1", map[string][]byte{"k1": key})
	require.NoError(t, err)
	m := gendurable.FSM[order]{Name: "order", Start: "go", Queue: "orders", Steps: map[string]gendurable.StepFunc[order]{
		"go": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) { return gendurable.Done(o), nil },
	}}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Codec: codec, Machines: []gendurable.Machine{m}})
	require.NoError(t, err)
	res, err := cl.Insert(context.Background(), m.With(order{N: 424242}), nil)
	require.NoError(t, err)
	url := durabledbtest.URL(t)
	id := strconv.FormatInt(res.ID, 10)
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--database-url", url, "--schema", schema)...)
	}

	t.Setenv(keysEnv, "")
	code, out, errOut := cli("show", id)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `sealed\s+gendurable: payload codec: sealed with key "k1", and this client has no Config.Codec`, out)
	require.Contains(t, out, `"gdc1:k1:`)
	require.NotContains(t, out, "424242")

	t.Setenv(keysEnv, "k1:"+base64.StdEncoding.EncodeToString(key))
	code, out, errOut = cli("show", id)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "sealed")
	require.Contains(t, out, `"n": 424242`)
	code, _, errOut = cli("signal", id, "note", `{"secret": 515151}`)
	require.Equal(t, 0, code, errOut)
	var stored string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT payload #>> '{}' FROM "`+schema+`".signals WHERE instance_id = $1`, res.ID).Scan(&stored))
	require.Regexp(t, `^gdc1:k1:`, stored)
	code, out, errOut = cli("show", id)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `515151`, "the inbox, opened")

	for env, want := range map[string]string{
		"k1":                 "entry 1: want name:base64key",
		"k1:%%%":             `key "k1": not standard base64`,
		"k1:AAAA":            `key "k1" is 3 bytes`,
		"k1:AAAA,k1:AAAA":    `key "k1" given twice`,
		"bad name:" + "AAAA": `key name "bad name"`,
	} {
		t.Setenv(keysEnv, env)
		code, _, errOut = cli("show", id)
		require.Equal(t, 1, code, env)
		require.Contains(t, errOut, keysEnv, env)
		require.Contains(t, errOut, want, env)
	}
}
