package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/chaos/oracle"
)

// Run is what one or more `go test -v` outputs say about a reliability run.
type Run struct {
	// Summaries are the chaos-summary lines, in the order they were written.
	Summaries []oracle.Summary
	// Failed names the tests (and packages) the output reports as failed.
	Failed []string
}

// Read adds what r holds: every chaos-summary line (wherever it sits on its line: go test
// indents t.Log output and prefixes it with the file and line) and every failure.
func (r *Run) Read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.Index(text, oracle.SummaryPrefix); i >= 0 {
			var s oracle.Summary
			if err := json.Unmarshal([]byte(text[i+len(oracle.SummaryPrefix):]), &s); err != nil {
				return fmt.Errorf("line %d: a chaos-summary that is not JSON: %w", line, err)
			}
			r.Summaries = append(r.Summaries, s)
			continue
		}
		trimmed := strings.TrimSpace(text)
		switch {
		case strings.HasPrefix(trimmed, "--- FAIL: "):
			name, _, _ := strings.Cut(strings.TrimPrefix(trimmed, "--- FAIL: "), " ")
			r.Failed = append(r.Failed, name)
		case strings.HasPrefix(text, "FAIL\t"):
			pkg, _, _ := strings.Cut(strings.TrimPrefix(text, "FAIL\t"), "\t")
			r.Failed = append(r.Failed, "package "+strings.TrimSpace(pkg))
		}
	}
	return sc.Err()
}

// Problems lists why the run does not pass: failed tests, summaries that show broken
// guarantees, or no summary at all.
func (r *Run) Problems() []string {
	var out []string
	for _, f := range r.Failed {
		out = append(out, "failed: "+f)
	}
	for _, s := range r.Summaries {
		var bad []string
		for _, x := range []struct {
			n    int
			what string
		}{{s.Violations, "invariants violated"}, {s.Lost, "instances lost"},
			{s.DuplicateTerminal, "duplicate terminal transitions"}, {s.Deadlocks, "deadlocks"}} {
			if x.n != 0 {
				bad = append(bad, fmt.Sprintf("%d %s", x.n, x.what))
			}
		}
		if len(bad) > 0 {
			out = append(out, fmt.Sprintf("%s (seed %d): %s", s.Test, s.Seed, strings.Join(bad, ", ")))
		}
	}
	if len(r.Summaries) == 0 {
		out = append(out, "no chaos-summary lines in the output (was it run with -v?)")
	}
	return out
}

// headings are the table's column headings.
func headings() []string {
	return []string{"test", "instances", "kills", "pauses", "restarts", "connections cut", "faults",
		"invariants violated", "instances lost", "duplicate terminal", "deadlocks",
		"throughput under faults vs baseline (steps/s)", "seconds"}
}

// Render writes the summaries as a Markdown table, columns padded so that it also reads as
// plain text, and a last line with the totals.
func (r *Run) Render(w io.Writer) error {
	columns := headings()
	rows := [][]string{columns}
	var total oracle.Summary
	for _, s := range r.Summaries {
		rows = append(rows, []string{s.Test, count(s.Instances), count(s.Kills), count(s.Pauses), count(s.Restarts),
			count(s.ConnectionsCut), count(s.Faults), count(s.Violations), count(s.Lost), count(s.DuplicateTerminal),
			count(s.Deadlocks), throughput(s), fmt.Sprintf("%.0f", s.Seconds)})
		total.Instances += s.Instances
		total.Kills += s.Kills
		total.Pauses += s.Pauses
		total.Restarts += s.Restarts
		total.ConnectionsCut += s.ConnectionsCut
		total.Faults += s.Faults
		total.Violations += s.Violations
		total.Lost += s.Lost
		total.DuplicateTerminal += s.DuplicateTerminal
		total.Deadlocks += s.Deadlocks
		total.Seconds += s.Seconds
	}
	rows = append(rows, []string{fmt.Sprintf("**total (%d)**", len(r.Summaries)), count(total.Instances),
		count(total.Kills), count(total.Pauses), count(total.Restarts), count(total.ConnectionsCut), count(total.Faults),
		count(total.Violations), count(total.Lost), count(total.DuplicateTerminal), count(total.Deadlocks), "",
		fmt.Sprintf("%.0f", total.Seconds)})
	width := make([]int, len(columns))
	for _, row := range rows {
		for i, cell := range row {
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(" " + c + pad + " |")
			} else {
				b.WriteString(" " + pad + c + " |")
			}
		}
		b.WriteString("\n")
	}
	line(rows[0])
	rule := make([]string, len(columns))
	for i := range rule {
		rule[i] = strings.Repeat("-", width[i])
		if i > 0 {
			rule[i] = rule[i][:len(rule[i])-1] + ":"
		}
	}
	line(rule)
	for _, row := range rows[1:] {
		line(row)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// count formats a count with thousands separators.
func count(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// throughput formats a summary's throughput, against its baseline when it has one.
func throughput(s oracle.Summary) string {
	switch {
	case s.Throughput == 0:
		return "–"
	case s.Baseline == 0:
		return fmt.Sprintf("%.0f", s.Throughput)
	}
	return fmt.Sprintf("%.0f vs %.0f (%.0f%%)", s.Throughput, s.Baseline, 100*s.Throughput/s.Baseline)
}
