// Package store is the only home of gendurable's runtime SQL. Statements live in sql/*.sql, one
// file per statement family, each with a comment saying which locks it takes and why, and one Go
// file beside each (insert.go beside insert.sql, …) runs them. The schema is written {schema} in
// the files and substituted once per Store as a quoted identifier; every value is a bound
// parameter. Methods run on a DB: a pool, a connection or a caller's transaction.
//
// The families: insert (Insert*, and an insert that claims its row), pick (the claim of a batch,
// with admission against gates and rate limits), outcome (group commit of step outcomes), signal
// (delivery and wake), lease (claim heartbeats, gate leases), maintenance (reaper, GC, gate
// reconciliation, buckets), inspect and list (the operator's reads), ops (cancel, retry), poke
// (LISTEN/NOTIFY), await (the await bridge's probe), session (the checks Start runs on its
// session: the search_path, the default isolation), checkup (the database's health: vacuum, the
// horizon, prepared transactions, replication slots, connections, the NOTIFY queue, invalid
// indexes, lock waits, the reaper's and the workers' backlog).
package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/ident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed sql/*.sql
var files embed.FS

// DB is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store holds the statements, expanded for one schema.
type Store struct {
	Schema string
	// Codec, when set (before the Store is shared), seals payloads before they are written and
	// opens them after they are read (codec.go).
	Codec Codec
	// ClaimRows is how many signals of a claimed row's inbox, and children of its join, a pick
	// loads with the row (0: DefaultClaimRows); LoadRest reads the rest. Set before the Store is
	// shared.
	ClaimRows int
	// WakeLockTimeout bounds DeliverSignalClaim's wait for its target's row lock (0: 100 ms).
	// Set before the Store is shared.
	WakeLockTimeout time.Duration
	// OwnTxIdleTimeout is how long a transaction of BeginOwn may sit idle between its statements
	// before the server ends its session (0: DefaultOwnTxIdleTimeout). Set before the Store is
	// shared.
	OwnTxIdleTimeout time.Duration
	stmts            map[string]string // named statements, ready to run
	frags            map[string]string // fragments without a parameter, for statements assembled per call
	// rewrites holds the hot statements' named arguments turned positional (named.go).
	rewrites *rewrites
}

// New loads the embedded statements for schema ("" is the default schema).
func New(schema string) (*Store, error) {
	schema, err := ident.Schema(schema)
	if err != nil {
		return nil, err
	}
	lib, err := load(files)
	if err != nil {
		return nil, err
	}
	// The pick variants are declared in Go (pick.go) as lists of pick.sql's fragments.
	for name, text := range pickTemplates() {
		if _, dup := lib.stmts[name]; dup {
			return nil, fmt.Errorf("store: statement %q defined twice", name)
		}
		lib.stmts[name] = text
	}
	st := &Store{Schema: schema, stmts: map[string]string{}, frags: map[string]string{}, rewrites: &rewrites{}}
	for name, text := range lib.stmts {
		if text, err = lib.expand(text, 0); err != nil {
			return nil, fmt.Errorf("store: statement %q: %w", name, err)
		}
		st.stmts[name] = ident.Expand(text, schema)
	}
	for name, f := range lib.frags {
		if f.param != "" {
			continue
		}
		text, err := lib.expand(f.text, 0)
		if err != nil {
			return nil, fmt.Errorf("store: fragment %q: %w", name, err)
		}
		st.frags[name] = ident.Expand(text, schema)
	}
	return st, nil
}

// library is the statement files as written: named statements, and fragments that statements
// (or other fragments) splice in as {{name}}, or {{name(arg)}} for a fragment declared with a
// parameter ("-- fragment: name(param)"), whose body says {{param}} where the argument goes. An
// argument is a name (a relation the fragment reads), never a value: values are bound parameters.
type library struct {
	stmts map[string]string
	frags map[string]fragment
}

type fragment struct {
	param string
	text  string
}

// load splits every file into statements ("-- name: x") and fragments ("-- fragment: x"), each
// running from its header line to the next header or the end of the file. Whole-line comments
// are dropped (they document the file); a comment after code on the same line stays.
func load(fsys fs.FS) (*library, error) {
	names, err := fs.Glob(fsys, "sql/*.sql")
	if err != nil {
		return nil, err
	}
	lib := &library{stmts: map[string]string{}, frags: map[string]fragment{}}
	for _, file := range names {
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		var name, param string
		var isFrag bool
		var buf strings.Builder
		flush := func() error {
			text := strings.TrimSpace(buf.String())
			buf.Reset()
			switch {
			case name == "":
				return nil
			case isFrag:
				if _, dup := lib.frags[name]; dup {
					return fmt.Errorf("store: %s: fragment %q defined twice", file, name)
				}
				lib.frags[name] = fragment{param: param, text: text}
			default:
				if _, dup := lib.stmts[name]; dup {
					return fmt.Errorf("store: %s: statement %q defined twice", file, name)
				}
				lib.stmts[name] = text
			}
			return nil
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			t := strings.TrimSpace(line)
			stmt, isName := strings.CutPrefix(t, "-- name:")
			frag, isFragment := strings.CutPrefix(t, "-- fragment:")
			if isName || isFragment {
				if err := flush(); err != nil {
					return nil, err
				}
				name, param, isFrag = strings.TrimSpace(stmt), "", isFragment
				if isFragment {
					name = strings.TrimSpace(frag)
					if open := strings.IndexByte(name, '('); open > 0 && strings.HasSuffix(name, ")") {
						name, param = name[:open], name[open+1:len(name)-1]
					}
				}
				continue
			}
			if name != "" && !strings.HasPrefix(t, "--") {
				buf.WriteString(line)
				buf.WriteByte('\n')
			}
		}
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return lib, nil
}

var spliceRE = regexp.MustCompile(`\{\{([a-z0-9_]+)(?:\(([a-z0-9_]+)\))?\}\}`)

// maxSpliceDepth bounds fragments within fragments (a cycle would otherwise never end).
const maxSpliceDepth = 8

// expand splices every {{fragment}} and {{fragment(arg)}} into text, recursively.
func (lib *library) expand(text string, depth int) (string, error) {
	if depth > maxSpliceDepth {
		return "", fmt.Errorf("fragments nested more than %d deep (a cycle?)", maxSpliceDepth)
	}
	var failed error
	out := spliceRE.ReplaceAllStringFunc(text, func(m string) string {
		sub := spliceRE.FindStringSubmatch(m)
		f, ok := lib.frags[sub[1]]
		switch {
		case !ok:
			failed = fmt.Errorf("undefined fragment %q", sub[1])
			return m
		case f.param == "" && sub[2] != "":
			failed = fmt.Errorf("fragment %q takes no argument", sub[1])
			return m
		case f.param != "" && sub[2] == "":
			failed = fmt.Errorf("fragment %q takes an argument (%s)", sub[1], f.param)
			return m
		}
		body := f.text
		if f.param != "" {
			// The argument replaces the parameter where the body says {{param}}, and where it
			// passes the parameter on to another fragment ({{other(param)}}).
			body = strings.ReplaceAll(body, "{{"+f.param+"}}", sub[2])
			body = strings.ReplaceAll(body, "("+f.param+")}}", "("+sub[2]+")}}")
		}
		body, err := lib.expand(body, depth+1)
		if err != nil && failed == nil {
			failed = fmt.Errorf("in %q: %w", sub[1], err)
		}
		return body
	})
	return out, failed
}

func (s *Store) sql(name string) string {
	q, ok := s.stmts[name]
	if !ok {
		panic("store: no statement " + name)
	}
	return q
}

// frag returns a fragment, for a statement assembled per call (the outcome statement).
func (s *Store) frag(name string) string {
	q, ok := s.frags[name]
	if !ok {
		panic("store: no fragment " + name)
	}
	return q
}

// Statement returns the text of a named statement as this Store runs it (for EXPLAIN in tests
// and tools).
func (s *Store) Statement(name string) string { return s.sql(name) }
