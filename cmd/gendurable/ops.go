package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durablemigrate"
)

// The operator's commands: queues, list, show, signal, retry, cancel. Each opens the database,
// builds a client that is never started (it only reads and acts), and prints a table, or JSON
// with --json.

// parseInterspersed parses flags that may come before, between or after the positional
// arguments, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// opClient opens the database and a client on the flags' schema; done releases both.
func opClient(ctx context.Context, db *dbFlags) (*gendurable.Client, func(), error) {
	pool, closeDB, err := db.open(ctx, false, io.Discard)
	if err != nil {
		return nil, nil, err
	}
	codec, err := codecFromEnv()
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	cl, err := gendurable.NewClient(pool, &gendurable.Config{Name: "cli", Schema: db.schema, Logger: quietLogger(), Codec: codec})
	if err == nil {
		err = durablemigrate.Check(ctx, pool, db.schema)
	}
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	return cl, closeDB, nil
}

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// rawJSON shows a stored document as JSON (not base64) in --json output.
func rawJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	return json.RawMessage(b)
}

func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

var statusOrder = []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting, gendurable.StatusAwaiting,
	gendurable.StatusJoining, gendurable.StatusDone, gendurable.StatusFailed, gendurable.StatusCancelled}

func runQueues(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("queues", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	asJSON := fs.Bool("json", false, "print JSON")
	live := fs.Bool("live-only", false, "count only available and executing rows (the parked statuses read every parked row)")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	opts := &gendurable.QueueStatsOpts{}
	if *live {
		opts.Statuses = []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting}
	}
	stats, err := cl.QueueStats(ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		type row struct {
			Queue            string                      `json:"queue"`
			Counts           map[gendurable.Status]int64 `json:"counts"`
			Runnable         int64                       `json:"runnable"`
			OldestRunnableMS int64                       `json:"oldest_runnable_ms"`
			Paused           bool                        `json:"paused,omitempty"`
		}
		rows := make([]row, len(stats))
		for i, s := range stats {
			rows[i] = row{s.Queue, s.Counts, s.Runnable, s.OldestRunnable.Milliseconds(), s.Paused}
		}
		return writeJSON(out, rows)
	}
	if len(stats) == 0 {
		fmt.Fprintln(out, "no instances")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"queue", "runnable"}
	var shown []gendurable.Status
	for _, s := range statusOrder {
		if _, ok := stats[0].Counts[s]; ok {
			shown = append(shown, s)
			header = append(header, string(s))
		}
	}
	header = append(header, "oldest runnable")
	fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	for _, s := range stats {
		name := s.Queue
		if s.Paused {
			name += " (paused)"
		}
		cells := []string{name, strconv.FormatInt(s.Runnable, 10)}
		for _, st := range shown {
			cells = append(cells, strconv.FormatInt(s.Counts[st], 10))
		}
		cells = append(cells, age(s.OldestRunnable))
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	return tw.Flush()
}

// sinceFlag accepts a duration ("1h": that long ago) or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: a positive duration (90m) or an RFC 3339 time (2026-11-29T10:00:00Z)", s)
}

