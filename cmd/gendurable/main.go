// Command gendurable is gendurable's command-line tool: it migrates a schema, runs the demo and
// the benchmark suite, and operates instances.
//
//	gendurable migrate [--target N] [--print [--from N]]
//	gendurable demo    [--n N] [--keep]
//	gendurable bench   [--scenario NAME]... [--n N] [--json]
//	gendurable queues  [--live-only] [--json]
//	gendurable list    [--queue Q] [--machine M] [--status S,..] [--key K] [--since 1h] [--paused] [--before ID] [--json]
//	gendurable show    ID | --machine M KEY [--json]
//	gendurable signal  ID|--machine M KEY NAME [JSON]
//	gendurable retry   ID|--machine M KEY [--step S]
//	gendurable cancel  ID|--machine M KEY [--reason R]
//	gendurable bulk    retry|cancel|delete [--machine M] [--step S] [--status S,..] [--error TEXT] [--since T] [--until T] [--key-prefix P] [--all] [--yes]
//	gendurable machine [NAME] [--sample N] [--json]
//	gendurable pause   queue Q | machine M | ID | --machine M KEY [--reason R]
//	gendurable resume  queue Q | machine M | ID | --machine M KEY
//	gendurable pauses  [--json]
//	gendurable upgrade --machine M [--no-wait] [--timeout 10m]
//	gendurable schedules [list] [--json] | schedules pause|resume|trigger|remove NAME
//	gendurable ui      [--addr 127.0.0.1:8080] [--read-only] [--token T]
//
// Every command takes --database-url URL and --schema S.
//
// The database is --database-url, else $DATABASE_URL, else a server on 127.0.0.1:5432, else (for
// demo and bench) a throwaway cluster started from the Postgres binaries on this machine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5/pgxpool"
)

type command struct {
	name, usage, summary string
	run                  func(ctx context.Context, args []string, out io.Writer) error
}

func commands() []command {
	return []command{
		{"migrate", "migrate [--target N] [--print [--from N]]", "show the schema's version and migrate it (or print the SQL)", runMigrate},
		{"demo", "demo [--n N] [--keep]", "run an order-processing workflow over a few thousand instances", runDemo},
		{"bench", "bench [--scenario NAME]... [--n N] [--concurrency C] [--clients K] [--preload N] [--json]", "run the benchmark suite", runBench},
		{"queues", "queues [--live-only] [--json]", "instances by queue and status, and each queue's lag", runQueues},
		{"list", "list [--queue Q] [--machine M] [--status S,..] [--key K] [--since 1h] [--paused] [--limit N] [--before ID] [--json]", "list instances, newest first", runList},
		{"show", "show ID | show --machine M KEY [--json]", "one instance: state, path, errors, inbox, children", runShow},
		{"signal", "signal ID|--machine M KEY NAME [JSON]", "send a signal", runSignal},
		{"retry", "retry ID|--machine M KEY [--step S]", "make a failed or cancelled instance runnable again", runRetry},
		{"cancel", "cancel ID|--machine M KEY [--reason R]", "cancel a live instance", runCancel},
		{"bulk", "bulk retry|cancel|delete [--machine M] [--queue Q] [--step S] [--status S,..] [--error TEXT] [--since T] [--until T] [--key-prefix P] [--all] [--yes]", "count, then retry, cancel or delete the instances a filter matches, in batches", runBulk},
		{"machine", "machine [NAME] [--sample N] [--json]", "list the machines, or draw one as the graph of its steps: live instances per step, transitions taken", runMachine},
		{"pause", "pause queue Q | machine M | ID | --machine M KEY [--reason R]", "stop every node claiming a queue's, a machine's or one instance's rows", func(ctx context.Context, args []string, out io.Writer) error { return runPause(ctx, args, out, true) }},
		{"resume", "resume queue Q | machine M | ID | --machine M KEY", "undo a pause", func(ctx context.Context, args []string, out io.Writer) error { return runPause(ctx, args, out, false) }},
		{"pauses", "pauses [--json]", "list the paused queues and machines", runPauses},
		{"upgrade", "upgrade --machine M [--no-wait] [--timeout 10m]", "bring a machine's parked instances forward to its newest version, in bulk", runUpgrade},
		{"schedules", "schedules [list] [--json] | schedules pause|resume|trigger|remove NAME", "list the schedules (next fire, last fire and its instance), or act on one", runSchedules},
		{"doctor", "doctor [--json] [--old-transaction 5m] [--lock-wait 5s] [--reaper-grace 1m] [--connections 0.9] [--notify-queue 0.5] [--slot-wal 1GB]", "check the database for what keeps the engine's tables healthy and its work moving (exit status 1 on a problem, 3 when it could not check)", runDoctor},
		{"ui", "ui [--addr 127.0.0.1:8080] [--read-only] [--token T]", "serve the web dashboard of a schema", runUI},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(errOut)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], out)
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			if err != nil {
				fmt.Fprintf(errOut, "gendurable %s: %v\n", c.name, err)
				if ee := (*exitError)(nil); errors.As(err, &ee) {
					return ee.code
				}
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(errOut, "gendurable: unknown command %q\n\n", args[0])
	usage(errOut)
	return 2
}

// exitError is a command's error with an exit status other than 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usage(w io.Writer) {
	fmt.Fprintln(w, "gendurable: durable state machines on Postgres\n\nUsage:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  gendurable %s\n      %s\n", c.usage, c.summary)
	}
	fmt.Fprintln(w, "\nEvery command takes --database-url URL and --schema S. The database is --database-url, else\n$DATABASE_URL, else 127.0.0.1:5432, else (demo, bench) a throwaway cluster.")
}

// dbFlags are the flags every command that talks to Postgres takes.
type dbFlags struct {
	url    string
	schema string
}

func (d *dbFlags) register(fs *flag.FlagSet, defSchema string) {
	fs.StringVar(&d.url, "database-url", "", "Postgres connection string (default $DATABASE_URL, else 127.0.0.1:5432)")
	fs.StringVar(&d.schema, "schema", defSchema, "schema name")
}

// open connects to the database the flags name, or resolves one. throwaway allows starting a
// temporary cluster when nothing else is reachable; close releases both.
func (d *dbFlags) open(ctx context.Context, throwaway bool, log io.Writer) (*pgxpool.Pool, func(), error) {
	url := d.url
	var db *devdb.DB
	if url == "" {
		var err error
		db, err = devdb.Resolve(ctx, devdb.Options{Log: log, NoInstall: !throwaway, SkipLocal: false})
		if err != nil {
			return nil, nil, err
		}
		if !throwaway && db.Source != "DATABASE_URL" && db.Source != "127.0.0.1:5432" {
			_ = db.Close()
			return nil, nil, errors.New("no Postgres reachable: pass --database-url or set DATABASE_URL")
		}
		url = db.URL
		fmt.Fprintf(log, "using Postgres from %s\n", db.Source)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("database url: %w", err)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("gd-cli-%d", os.Getpid())
	}
	if cfg.MaxConns < 20 {
		cfg.MaxConns = 20
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		_ = db.Close()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return pool, func() { pool.Close(); _ = db.Close() }, nil
}
