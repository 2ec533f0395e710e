package chaos

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos/oracle"
	"github.com/stretchr/testify/require"
)

// T9c of the reliability plan: statement cancellations. Two worker processes work linear5
// instances on a private cluster while, every U(2, 20)ms, one statement in flight on their
// engine pools (found by application_name) is cancelled with pg_cancel_backend: what a
// statement_timeout on the role, an operator or a pooler's query timeout does. Unlike a
// terminated session, the connection survives and the statement fails with query_canceled
// (57014), in whatever the engine was doing: a pick, an outcome batch, a heartbeat, a reaper or
// GC sweep. The run goes on (more instances inserted) until the server's log shows at least one
// cancelled pick and one cancelled outcome batch, and every instance is done. Pass: within 3
// minutes, I1-I8, and every repeated effect explained by a lease the reaper released.
func TestStatementCancelsLoseNothing(t *testing.T) {
	// A cluster of its own, whose log says what was cancelled; a fixed load it carries with room
	// to spare, so it runs beside the others.
	t.Parallel()
	seed, rng := oracle.Seed(t)
	began := time.Now()
	ctx := context.Background()
	cluster, db := privateCluster(t, nil)
	n := oracle.Size(1000, 5000)
	db.insert(t, n, 5)
	cfg := func(name string) workerCfg {
		return chaosCfg(cluster.URL, cluster.URL, db.schema, name, func(c *workerCfg) {
			c.StepMS, c.Conc, c.Seed, c.Quiet, c.App = 10, 8, seed, true, "gd-t9c-"+name
		})
	}
	workers := []*worker{startWorker(t, cfg("w0")), startWorker(t, cfg("w1"))}
	cancels := 0
	var cancelled map[string]int
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("not done within 3 minutes: %d of %d instances, cancelled %v", db.done(t), n, cancelled)
		}
		time.Sleep(time.Duration(2+rng.IntN(19)) * time.Millisecond)
		var k int
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM (
			SELECT pid FROM pg_stat_activity
			WHERE application_name LIKE 'gd-t9c-%' AND state = 'active' AND pid <> pg_backend_pid()
			ORDER BY random() LIMIT 1) AS a`).Scan(&k))
		cancels += k
		if db.done(t) < n {
			continue
		}
		cancelled = cancelledStatements(t, db)
		if cancelled["pick"] > 0 && cancelled["outcome"] > 0 {
			break
		}
		// Everything is done, but the cancellations have not yet hit both: more work.
		db.insert(t, 100, 5)
		n += 100
	}
	t.Logf("%d instances done in %v; %d cancels sent; statements cancelled, by family: %v",
		n, time.Since(began).Round(time.Millisecond), cancels, cancelled)
	var reports []workerReport
	for _, w := range workers {
		reports = append(reports, w.stop(t))
	}
	st := sum(reports...)
	violations, dup := db.check(t, n)
	dups := unexplainedDuplicates(t, &env{pool: db.pool, schema: db.schema}, func(int) bool { return false }, nil)
	oracle.Report(t, oracle.Summary{Test: "T9c", Seed: seed, Instances: n, Faults: cancels, Violations: violations,
		Lost: n - db.done(t), DuplicateTerminal: dup, Deadlocks: db.deadlocks(t),
		Throughput: float64(st.steps()) / time.Since(began).Seconds(), Seconds: time.Since(began).Seconds()})
	t.Logf("stale outcomes %d, failed commit tries %d", st.stale(), st.CommitFailed)
	require.Zero(t, dups, "repeated effects no lost lease explains")
	require.Positive(t, st.CommitFailed, "a cancelled outcome batch is a failed commit try, retried")
}

// cancelledStatements counts the statements the private cluster's log says were cancelled at a
// client's request, by family: "pick", "outcome", or the statement's first words ("" when the
// log names none).
func cancelledStatements(t *testing.T, db *chaosDB) map[string]int {
	t.Helper()
	log, err := db.cluster.ServerLog()
	require.NoError(t, err)
	out := map[string]int{}
	lines := strings.Split(log, "\n")
	for i, line := range lines {
		if !strings.Contains(line, "canceling statement due to user request") {
			continue
		}
		out[family(cancelledStatement(lines, i))]++
	}
	return out
}

// logPrefix starts every line the server writes (log_line_prefix '%m [%p] '); the other lines
// continue a multi-line statement.
var logPrefix = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\S* \S+ \[(\d+)\] `)

// cancelledStatement is the text of the statement whose error is at lines[i]: the STATEMENT
// entry the same backend logs after it (after its CONTEXT, if any), with its continuation lines.
func cancelledStatement(lines []string, i int) string {
	m := logPrefix.FindStringSubmatch(lines[i])
	if m == nil {
		return ""
	}
	for j := i + 1; j < len(lines); j++ {
		if next := logPrefix.FindStringSubmatch(lines[j]); next == nil || next[1] != m[1] {
			continue // a continuation line, or another backend's entry
		}
		_, stmt, ok := strings.Cut(lines[j], "STATEMENT:")
		if !ok {
			if strings.Contains(lines[j], "ERROR:") || strings.Contains(lines[j], "LOG:") {
				return "" // the backend's next entry: this error named no statement
			}
			continue
		}
		for k := j + 1; k < len(lines) && !logPrefix.MatchString(lines[k]); k++ {
			stmt += " " + lines[k]
		}
		return strings.Join(strings.Fields(stmt), " ")
	}
	return ""
}

// family names a statement of the engine: "pick" (the candidate scan), "outcome" (an outcome
// batch's statement), or its first four words.
func family(stmt string) string {
	switch {
	case strings.Contains(stmt, "candidates AS MATERIALIZED"):
		return "pick"
	case strings.Contains(stmt, "u.kind"):
		return "outcome"
	}
	words := strings.Fields(stmt)
	return strings.Join(words[:min(4, len(words))], " ")
}
