package store

import (
	"context"
	"fmt"
	"regexp"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Named arguments. pgx turns a statement's @names into $1, $2, … by scanning its text, rune by
// rune, on every call; for the pick's and the outcome batch's texts of several kilobytes that
// scan cost the client 17–50 µs of CPU a statement (docs/PERFORMANCE.md). The hot statements
// pass their arguments through Store.named instead: each distinct text is scanned once per Store,
// and a call only puts its arguments in order.

// rewrites caches, per statement text, the text with positional parameters and the name of each.
// The texts are the Store's statements and the outcome batch's assemblies of its fragments: a
// bounded set.
type rewrites struct {
	m sync.Map // statement text → *rewrite
}

type rewrite struct {
	sql   string   // the text with $1, $2, … in place of the names
	names []string // the name of each $n, in order
}

// namedArgs is pgx.NamedArgs rewritten through the Store's cache (a pgx.QueryRewriter, which pgx
// applies to the text it is passed with, in Query, Exec and a Batch alike).
type namedArgs struct {
	r    *rewrites
	args pgx.NamedArgs
}

// named returns args for a statement run with them as its only argument.
func (s *Store) named(args pgx.NamedArgs) pgx.QueryRewriter {
	return namedArgs{r: s.rewrites, args: args}
}

// RewriteQuery implements pgx.QueryRewriter: missing names are NULL, as with pgx.NamedArgs.
func (n namedArgs) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, _ []any) (string, []any, error) {
	rw, err := n.r.get(ctx, conn, sql)
	if err != nil {
		return "", nil, err
	}
	out := make([]any, len(rw.names))
	for i, name := range rw.names {
		out[i] = n.args[name]
	}
	return rw.sql, out, nil
}

// argName matches every @name pgx could take for an argument, and some it does not (in comments
// and literals).
var argName = regexp.MustCompile(`@[A-Za-z_][A-Za-z0-9_]*`)

// mark stands for the i-th candidate name while pgx's own scan decides which are arguments.
type mark int

func (r *rewrites) get(ctx context.Context, conn *pgx.Conn, sql string) (*rewrite, error) {
	if v, ok := r.m.Load(sql); ok {
		return v.(*rewrite), nil
	}
	// pgx's scan decides which candidates are arguments and numbers them: each candidate goes
	// in as a mark of its own, and the marks come back in $n order.
	var cands []string
	marks := pgx.NamedArgs{}
	for _, c := range argName.FindAllString(sql, -1) {
		if _, seen := marks[c[1:]]; !seen {
			marks[c[1:]] = mark(len(cands))
			cands = append(cands, c[1:])
		}
	}
	text, ordered, err := marks.RewriteQuery(ctx, conn, sql, nil)
	if err != nil {
		return nil, err
	}
	rw := &rewrite{sql: text, names: make([]string, len(ordered))}
	for i, v := range ordered {
		m, ok := v.(mark)
		if !ok {
			return nil, fmt.Errorf("store: argument $%d of a statement is not one of its @names", i+1)
		}
		rw.names[i] = cands[m]
	}
	v, _ := r.m.LoadOrStore(sql, rw)
	return v.(*rewrite), nil
}
