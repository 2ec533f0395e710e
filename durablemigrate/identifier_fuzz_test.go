package durablemigrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/ident"
)

// FuzzIdentifier: a schema name is either refused (ErrInvalidIdentifier from the validator, a
// *ConfigError naming Schema from NewClient, an error from SQL), or it is used as given: CREATE
// SCHEMA with the quoted name runs as exactly one command, and the name read back from
// pg_namespace is the input. The statement runs in a transaction that is rolled back.
//
//	go test -run '^$' -fuzz '^FuzzIdentifier$' -fuzztime 5m -parallel 1 ./durablemigrate
func FuzzIdentifier(f *testing.F) {
	pool := durabledbtest.Pool(f, 2)
	for _, s := range []string{"", "gendurable", "t_1", "_", "a\"; DROP SCHEMA public CASCADE; --", "pg_catalog",
		"Upper", "a b", "a.b", "a'b", "a$b", `a\b`, "é", strings.Repeat("a", 63), strings.Repeat("a", 64), "1abc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := ident.Schema(name)
		_, cerr := gendurable.NewClient(pool, &gendurable.Config{Schema: name})
		_, serr := durablemigrate.SQL(name)
		if err != nil {
			if !errors.Is(err, durabletype.ErrInvalidIdentifier) {
				t.Fatalf("refused without ErrInvalidIdentifier: %v", err)
			}
			var ce *gendurable.ConfigError
			if !errors.As(cerr, &ce) || ce.Field != "Schema" || !errors.Is(cerr, durabletype.ErrInvalidIdentifier) {
				t.Fatalf("NewClient: %v", cerr)
			}
			if !errors.Is(serr, durabletype.ErrInvalidIdentifier) {
				t.Fatalf("SQL accepted a name the validator refuses: %v", serr)
			}
			return
		}
		if cerr != nil || serr != nil {
			t.Fatalf("accepted by the validator, refused by NewClient (%v) or SQL (%v)", cerr, serr)
		}
		if name != "" && got != name {
			t.Fatalf("accepted %q as %q", name, got)
		}
		ctx := context.Background()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		pg := conn.Conn().PgConn()
		if _, err := pg.Exec(ctx, "BEGIN").ReadAll(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if _, err := pg.Exec(context.Background(), "ROLLBACK").ReadAll(); err != nil {
				t.Error(err)
			}
		}()
		// The simple protocol runs every command in the text: count them.
		res, err := pg.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident.Quote(got)).ReadAll()
		if err != nil {
			t.Fatalf("CREATE SCHEMA %s: %v", ident.Quote(got), err)
		}
		if len(res) != 1 || res[0].CommandTag.String() != "CREATE SCHEMA" {
			t.Fatalf("CREATE SCHEMA %s ran %d commands", ident.Quote(got), len(res))
		}
		var back string
		if err := conn.QueryRow(ctx, `SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname = $1`, got).Scan(&back); err != nil {
			t.Fatalf("schema %q not found after CREATE SCHEMA: %v", got, err)
		}
		if back != got {
			t.Fatalf("created %q, read back %q", got, back)
		}
	})
}
