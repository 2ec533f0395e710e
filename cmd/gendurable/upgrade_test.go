package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durabletest"
	"github.com/stretchr/testify/require"
)

// gendurable upgrade: a request a running node of the newer version works, and show's account
// of an upgraded instance.
func TestUpgradeCommand(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	ctx := context.Background()
	park := func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) {
		return gendurable.Await([]string{"go"}, "old", o), nil
	}
	done := func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) { return gendurable.Done(o), nil }
	v1 := gendurable.FSM[order]{Name: "doc", Start: "start", Queue: "docs",
		Steps: map[string]gendurable.StepFunc[order]{"start": park, "old": done}}
	v2 := gendurable.FSM[order]{Name: "doc", Start: "start", Queue: "docs", Version: 2,
		Steps:    map[string]gendurable.StepFunc[order]{"start": park, "new": done},
		Upgrades: []gendurable.Upgrade{{From: 1, Steps: map[string]string{"old": "new"}}}}
	c1, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{v1}})
	require.NoError(t, err)
	var ids []int64
	for n := range 20 {
		res, err := c1.Insert(ctx, v1.With(order{N: n}), nil)
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	durabletest.New(t, c1, nil).Drain(ctx)

	c2, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{v2},
		Queues: map[string]gendurable.QueueConfig{"docs": {}}})
	require.NoError(t, err)
	require.NoError(t, c2.Start(ctx))
	t.Cleanup(func() { _ = c2.Stop(context.Background()) })

	url := durabledbtest.URL(t)
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--database-url", url, "--schema", schema)...)
	}
	code, out, errOut := cli("upgrade", "--machine", "doc", "--poll", "100ms")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "20 upgraded to version 2, 0 blocked")

	code, out, errOut = cli("show", strconv.FormatInt(ids[0], 10))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "doc (version 2)")
	require.Regexp(t, `upgraded\s+version 1 → 2, step old → new`, out)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"upgrade"}, "name the machine with --machine"},
		{[]string{"upgrade", "--machine", "doc", "extra"}, "name the machine with --machine"},
		{[]string{"upgrade", "--machine", strings.Repeat("m", 200)}, "machine name"},
		{[]string{"upgrade", "--machine", "ghost"}, "no running node registers it"},
		{[]string{"upgrade", "--machine", "doc", "--timeout", "0s"}, "must be positive"},
	} {
		code, _, errOut := cli(tc.args...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
}
