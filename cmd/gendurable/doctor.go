package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gendurable/gendurable"
)

// runDoctor prints Client.Checkup's findings, problems first. Its exit status says what it
// found, so that it can gate a deploy or page someone: 0 nothing or warnings only, 1 a problem,
// 3 the checkup could not run (the database out of reach, a schema not migrated, a bad flag).
func runDoctor(ctx context.Context, args []string, out io.Writer) error {
	err := doctor(ctx, args, out)
	if err == nil || errors.Is(err, flag.ErrHelp) || errors.Is(err, errProblems) {
		return err
	}
	return &exitError{code: 3, err: err}
}

// errProblems is doctor's error when a finding is a problem (exit status 1).
var errProblems = errors.New("problems found")

func doctor(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	asJSON := fs.Bool("json", false, "print JSON")
	var opts gendurable.CheckupOpts
	fs.DurationVar(&opts.OldTransaction, "old-transaction", 0, "report transactions open longer than this (default 5m)")
	fs.DurationVar(&opts.LockWait, "lock-wait", 0, "report lock waits longer than this (default 5s)")
	fs.DurationVar(&opts.ReaperGrace, "reaper-grace", 0, "report leases and await deadlines this far past (default 1m)")
	fs.Float64Var(&opts.Connections, "connections", 0, "report connections in use past this share of what the server accepts (default 0.9)")
	fs.Float64Var(&opts.NotifyQueue, "notify-queue", 0, "report the server's NOTIFY queue past this share in use, at most 1 (default 0.5)")
	fs.Var((*walSize)(&opts.SlotWAL), "slot-wal", "report replication slots nothing reads that keep more WAL than this: bytes, or a whole number with kB, MB, GB or TB, 1024-based (default 1GB)")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	cl, done, err := opClient(ctx, &db)
	if err != nil {
		return err
	}
	defer done()
	findings, err := cl.Checkup(ctx, &opts)
	if err != nil {
		return err
	}
	problems := 0
	for _, f := range findings {
		if f.Severity == gendurable.SeverityProblem {
			problems++
		}
	}
	if *asJSON {
		if findings == nil {
			findings = []gendurable.Finding{}
		}
		if err := writeJSON(out, findings); err != nil {
			return err
		}
	} else {
		if len(findings) == 0 {
			fmt.Fprintf(out, "schema %s: nothing found\n", db.schema)
		}
		for _, f := range findings {
			fmt.Fprintf(out, "%s [%s] %s\n    fix: %s\n", f.Severity, f.Check, f.Summary, f.Fix)
		}
	}
	if problems > 0 {
		return fmt.Errorf("%w: %d of %d findings are problems", errProblems, problems, len(findings))
	}
	return nil
}

// walSize is a flag of bytes: a whole number, bytes unless it has a unit, kB, MB, GB or TB, each
// 1024 of the one before (the units postgresql.conf writes).
type walSize int64

func (w *walSize) String() string { return strconv.FormatInt(int64(*w), 10) }

func (w *walSize) Set(v string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}}
	num, mult := strings.TrimSpace(v), int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size: want a positive whole number of bytes, or one with kB, MB, GB or TB", v)
	}
	*w = walSize(n * mult)
	return nil
}
