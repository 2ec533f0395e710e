package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
)

// runBulk retries, cancels or deletes the instances a filter matches: a dry run (the count)
// unless --yes.
func runBulk(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bulk", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	var f gendurable.BulkFilter
	fs.StringVar(&f.Queue, "queue", "", "only this queue")
	fs.StringVar(&f.Machine, "machine", "", "only this machine")
	fs.StringVar(&f.Step, "step", "", "only instances at (or stopped at) this step")
	statuses := fs.String("status", "", "only these statuses, comma-separated (within the action's own)")
	fs.StringVar(&f.ErrorContains, "error", "", "only instances whose last error contains this text (any case)")
	since := fs.String("since", "", "only instances inserted since: a duration (1h) or an RFC 3339 time")
	until := fs.String("until", "", "only instances inserted before: a duration back (30m) or an RFC 3339 time")
	fs.StringVar(&f.KeyPrefix, "key-prefix", "", "only correlation keys that begin with this")
	fs.BoolVar(&f.All, "all", false, "confirm a filter that matches every instance")
	yes := fs.Bool("yes", false, "apply the action (without it: count what it would change)")
	reason := fs.String("reason", "", "recorded in each cancelled instance's error history")
	step := fs.String("at-step", "", "the step retried instances resume at (default the one each stopped at)")
	batch := fs.Int("batch", gendurable.DefaultBulkBatch, "instances per transaction")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: bulk retry|cancel|delete [filters] [--yes]")
	}
	action := gendurable.BulkAction(pos[0])
	if *statuses != "" {
		for _, s := range strings.Split(*statuses, ",") {
			f.Statuses = append(f.Statuses, gendurable.Status(strings.TrimSpace(s)))
		}
	}
	now := time.Now()
	if f.Since, err = parseSince(*since, now); err != nil {
		return err
	}
	if f.Until, err = parseSince(*until, now); err != nil {
		return err
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	opts := &gendurable.BulkOpts{DryRun: true, Reason: *reason, Step: *step, BatchSize: *batch}
	dry, err := cl.Bulk(ctx, action, f, opts)
	if err != nil {
		return err
	}
	if !*yes {
		fmt.Fprintf(out, "%d instances match: %s them with --yes\n", dry.Matched, action)
		return nil
	}
	fmt.Fprintf(out, "%d instances match; %s them, %d per transaction\n", dry.Matched, action, *batch)
	opts.DryRun = false
	res, err := cl.Bulk(ctx, action, f, opts)
	if res != nil {
		fmt.Fprintf(out, "%s: %d changed, %d skipped (their status changed, or they cannot be), in %d batches\n",
			action, res.Changed, res.Skipped, res.Batches)
	}
	if err != nil {
		return fmt.Errorf("%w (every batch before it is applied; the rest untouched: run the command again to finish)", err)
	}
	return nil
}