func runList(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	queue := fs.String("queue", "", "only this queue")
	machine := fs.String("machine", "", "only this machine")
	statuses := fs.String("status", "", "only these statuses, comma-separated (available,executing,awaiting,joining,done,failed,cancelled)")
	key := fs.String("key", "", "only this correlation key (with --machine: an index lookup)")
	since := fs.String("since", "", "only instances inserted since: a duration (1h) or an RFC 3339 time")
	paused := fs.Bool("paused", false, "only instances paused one by one (pause ID)")
	before := fs.Int64("before", 0, "page cursor: instances with a smaller id (printed after each page)")
	limit := fs.Int("limit", gendurable.DefaultListLimit, "page size (at most 1000)")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	opts := &gendurable.ListOpts{Queue: *queue, Machine: *machine, CorrelationKey: *key, Paused: *paused, Before: *before, Limit: *limit}
	if *statuses != "" {
		for _, s := range strings.Split(*statuses, ",") {
			opts.Statuses = append(opts.Statuses, gendurable.Status(strings.TrimSpace(s)))
		}
	}
	var err error
	if opts.Since, err = parseSince(*since, time.Now()); err != nil {
		return err
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	page, err := cl.List(ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, page)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMACHINE\tSTEP\tQUEUE\tSTATUS\tATTEMPT\tKEY\tUPDATED\tLAST ERROR")
	for _, in := range page.Instances {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", in.ID, in.Machine, in.Step, in.Queue, in.Status,
			in.Attempt, in.MaxAttempts, in.CorrelationKey, in.UpdatedAt.Format(time.RFC3339), oneLine(in.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != 0 {
		fmt.Fprintf(out, "more: --before %d\n", page.Next)
	}
	return nil
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// target resolves "ID" or "--machine M KEY" to an instance id.
func target(ctx context.Context, cl *gendurable.Client, machine string, pos []string) (int64, error) {
	if len(pos) == 0 {
		return 0, errors.New("name the instance: an id, or --machine M and a correlation key")
	}
	if machine == "" {
		id, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id <= 0 {
			return 0, fmt.Errorf("%q is not an instance id (for a correlation key, add --machine)", pos[0])
		}
		return id, nil
	}
	page, err := cl.List(ctx, &gendurable.ListOpts{Machine: machine, CorrelationKey: pos[0], Limit: 1})
	if err != nil {
		return 0, err
	}
	if len(page.Instances) == 0 {
		return 0, fmt.Errorf("%w: machine %q has no instance with key %q", gendurable.ErrNotFound, machine, pos[0])
	}
	return page.Instances[0].ID, nil
}

func runShow(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	machine := fs.String("machine", "", "with a correlation key instead of an id: the key's machine (the newest instance)")
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
	id, err := target(ctx, cl, *machine, pos)
	if err != nil {
		return err
	}
	d, err := cl.Inspect(ctx, id, nil)
	if err != nil {
		return err
	}
	why, err := cl.Explain(ctx, id)
	if err != nil {
		return err
	}
	in := &d.Instance
	if *asJSON {
		type signal struct {
			ID      int64           `json:"id"`
			Name    string          `json:"name"`
			Payload json.RawMessage `json:"payload,omitempty"`
			At      time.Time       `json:"at"`
		}
		inbox := make([]signal, len(d.Inbox))
		for i, s := range d.Inbox {
			inbox[i] = signal{s.ID, s.Name, rawJSON(s.Payload), s.At}
		}
		return writeJSON(out, map[string]any{
			"id": in.ID, "machine": in.Machine, "step": in.Step, "queue": in.Queue, "status": in.Status,
			"priority": in.Priority, "attempt": in.Attempt, "max_attempts": in.MaxAttempts,
			"scheduled_at": in.ScheduledAt, "locked_by": in.LockedBy, "locked_until": in.LockedUntil,
			"state": rawJSON(in.State), "result": rawJSON(in.Result), "errors": in.Errors,
			"correlation_key": in.CorrelationKey, "await_names": in.AwaitNames, "await_deadline": in.AwaitDeadline,
			"parent_id": in.ParentID, "path": in.Path, "inserted_at": in.InsertedAt, "updated_at": in.UpdatedAt,
			"finalized_at": in.FinalizedAt, "inbox": inbox, "inbox_size": d.InboxSize, "children": d.Children,
			"child_counts": d.ChildCounts, "machine_version": in.MachineVersion, "upgrades": in.Upgrades,
			"blocked": d.Blocked, "paused_at": d.PausedAt, "why": why, "codec_error": in.CodecError,
		})
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	kv := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	kv("id", in.ID)
	kv("machine", fmt.Sprintf("%s (version %d)", in.Machine, in.MachineVersion))
	kv("status", in.Status)
	if in.CodecError != "" {
		kv("sealed", in.CodecError+" (sealed values are shown as stored; set "+keysEnv+")")
	}
	kv("why", why.Text)
	if d.Blocked != "" && why.Reason != gendurable.ExplainBlocked {
		kv("blocked", d.Blocked)
	}
	if d.PausedAt != nil {
		kv("paused", "since "+d.PausedAt.UTC().Format(time.RFC3339)+" (resume ID)")
	}
	kv("step", fmt.Sprintf("%s (attempt %d of %d)", in.Step, in.Attempt, in.MaxAttempts))
	if in.Recoveries > 0 {
		kv("recovered", fmt.Sprintf("%d lost claims of this step (crashed or stalled workers; no attempt spent)", in.Recoveries))
	}
	path := slices.Clone(in.Path)
	if !in.Status.Terminal() {
		path = append(path, "["+in.Step+"]") // where it is now
	}
	kv("path", strings.Join(path, " → "))
	kv("queue", fmt.Sprintf("%s (priority %d)", in.Queue, in.Priority))
	if in.CorrelationKey != "" {
		kv("key", in.CorrelationKey)
	}
	if in.ParentID != nil {
		kv("parent", *in.ParentID)
	}
	if in.LockedBy != "" {
		kv("claimed by", fmt.Sprintf("%s until %s", in.LockedBy, in.LockedUntil.Format(time.RFC3339Nano)))
	}
	if len(in.AwaitNames) > 0 {
		dl := "no deadline"
		if in.AwaitDeadline != nil {
			dl = "deadline " + in.AwaitDeadline.Format(time.RFC3339)
		}
		kv("awaits", strings.Join(in.AwaitNames, ", ")+" ("+dl+")")
	}
	for _, u := range in.Upgrades {
		kv("upgraded", fmt.Sprintf("version %d → %d, step %s → %s, %s by %s", u.From, u.To, u.StepFrom, u.StepTo,
			u.At.Format(time.RFC3339), u.By))
	}
	kv("scheduled", in.ScheduledAt.Format(time.RFC3339Nano))
	kv("inserted", in.InsertedAt.Format(time.RFC3339Nano))
	kv("updated", in.UpdatedAt.Format(time.RFC3339Nano))
	if in.FinalizedAt != nil {
		kv("finished", in.FinalizedAt.Format(time.RFC3339Nano))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	section := func(title string, b []byte) {
		if len(b) == 0 {
			return
		}
		var buf strings.Builder
		var v any
		if json.Unmarshal(b, &v) == nil {
			pretty, _ := json.MarshalIndent(v, "  ", "  ")
			buf.Write(pretty)
		} else {
			buf.Write(b)
		}
		fmt.Fprintf(out, "\n%s:\n  %s\n", title, buf.String())
	}
	section("state", in.State)
	section("result", in.Result)
	if len(in.Errors) > 0 {
		fmt.Fprintf(out, "\nerrors (oldest first):\n")
		for _, e := range in.Errors {
			fmt.Fprintf(out, "  %s  %s#%d  %s  %s\n", e.At.Format(time.RFC3339), e.Step, e.Attempt, e.Kind, oneLine(e.Error, 200))
		}
	}
	if d.InboxSize > 0 {
		fmt.Fprintf(out, "\ninbox (%d):\n", d.InboxSize)
		for _, s := range d.Inbox {
			fmt.Fprintf(out, "  #%d  %s  %s  %s\n", s.ID, s.At.Format(time.RFC3339), s.Name, oneLine(string(s.Payload), 120))
		}
	}
	if len(d.ChildCounts) > 0 {
		var parts []string
		for _, st := range statusOrder {
			if n := d.ChildCounts[st]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, st))
			}
		}
		fmt.Fprintf(out, "\nchildren (%s):\n", strings.Join(parts, ", "))
		for _, c := range d.Children {
			fmt.Fprintf(out, "  %d  %s  %s  %s  wave %d  %s\n", c.ID, c.Machine, c.Step, c.Status, c.Wave, oneLine(c.Error, 80))
		}
	}
	return nil
}

func runSignal(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("signal", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	machine := fs.String("machine", "", "address the live instance of this machine by correlation key instead of an id")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 || len(pos) > 3 {
		return errors.New("usage: signal ID|--machine M KEY NAME [JSON payload]")
	}
	var payload any
	if len(pos) == 3 {
		var raw json.RawMessage
		if err := json.Unmarshal([]byte(pos[2]), &raw); err != nil {
			return fmt.Errorf("the payload is not JSON: %w", err)
		}
		payload = raw
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	var t gendurable.Target
	if *machine != "" {
		t = gendurable.ByKey(*machine, pos[0])
	} else {
		id, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("%q is not an instance id (for a correlation key, add --machine)", pos[0])
		}
		t = gendurable.ByID(id)
	}
	res, err := cl.Signal(ctx, t, pos[1], payload)
	if err != nil {
		return err
	}
	woke := "stored in its inbox"
	if res.Woke {
		woke = "woke it"
	}
	fmt.Fprintf(out, "signal %d %q delivered to instance %d: %s\n", res.SignalID, pos[1], res.InstanceID, woke)
	return nil
}

// runAction runs an action on one instance named by id or by --machine and key: the flags and
// the opening shared by retry and cancel; extra registers the action's own flags.
func runAction(ctx context.Context, name string, args []string, out io.Writer, extra func(fs *flag.FlagSet),
	act func(ctx context.Context, cl *gendurable.Client, id int64) (string, error)) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	machine := fs.String("machine", "", "with a correlation key instead of an id: the key's machine")
	extra(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	id, err := target(ctx, cl, *machine, pos)
	if err != nil {
		return err
	}
	msg, err := act(ctx, cl, id)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, msg)
	return nil
}

func runRetry(ctx context.Context, args []string, out io.Writer) error {
	var step *string
	return runAction(ctx, "retry", args, out,
		func(fs *flag.FlagSet) {
			step = fs.String("step", "", "the step to resume at (default: the step it stopped at)")
		},
		func(ctx context.Context, cl *gendurable.Client, id int64) (string, error) {
			return fmt.Sprintf("instance %d is runnable again", id), cl.Retry(ctx, id, &gendurable.RetryOpts{Step: *step})
		})
}

func runCancel(ctx context.Context, args []string, out io.Writer) error {
	var reason *string
	return runAction(ctx, "cancel", args, out,
		func(fs *flag.FlagSet) {
			reason = fs.String("reason", "cancelled from the command line", "recorded in the instance's error history")
		},
		func(ctx context.Context, cl *gendurable.Client, id int64) (string, error) {
			return fmt.Sprintf("instance %d cancelled", id), cl.Cancel(ctx, id, *reason)
		})
}
