// Command chaosreport tabulates a reliability run: it reads `go test -v` output (the files named
// on the command line, or standard input), collects the chaos-summary lines the suite's tests
// write with oracle.Report, and prints one Markdown table row per summary. `make chaos` runs it
// on the full-size run's output.
//
// It exits 1 if any summary shows a violated invariant, a lost instance, a duplicate terminal
// transition or a deadlock, if the output shows a failed test, or if it holds no summary at all;
// 2 if the input cannot be read or a summary line cannot be parsed.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the command: args are the files to read (none: stdin); it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var inputs []io.Reader
	for _, name := range args {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(stderr, "chaosreport:", err)
			return 2
		}
		defer func() { _ = f.Close() }() // read only: nothing to lose
		inputs = append(inputs, f)
	}
	if len(inputs) == 0 {
		inputs = []io.Reader{stdin}
	}
	var run Run
	for _, in := range inputs {
		if err := run.Read(in); err != nil {
			fmt.Fprintln(stderr, "chaosreport:", err)
			return 2
		}
	}
	if err := run.Render(stdout); err != nil {
		fmt.Fprintln(stderr, "chaosreport:", err)
		return 2
	}
	if problems := run.Problems(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "chaosreport:", p)
		}
		return 1
	}
	return 0
}
