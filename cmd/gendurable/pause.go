package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/gendurable/gendurable"
)

const pauseUsage = "queue Q | machine M | ID | --machine M KEY"

// runPause pauses (pause true) or resumes a queue, a machine or one instance.
func runPause(ctx context.Context, args []string, out io.Writer, pause bool) error {
	verb := "resume"
	if pause {
		verb = "pause"
	}
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	machine := fs.String("machine", "", "with a correlation key instead of an id: the key's machine")
	var reason *string
	if pause {
		reason = fs.String("reason", "", "why, shown with the pause")
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 || (len(pos) == 2 && pos[0] != "queue" && pos[0] != "machine" && *machine == "") || len(pos) > 2 {
		return fmt.Errorf("usage: %s %s", verb, pauseUsage)
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	var t gendurable.PauseTarget
	switch {
	case len(pos) == 2 && pos[0] == "queue" && *machine == "":
		t.Queue = pos[1]
	case len(pos) == 2 && pos[0] == "machine" && *machine == "":
		t.Machine = pos[1]
	case len(pos) == 1:
		if t.Instance, err = target(ctx, cl, *machine, pos); err != nil {
			return err
		}
	default:
		return fmt.Errorf("usage: %s %s", verb, pauseUsage)
	}
	if pause {
		err = cl.Pause(ctx, t, *reason)
	} else {
		err = cl.Resume(ctx, t)
	}
	if err != nil {
		return err
	}
	if pause {
		fmt.Fprintf(out, "%s paused (every node stops claiming it within %v)\n", t, gendurable.PauseRefresh)
	} else {
		fmt.Fprintf(out, "%s resumed\n", t)
	}
	return nil
}

// runPauses lists the paused queues and machines.
func runPauses(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pauses", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return errors.New("usage: pauses [--json]")
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	list, err := cl.Pauses(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(out, "nothing is paused (paused instances: list --paused)")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tSINCE\tBY\tREASON")
	for _, p := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Kind, p.Name, p.At.UTC().Format(time.RFC3339), p.By, p.Reason)
	}
	return tw.Flush()
}
