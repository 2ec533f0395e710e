package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/gendurable/gendurable"
)

// runMachine prints a machine as the graph of its steps, in text: each step with its live
// instances by status, then each transition with how many times it was taken.
func runMachine(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("machine", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	sample := fs.Int("sample", gendurable.DefaultGraphSample, "how many of the most recently finished instances' paths to read (besides every live one)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	if len(pos) == 0 {
		names, err := cl.Machines(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(out, names)
		}
		if len(names) == 0 {
			fmt.Fprintln(out, "no machine is registered")
		}
		for _, n := range names {
			fmt.Fprintln(out, n)
		}
		return nil
	}
	if len(pos) > 1 {
		return errors.New("usage: machine [NAME] [--sample N] [--json]")
	}
	g, err := cl.MachineGraph(ctx, pos[0], *sample)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, g)
	}
	printGraph(out, g)
	return nil
}

// printGraph writes g as text: the steps in the graph's order, each with its live instances and
// the transitions out of it.
func printGraph(out io.Writer, g *gendurable.MachineGraph) {
	fmt.Fprintf(out, "machine %s: %d steps, %d transitions, from the paths of %d instances\n\n", g.Machine, len(g.Steps), len(g.Edges), g.Paths)
	width := 0
	for _, s := range g.Steps {
		width = max(width, len(s.Name))
	}
	order := []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting, gendurable.StatusAwaiting, gendurable.StatusJoining}
	for _, s := range g.Steps {
		var live []string
		for _, st := range order {
			if n := s.Live[st]; n > 0 {
				live = append(live, fmt.Sprintf("%d %s", n, st))
			}
		}
		if len(live) == 0 {
			live = []string{"no live instance"}
		}
		start := ""
		if s.Starts > 0 {
			start = fmt.Sprintf("  (start of %d)", s.Starts)
		}
		fmt.Fprintf(out, "[%-*s]  %s%s\n", width, s.Name, strings.Join(live, ", "), start)
		for _, e := range g.Edges {
			if e.From == s.Name {
				fmt.Fprintf(out, "  ─→ %-*s  %d\n", width, e.To, e.Count)
			}
		}
	}
}
