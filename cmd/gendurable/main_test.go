package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/stretchr/testify/require"
)

// TestMain runs the tests, or, with GD_CLI_AS_MAIN=1, the command itself: bench --processes
// starts worker processes of its own executable, which under go test is this test binary.
func TestMain(m *testing.M) {
	if os.Getenv("GD_CLI_AS_MAIN") == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	durabledbtest.Main(m)
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestMigratePrintAndErrors(t *testing.T) {
	code, out, _ := runCLI(t, "migrate", "--print", "--schema", "my_app")
	require.Equal(t, 0, code)
	require.Contains(t, out, `CREATE TABLE "my_app".instances`)
	require.Contains(t, out, `INSERT INTO "my_app".meta`)

	code, _, errOut := runCLI(t, "migrate", "--print", "--schema", `x"; DROP TABLE y; --`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "invalid identifier")

	code, _, errOut = runCLI(t, "nonsense")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "nonsense"`)

	code, _, errOut = runCLI(t, "bench", "--scenario", "nope", "--database-url", durabledbtest.URL(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `"nope"`)
}

func TestMigrateCreatesTheSchema(t *testing.T) {
	pool := durabledbtest.Pool(t, 2)
	const schema = "t_cli_migrate"
	_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS t_cli_migrate CASCADE`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS t_cli_migrate CASCADE`) })
	latest := fmt.Sprintf("is at version %d", durablemigrate.Version)
	code, out, errOut := runCLI(t, "migrate", "--database-url", durabledbtest.URL(t), "--schema", schema)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "not created yet")
	require.Contains(t, out, latest)
	require.NotContains(t, out, "applied ", "a new schema is created at once, not step by step")
	// Idempotent: a second run finds nothing pending.
	code, out, errOut = runCLI(t, "migrate", "--database-url", durabledbtest.URL(t), "--schema", schema)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, latest)
	require.NotContains(t, out, "pending:")

	// From a schema the libraries before this one run against, the contract migrations run only
	// when named by --target.
	code, out, errOut = runCLI(t, "migrate", "--database-url", durabledbtest.URL(t), "--schema", schema, "--target", "9")
	require.Equal(t, 0, code, errOut)
	// An existing schema goes a step at a time, each reported as it is applied.
	for v := durablemigrate.Version; v > 9; v-- {
		require.Regexp(t, fmt.Sprintf(`(?m)^applied %d \w+ \(down to %d\) in \d`, v, v-1), out)
	}
	for range 2 {
		code, out, errOut = runCLI(t, "migrate", "--database-url", durabledbtest.URL(t), "--schema", schema)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, fmt.Sprintf("is at version %d", durablemigrate.Required))
	}
	require.Contains(t, out, fmt.Sprintf("once every node runs this library, run gendurable migrate --target %d", durablemigrate.Version))
	code, out, errOut = runCLI(t, "migrate", "--database-url", durabledbtest.URL(t), "--schema", schema,
		"--target", fmt.Sprint(durablemigrate.Version))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, latest)
	require.Regexp(t, fmt.Sprintf(`(?m)^applied %d \w+ \(up\) in \d`, durablemigrate.Version), out)
}

// The benchmark in miniature: every available scenario runs and reports the fields it must.
func TestBenchSmoke(t *testing.T) {
	allocs := filepath.Join(t.TempDir(), "allocs.pprof")
	code, out, errOut := runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--schema", "t_cli_bench", "--n", "300", "--json",
		"--memprofile", allocs)
	require.Equal(t, 0, code, errOut)
	// The allocation profile is a gzipped protocol buffer (go tool pprof reads it).
	prof, err := os.ReadFile(allocs)
	require.NoError(t, err)
	require.Greater(t, len(prof), 2)
	require.Equal(t, []byte{0x1f, 0x8b}, prof[:2])
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 11)
	want := map[string][]string{
		"jobs":           {"insert_per_s", "work_per_s", "client_cpu_us_per_job"},
		"chain":          {"steps_per_s", "client_cpu_us_per_job"},
		"latency":        {"p50_ms", "p95_ms", "p99_ms", "insert_p50_ms", "insert_p99_ms"},
		"latency-remote": {"p50_ms", "p95_ms", "p99_ms", "insert_p50_ms", "insert_p99_ms", "pick_p50_ms", "pick_p99_ms"},
		"latency-tx":     {"p50_ms", "p95_ms", "p99_ms"},
		"await":          {"steps_per_s", "p50_ms", "p99_ms"},
		"signal":         {"steps_per_s", "p50_ms", "p99_ms", "client_cpu_us_per_job"},
		"fanout":         {"steps_per_s"},
		"gated":          {"insert_per_s", "work_per_s", "client_cpu_us_per_job"},
		"fair":           {"insert_per_s", "work_per_s", "client_cpu_us_per_job"},
		"rated":          {"insert_per_s", "work_per_s", "client_cpu_us_per_job"},
	}
	for _, l := range lines {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &r))
		name := r["scenario"].(string)
		require.Contains(t, want, name)
		require.Equal(t, float64(300), r["n"])
		require.Greater(t, r["seconds"].(float64), 0.0)
		for _, f := range want[name] {
			require.Greater(t, r[f].(float64), 0.0, "%s.%s", name, f)
		}
		require.NotEmpty(t, r["postgres"])
		require.NotEmpty(t, r["synchronous_commit"])
	}
}

// jobs and chain worked by two worker processes (this test binary, run as the command): every
// instance is done, and the results carry the database's transactions and time per job.
func TestBenchWorkerProcesses(t *testing.T) {
	t.Setenv("GD_CLI_AS_MAIN", "1")
	code, out, errOut := runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--schema", "t_cli_bench_procs",
		"--scenario", "jobs", "--scenario", "chain", "--processes", "2", "--n", "500", "--json")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	for i, name := range []string{"jobs", "chain"} {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &r))
		require.Equal(t, name, r["scenario"])
		require.Equal(t, float64(2), r["processes"])
		for _, f := range []string{"seconds", "db_ms_per_job", "xacts_per_job"} {
			require.Greater(t, r[f].(float64), 0.0, "%s.%s", name, f)
		}
	}
	code, _, errOut = runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--processes", "-1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "must be positive")
}

// The long scenarios, which run only when named, at a small size: the soak reports each window
// while it runs, then its summary; cron reports fire lag and database time per fire.
func TestBenchSoakAndCronSmoke(t *testing.T) {
	code, out, errOut := runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--schema", "t_cli_bench_long",
		"--scenario", "soak", "--scenario", "cron", "--n", "50", "--duration", "3s", "--window", "1s", "--rate", "200",
		"--retention", "30s", "--json")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var windows int
	var summary, cron map[string]any
	for _, l := range lines {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &r))
		switch {
		case r["scenario"] == "soak" && r["partial"] == true:
			windows++
			w := r["window"].(map[string]any)
			require.Equal(t, float64(windows), w["index"])
			require.Greater(t, w["insert_per_s"].(float64), 0.0)
			require.Greater(t, w["total_mb"].(float64), 0.0)
			require.Contains(t, w, "dead_tuples")
			require.Contains(t, w, "autovacuum_runs")
		case r["scenario"] == "soak":
			summary = r
		case r["scenario"] == "cron":
			cron = r
		}
	}
	require.Equal(t, 3, windows)
	require.NotNil(t, summary)
	require.Greater(t, summary["work_per_s"].(float64), 0.0)
	require.NotNil(t, summary["window"])
	require.NotNil(t, cron)
	for _, f := range []string{"work_per_s", "p50_ms", "p99_ms", "db_ms_per_fire"} {
		require.Greater(t, cron[f].(float64), 0.0, "cron.%s", f)
	}
	require.NotEmpty(t, cron["autovacuum"])
}

func TestDemoRunsToCompletion(t *testing.T) {
	code, out, errOut := runCLI(t, "demo", "--database-url", durabledbtest.URL(t), "--schema", "t_cli_demo", "--n", "200")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "200/200 orders finished")
	require.Contains(t, out, "instances by status:")
	require.Contains(t, out, "done")
}

// --poke postgres gives the in-process clients PokePostgres: latency-tx's InsertTx then sends its
// poke inside the transaction, and every instance still starts. A transport the flag does not
// know is refused before anything runs.
func TestBenchPokeFlag(t *testing.T) {
	code, out, errOut := runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--schema", "t_cli_bench_poke",
		"--scenario", "latency-tx", "--poke", "postgres", "--n", "50", "--json")
	require.Equal(t, 0, code, errOut)
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &r))
	require.Equal(t, "latency-tx", r["scenario"])
	require.Greater(t, r["p50_ms"].(float64), 0.0)

	code, _, errOut = runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--poke", "redis")
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, `--poke "redis": local or postgres`)
}

// --samples writes one line per pickup of latency and latency-remote, in insert order; jitter
// (asked for by name) measures the host alone.
func TestBenchSamplesAndJitter(t *testing.T) {
	samples := filepath.Join(t.TempDir(), "samples.csv")
	code, out, errOut := runCLI(t, "bench", "--database-url", durabledbtest.URL(t), "--schema", "t_cli_bench_samples",
		"--scenario", "latency", "--scenario", "latency-remote", "--scenario", "jitter", "--n", "40", "--json", "--samples", samples)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	var jitter map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &jitter))
	require.Equal(t, "jitter", jitter["scenario"])
	require.GreaterOrEqual(t, jitter["p99_ms"].(float64), jitter["p50_ms"].(float64))

	raw, err := os.ReadFile(samples)
	require.NoError(t, err)
	rows := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Equal(t, "scenario,at_ms,total_ms,insert_ms", rows[0])
	require.Len(t, rows, 1+2*40)
	last := map[string]float64{}
	for i, row := range rows[1:] {
		f := strings.Split(row, ",")
		require.Len(t, f, 4, row)
		want := "latency"
		if i >= 40 {
			want = "latency-remote"
		}
		require.Equal(t, want, f[0], row)
		var at, total, insert float64
		for j, v := range []*float64{&at, &total, &insert} {
			*v, err = strconv.ParseFloat(f[j+1], 64)
			require.NoError(t, err, row)
		}
		if prev, ok := last[f[0]]; ok {
			require.Greater(t, at, prev, "samples in insert order: %s", row)
		} else {
			require.Zero(t, at, row)
		}
		last[f[0]] = at
		require.Greater(t, insert, 0.0, row)
		require.Greater(t, total, 0.0, row)
	}
}
