package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gendurable/gendurable"
)

// runSchedules lists the schedules, or acts on one: pause, resume, trigger, remove.
func runSchedules(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("schedules", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	action := "list"
	if len(pos) > 0 {
		action = pos[0]
	}
	switch {
	case action == "list" && len(pos) <= 1:
	case (action == "pause" || action == "resume" || action == "trigger" || action == "remove") && len(pos) == 2:
	default:
		return errors.New("usage: schedules [list] | schedules pause|resume|trigger|remove NAME")
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	switch action {
	case "pause":
		if err := cl.PauseSchedule(ctx, pos[1]); err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %q paused\n", pos[1])
		return nil
	case "resume":
		if err := cl.ResumeSchedule(ctx, pos[1]); err != nil {
			return err
		}
		s, err := cl.GetSchedule(ctx, pos[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %q resumed; next fire %s\n", pos[1], s.NextFireAt.UTC().Format(time.RFC3339))
		return nil
	case "trigger":
		id, err := cl.TriggerSchedule(ctx, pos[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %q fired: instance %d\n", pos[1], id)
		return nil
	case "remove":
		if err := cl.RemoveSchedule(ctx, pos[1]); err != nil {
			return err
		}
		fmt.Fprintf(out, "schedule %q removed (its instances stay)\n", pos[1])
		return nil
	}
	list, err := cl.Schedules(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(out, "no schedules")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "name\tmachine\twhen\toverlap\tnext fire\tlast fire\tlast instance\tfired\tskipped\tstate\t")
	for _, s := range list {
		state := "active"
		if s.Paused {
			state = "paused"
		}
		if s.LastError != "" {
			state += "; failing: " + oneLine(s.LastError, 60)
		}
		last, inst := "-", "-"
		if s.LastFireAt != nil {
			last = s.LastFireAt.UTC().Format(time.RFC3339)
		}
		if s.LastInstanceID != nil {
			inst = fmt.Sprint(*s.LastInstanceID)
			if s.LastStatus != "" {
				inst += " (" + string(s.LastStatus) + ")"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t\n", s.Name, s.Machine, when(s), s.Overlap,
			s.NextFireAt.UTC().Format(time.RFC3339), last, inst, s.Fired, s.Skipped, state)
	}
	return tw.Flush()
}

// when is a schedule's timing as a user wrote it.
func when(s gendurable.ScheduleInfo) string {
	if s.Every > 0 {
		return "every " + s.Every.String()
	}
	w := s.Cron
	if s.TimeZone != "" {
		w += " " + s.TimeZone
	}
	return strings.TrimSpace(w)
}
