package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

// runUpgrade asks the running nodes for a bulk upgrade of a machine's instances and, unless told
// not to, waits for the node that takes it to finish, printing its progress.
func runUpgrade(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("upgrade", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	machine := fs.String("machine", "", "the machine whose instances to bring forward to the newest version a running node knows")
	noWait := fs.Bool("no-wait", false, "record the request and return; a running node works it")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the request to finish")
	poll := fs.Duration("poll", time.Second, "how often to read the request's progress")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if *machine == "" || len(pos) > 0 {
		return errors.New("upgrade: name the machine with --machine M (and nothing else)")
	}
	if *timeout <= 0 || *poll <= 0 {
		return errors.New("upgrade: --timeout and --poll must be positive")
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	id, err := cl.RequestUpgrade(ctx, *machine)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "upgrade request %d for machine %q recorded\n", id, *machine)
	if *noWait {
		return nil
	}
	deadline := time.Now().Add(*timeout)
	var last string
	for {
		r, err := cl.UpgradeRequestStatus(ctx, id)
		if err != nil {
			return err
		}
		line := "waiting for a running node that registers the machine at its newest version"
		if r.TakenBy != "" {
			line = fmt.Sprintf("%s: %d upgraded to version %d, %d blocked", r.TakenBy, r.Upgraded, r.Version, r.Blocked)
		}
		if r.FinishedAt != nil {
			fmt.Fprintln(out, line)
			if r.Error != "" {
				return fmt.Errorf("upgrade request %d stopped: %s", id, r.Error)
			}
			if r.Blocked > 0 {
				fmt.Fprintf(out, "%d instances could not be brought forward: `gendurable show` and the dashboard's stuck page say why\n", r.Blocked)
			}
			return nil
		}
		if line != last {
			fmt.Fprintln(out, line)
			last = line
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("upgrade request %d not finished after %v (it stays recorded; a running node works it)", id, *timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(*poll):
		}
	}
}
