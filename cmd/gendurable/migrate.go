package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gendurable/gendurable/durablemigrate"
)

func runMigrate(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	print := fs.Bool("print", false, "print the SQL instead of running it (for your own migration tool)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *print {
		sql, err := durablemigrate.SQL(db.schema)
		if err != nil {
			return err
		}
		_, err = io.WriteString(out, sql)
		return err
	}
	pool, closeDB, err := db.open(ctx, false, os.Stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := durablemigrate.Migrate(ctx, pool, db.schema); err != nil {
		return err
	}
	fmt.Fprintf(out, "schema %q is at version %d\n", db.schema, durablemigrate.Version)
	return nil
}
