package main

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

type order struct {
	N int `json:"n"`
}

// The operator's commands against a schema holding a done, a failed and a parked instance.
func TestOperatorCommands(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	m := gendurable.FSM[order]{Name: "order", Start: "go", Queue: "orders", Steps: map[string]gendurable.StepFunc[order]{
		"go": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) {
			switch o.N {
			case 1:
				return gendurable.Stop(errors.New("card declined")), nil
			case 2:
				return gendurable.Await([]string{"approve"}, "finish", o), nil
			}
			return gendurable.Next("finish", o), nil
		},
		"finish": func(ctx *gendurable.Ctx, o order) (gendurable.Outcome, error) { return gendurable.Done(o), nil },
	}}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"orders": {}}})
	require.NoError(t, err)
	require.NoError(t, cl.Start(context.Background()))
	t.Cleanup(func() { _ = cl.Stop(context.Background()) })
	ctx := context.Background()
	var ids []int64
	for n := range 3 {
		res, err := cl.Insert(ctx, m.With(order{N: n}), &gendurable.InsertOpts{CorrelationKey: "o-" + strconv.Itoa(n)})
		require.NoError(t, err)
		a, err := cl.Await(ctx, res.ID, 5*time.Second, nil)
		require.NoError(t, err)
		require.NotEqual(t, gendurable.AwaitBusy, a.Status)
		ids = append(ids, res.ID)
	}
	url := durabledbtest.URL(t)
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--database-url", url, "--schema", schema)...)
	}

	code, out, errOut := cli("queues")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `orders\s+0\s+0\s+0\s+1\s+0\s+1\s+1\s+0\s+-`, out)

	// Pausing: a queue, a machine and an instance, listed, shown, and refused by name.
	code, out, errOut = cli("pause", "queue", "orders", "--reason", "maintenance")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `queue "orders" paused`)
	code, out, _ = cli("queues")
	require.Equal(t, 0, code)
	require.Contains(t, out, "orders (paused)")
	code, _, errOut = cli("pause", "machine", "nosuch")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `unknown machine: "nosuch"`)
	code, _, errOut = cli("pause", "queue", "nosuch")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `unknown queue: "nosuch"`)
	code, _, errOut = cli("pause", "bogus", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "usage: pause")
	code, out, _ = cli("pauses")
	require.Equal(t, 0, code)
	require.Regexp(t, `queue\s+orders\s+\S+\s+\S+\s+maintenance`, out)
	code, _, errOut = cli("pause", "--machine", "order", "o-2")
	require.Equal(t, 0, code, errOut)
	code, out, _ = cli("list", "--paused")
	require.Equal(t, 0, code)
	require.Equal(t, 2, strings.Count(out, "\n"), out)
	require.Contains(t, out, strconv.FormatInt(ids[2], 10))
	code, out, _ = cli("show", strconv.FormatInt(ids[2], 10))
	require.Equal(t, 0, code)
	require.Contains(t, out, "paused")
	require.Regexp(t, `why\s+It waits for a signal named "approve", before step finish; it is paused too`, out)
	for _, args := range [][]string{{"resume", "queue", "orders"}, {"resume", strconv.FormatInt(ids[2], 10)}} {
		code, _, errOut = cli(args...)
		require.Equal(t, 0, code, errOut)
	}
	code, out, _ = cli("pauses")
	require.Equal(t, 0, code)
	require.Contains(t, out, "nothing is paused")
	code, out, _ = cli("list", "--paused")
	require.Equal(t, 0, code)
	require.Equal(t, 1, strings.Count(out, "\n"), out)

	code, out, _ = cli("list", "--status", "failed")
	require.Equal(t, 0, code)
	require.Contains(t, out, "card declined")
	require.Equal(t, 2, strings.Count(out, "\n"), out) // the header and one row

	code, out, _ = cli("list", "--limit", "2", "--json")
	require.Equal(t, 0, code)
	var page gendurable.ListPage
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Instances, 2)
	require.Equal(t, ids[1], page.Next)

	code, out, _ = cli("show", strconv.FormatInt(ids[0], 10))
	require.Equal(t, 0, code)
	require.Contains(t, out, "go → finish\n")
	require.Contains(t, out, `"n": 0`)
	require.NotContains(t, out, "recovered", "no claim of it was lost")
	_, err = pool.Exec(ctx, `UPDATE `+pgx.Identifier{schema}.Sanitize()+`.instances SET recoveries = 2 WHERE id = $1`, ids[0])
	require.NoError(t, err)
	code, out, _ = cli("show", strconv.FormatInt(ids[0], 10))
	require.Equal(t, 0, code)
	require.Regexp(t, `recovered\s+2 lost claims of this step`, out)

	code, out, _ = cli("show", "--machine", "order", "o-2")
	require.Equal(t, 0, code)
	require.Contains(t, out, "go → [finish]")
	code, out, _ = cli("show", "--machine", "order", "o-2", "--json")
	require.Equal(t, 0, code)
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, "awaiting", shown["status"])
	require.Equal(t, map[string]any{"n": 2.0}, shown["state"])

	code, out, _ = cli("signal", "--machine", "order", "o-2", "approve", `{"by":"ops"}`)
	require.Equal(t, 0, code)
	require.Contains(t, out, "woke it")
	a, err := cl.Await(ctx, ids[2], 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, a.Status)

	code, out, _ = cli("retry", strconv.FormatInt(ids[1], 10), "--step", "finish")
	require.Equal(t, 0, code)
	require.Contains(t, out, "runnable again")
	a, err = cl.Await(ctx, ids[1], 5*time.Second, nil)
	require.NoError(t, err)
	require.Equal(t, gendurable.AwaitDone, a.Status)
	require.Len(t, a.Instance.Errors, 1, "the retry keeps the history")

	res, err := cl.Insert(ctx, m.With(order{N: 9}), &gendurable.InsertOpts{Queue: "nobody"})
	require.NoError(t, err)
	code, out, _ = cli("cancel", strconv.FormatInt(res.ID, 10), "--reason", "duplicate order")
	require.Equal(t, 0, code)
	require.Contains(t, out, "cancelled")
	in, err := cl.Get(ctx, res.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusCancelled, in.Status)

	// Bad input: a clear message and a non-zero exit, nothing changed.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "abc"}, "not an instance id"},
		{[]string{"show", "999999999"}, "instance not found"},
		{[]string{"show"}, "name the instance"},
		{[]string{"cancel", strconv.FormatInt(res.ID, 10)}, "does not allow"},
		{[]string{"retry", strconv.FormatInt(ids[0], 10)}, "only failed or cancelled"},
		{[]string{"list", "--status", "sleeping"}, `"sleeping" is not a status`},
		{[]string{"list", "--since", "yesterday"}, "--since"},
		{[]string{"list", "--limit", "5000"}, "Limit"},
		{[]string{"signal", "1"}, "usage: signal"},
		{[]string{"signal", strconv.FormatInt(ids[0], 10), "x", "{not json"}, "not JSON"},
		{[]string{"signal", strconv.FormatInt(ids[0], 10), "x"}, "finished or does not exist"},
	} {
		code, _, errOut := cli(tc.args...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	var signals int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".signals`).Scan(&signals))
	require.Zero(t, signals)

	// The machine as a graph, in text.
	code, out, errOut = cli("machine")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "order\n", out)
	code, out, errOut = cli("machine", "order")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "machine order: 2 steps")
	require.Regexp(t, `\[go\s*\]\s+no live instance\s+\(start of \d+\)\n\s+─→ finish\s+\d+`, out)
	code, _, errOut = cli("machine", "nosuch")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unknown machine")

	// Bulk: a count first; --yes applies; a filter that matches everything needs --all.
	code, out, errOut = cli("bulk", "delete", "--machine", "order", "--error", "DECLINED")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "1 instances match: delete them with --yes\n", out)
	code, out, errOut = cli("bulk", "delete", "--machine", "order", "--error", "DECLINED", "--yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "delete: 1 changed, 0 skipped")
	_, err = cl.Get(ctx, ids[1])
	require.ErrorIs(t, err, gendurable.ErrNotFound)
	code, _, errOut = cli("bulk", "cancel")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "set All")
	code, out, errOut = cli("bulk", "cancel", "--all")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "instances match: cancel them with --yes")
	code, _, errOut = cli("bulk", "explode", "--machine", "order")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `"explode" is not a bulk action`)
}

