package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durablemigrate"
)

// runMigrate prints the schema's version and the steps that bring it to the target, and applies
// them (or, with --print, prints their SQL for another migration tool).
func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	print := fs.Bool("print", false, "print the SQL of each pending step instead of applying it (for your own migration tool)")
	target := fs.Int("target", durablemigrate.Version, "the version to migrate to, up or down (default: a new schema is built at the newest; an existing one "+
		"goes up to "+fmt.Sprint(durablemigrate.Required)+" at most: the contract migrations after it run only when named here, once every node runs this library)")
	from := fs.Int("from", -1, "with --print: the schema's version, instead of reading it from the database (0: no schema yet)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *from >= 0 && !*print {
		return fmt.Errorf("--from only applies to --print")
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "target" })
	current := *from
	if current < 0 {
		pool, closeDB, err := db.open(ctx, false, os.Stderr)
		if err != nil {
			return err
		}
		defer closeDB()
		st, err := durablemigrate.Current(ctx, pool, db.schema)
		if err != nil {
			return err
		}
		current = st.Version
		if !explicit {
			*target = durablemigrate.DefaultTarget(current)
		}
		steps, err := durablemigrate.Plan(current, *target)
		if err != nil {
			return err
		}
		if !*print {
			describe(out, db.schema, current, *target, steps)
			if len(steps) == 0 {
				contractHint(out, explicit, *target)
				return nil
			}
			if err := apply(ctx, out, pool, db.schema, current, *target, steps); err != nil {
				return err
			}
			fmt.Fprintf(out, "schema %q is at version %d\n", db.schema, *target)
			contractHint(out, explicit, *target)
			return nil
		}
	}
	if !explicit {
		*target = durablemigrate.DefaultTarget(current)
	}
	steps, err := durablemigrate.Plan(current, *target)
	if err != nil {
		return err
	}
	if !explicit && *target < durablemigrate.Version {
		fmt.Fprintf(out, "-- versions %d to %d (contract migrations) are left out: once every node runs this library, "+
			"print them with --target %d\n", *target+1, durablemigrate.Version, durablemigrate.Version)
	}
	for _, s := range steps {
		sql, err := s.SQL(db.schema)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "-- gendurable schema version %d: %s (%s), in one transaction\n%s\n", s.Version, s.Name, direction(s), sql)
	}
	return nil
}

// apply migrates the schema to target. A schema that exists goes one step at a time, each
// reported as it is applied (a step may wait for its locks, or build an index concurrently, for
// minutes: the last line printed says how far it got); one that does not is created at once.
func apply(ctx context.Context, out io.Writer, pool durablemigrate.DB, schema string, current, target int, steps []durablemigrate.Step) error {
	if current == 0 {
		return durablemigrate.MigrateTo(ctx, pool, schema, target)
	}
	for _, s := range steps {
		to := s.Version
		if s.Down {
			to = s.Version - 1
		}
		began := time.Now()
		if err := durablemigrate.MigrateTo(ctx, pool, schema, to); err != nil {
			return err
		}
		fmt.Fprintf(out, "applied %d %s (%s) in %v\n", s.Version, s.Name, direction(s), time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// contractHint says, after a migration to target that no --target chose, how to apply the
// contract migrations that wait.
func contractHint(out io.Writer, explicit bool, target int) {
	if !explicit && target < durablemigrate.Version {
		fmt.Fprintf(out, "versions %d to %d remove what libraries before this one read: once every node runs this library, "+
			"run gendurable migrate --target %d\n", target+1, durablemigrate.Version, durablemigrate.Version)
	}
}

func direction(s durablemigrate.Step) string {
	if s.Down {
		return "down to " + fmt.Sprint(s.Version-1)
	}
	return "up"
}

// describe prints where the schema is and the steps to the target.
func describe(out io.Writer, schema string, current, target int, steps []durablemigrate.Step) {
	state := fmt.Sprintf("version %d", current)
	if current == 0 {
		state = "not created yet"
	}
	fmt.Fprintf(out, "schema %q: %s; this library knows versions 1 to %d\n", schema, state, durablemigrate.Version)
	if len(steps) == 0 {
		fmt.Fprintf(out, "nothing to do: the schema is at version %d\n", target)
		return
	}
	var names []string
	for _, s := range steps {
		names = append(names, fmt.Sprintf("%d %s (%s)", s.Version, s.Name, direction(s)))
	}
	fmt.Fprintf(out, "pending: %s\n", strings.Join(names, ", "))
}
