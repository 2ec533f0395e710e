package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// A -v run of two packages as go test prints it: parallel tests interleaved, t.Log output
// indented behind file:line, a sub-test, and a summary inside a failing test's output.
const passing = `=== RUN   TestKillLoopLosesNothing
=== PAUSE TestKillLoopLosesNothing
=== CONT  TestKillLoopLosesNothing
    killloop_test.go:35: seed=42
=== NAME  TestAwaitBridgeUnderFaults
    awaitchaos_test.go:186: 1000 callers
    killloop_test.go:58: chaos-summary {"test":"T1 kill -9 loop","seed":42,"instances":11000,"kills":57,"pauses":0,"restarts":0,"connections_cut":0,"faults":0,"violations":0,"lost":0,"duplicate_terminal":0,"deadlocks":0,"throughput":612.4,"baseline":700,"seconds":95.2}
--- PASS: TestKillLoopLosesNothing (95.31s)
    awaitchaos_test.go:180: chaos-summary {"test":"T16 await bridge","seed":7,"instances":1000,"kills":1,"seconds":14.5}
--- PASS: TestAwaitBridgeUnderFaults (14.60s)
PASS
ok  	github.com/gendurable/gendurable	110.2s
=== RUN   TestOther
--- PASS: TestOther (0.01s)
PASS
ok  	github.com/gendurable/gendurable/internal/chaos/oracle	0.2s
`

func TestReadCollectsEverySummary(t *testing.T) {
	var r Run
	require.NoError(t, r.Read(strings.NewReader(passing)))
	require.Len(t, r.Summaries, 2)
	require.Equal(t, "T1 kill -9 loop", r.Summaries[0].Test)
	require.Equal(t, 57, r.Summaries[0].Kills)
	require.InDelta(t, 612.4, r.Summaries[0].Throughput, 1e-9)
	require.Equal(t, "T16 await bridge", r.Summaries[1].Test)
	require.Empty(t, r.Failed)
	require.Empty(t, r.Problems())
}

func TestRenderIsATable(t *testing.T) {
	var r Run
	require.NoError(t, r.Read(strings.NewReader(passing)))
	var out bytes.Buffer
	require.NoError(t, r.Render(&out))
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	require.Len(t, lines, 5, "heading, rule, two rows, total:\n%s", out.String())
	for _, l := range lines {
		require.Equal(t, utf8.RuneCountInString(lines[0]), utf8.RuneCountInString(l), "columns are padded:\n%s", out.String())
		require.Equal(t, 14, strings.Count(l, "|"), "13 cells: %q", l)
	}
	require.Contains(t, lines[0], "| test ")
	require.Contains(t, lines[2], "| T1 kill -9 loop ")
	require.Contains(t, lines[2], " 11,000 |")
	require.Contains(t, lines[2], " 612 vs 700 (87%) |")
	require.Contains(t, lines[2], " 95 |")
	require.Contains(t, lines[3], " – |", "no throughput measured")
	require.Contains(t, lines[4], "**total (2)**")
	require.Contains(t, lines[4], " 12,000 |")
	require.Contains(t, lines[4], " 58 |")
}

func TestProblemsFailTheRun(t *testing.T) {
	broken := `    x_test.go:1: chaos-summary {"test":"T17 fan-out join","seed":9,"instances":10,"violations":2,"lost":1,"deadlocks":3}
--- FAIL: TestFanOutJoinsExactlyOnceUnderKills (3.00s)
    --- FAIL: TestFanOutJoinsExactlyOnceUnderKills/sub (1.00s)
FAIL
FAIL	github.com/gendurable/gendurable	4.1s
`
	var r Run
	require.NoError(t, r.Read(strings.NewReader(broken)))
	require.Equal(t, []string{"TestFanOutJoinsExactlyOnceUnderKills", "TestFanOutJoinsExactlyOnceUnderKills/sub",
		"package github.com/gendurable/gendurable"}, r.Failed)
	problems := r.Problems()
	require.Len(t, problems, 4)
	require.Equal(t, "T17 fan-out join (seed 9): 2 invariants violated, 1 instances lost, 3 deadlocks", problems[3])

	var none Run
	require.NoError(t, none.Read(strings.NewReader("ok  \tgithub.com/gendurable/gendurable\t1s\n")))
	require.Equal(t, []string{"no chaos-summary lines in the output (was it run with -v?)"}, none.Problems())
}

func TestRunExitStatus(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.log")
	require.NoError(t, os.WriteFile(good, []byte(passing), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run([]string{good}, nil, &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "T16 await bridge")

	stdout.Reset()
	require.Equal(t, 1, run(nil, strings.NewReader("--- FAIL: TestX (1s)\n"+passing), &stdout, &stderr))
	require.Contains(t, stderr.String(), "failed: TestX")

	stderr.Reset()
	require.Equal(t, 2, run(nil, strings.NewReader("    a.go:1: chaos-summary {nope\n"), &stdout, &stderr))
	require.Contains(t, stderr.String(), "line 1: a chaos-summary that is not JSON")
	require.Equal(t, 2, run([]string{filepath.Join(dir, "missing.log")}, nil, &stdout, &stderr))
}