// doctor: a schema whose rows are due while no worker runs has a problem (exit status 1), named
// with its fix, in text and in JSON; once a worker runs, that problem is gone.
func TestDoctor(t *testing.T) {
	pool := durabledbtest.Pool(t, 4)
	schema := durabledbtest.Schema(t, pool)
	m := gendurable.FSM[order]{Name: "order", Start: "go", Queue: "orders", Steps: map[string]gendurable.StepFunc[order]{
		"go": func(*gendurable.Ctx, order) (gendurable.Outcome, error) { return gendurable.Done(nil), nil },
	}}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{m}})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = cl.Insert(ctx, m.With(order{}), nil)
	require.NoError(t, err)
	url := durabledbtest.URL(t)
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--database-url", url, "--schema", schema)...)
	}
	code, out, errOut := cli("doctor")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "problem [workers] rows are due in queues no live node works: orders\n    fix: Start a client")
	require.Regexp(t, `problems found: \d+ of \d+ findings are problems`, errOut)
	// A checkup that cannot run exits with 3, not with a problem's 1.
	code, _, errOut = runCLI(t, "doctor", "--database-url", url, "--schema", "never_migrated")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, "not migrated")
	code, out, _ = cli("doctor", "--json")
	require.Equal(t, 1, code)
	var findings []gendurable.Finding
	require.NoError(t, json.Unmarshal([]byte(out), &findings))
	require.True(t, slices.ContainsFunc(findings, func(f gendurable.Finding) bool {
		return f.Check == "workers" && f.Severity == gendurable.SeverityProblem
	}), out)

	worker, err := gendurable.NewClient(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Machine{m},
		Queues: map[string]gendurable.QueueConfig{"orders": {}}})
	require.NoError(t, err)
	require.NoError(t, worker.Start(ctx))
	t.Cleanup(func() { _ = worker.Stop(context.Background()) })
	code, out, _ = cli("doctor", "--json")
	require.NoError(t, json.Unmarshal([]byte(out), &findings))
	require.False(t, slices.ContainsFunc(findings, func(f gendurable.Finding) bool { return f.Check == "workers" }), out)
	// What is left is the server's own (this suite's server may run without autovacuum).
	for _, f := range findings {
		require.Contains(t, []string{"autovacuum", "horizon"}, f.Check, out)
	}
	require.Equal(t, code == 1, slices.ContainsFunc(findings, func(f gendurable.Finding) bool {
		return f.Severity == gendurable.SeverityProblem
	}))
}

// doctor --slot-wal reads sizes as postgresql.conf writes them, and names what it cannot read
// (exit status 3: the checkup did not run).
func TestDoctorSlotWALFlag(t *testing.T) {
	for in, want := range map[string]int64{"512": 512, "64kB": 64 << 10, "10 MB": 10 << 20, "1GB": 1 << 30, "2TB": 2 << 40, "7B": 7} {
		var w walSize
		require.NoError(t, w.Set(in), in)
		require.Equal(t, want, int64(w), in)
	}
	for _, in := range []string{"", "0", "-1", "1.5GB", "1gb", "GB", "9000000TB"} {
		var w walSize
		require.ErrorContains(t, w.Set(in), "is not a size", in)
	}
	code, _, errOut := runCLI(t, "doctor", "--slot-wal", "lots")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, `"lots" is not a size`)
}
