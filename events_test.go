package gendurable_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/events.md is the catalogue of events: every EventName constant in durabletype has an
// entry (a "### `name`" section saying when it fires, what it measures and what it names), and
// every entry is an event that exists.
func TestEventCatalogueCoversEveryEvent(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "durabletype/event.go", nil, 0)
	require.NoError(t, err)
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if id, ok := spec.Type.(*ast.Ident); !ok || id.Name != "EventName" {
			return true
		}
		for _, v := range spec.Values {
			lit, ok := v.(*ast.BasicLit)
			require.True(t, ok, "an EventName constant that is not a string literal")
			s, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			names = append(names, s)
		}
		return true
	})
	require.GreaterOrEqual(t, len(names), 17, "the parse found the constants")

	doc, err := os.ReadFile("docs/events.md")
	require.NoError(t, err)
	sections := map[string]string{}
	heading := regexp.MustCompile("(?m)^### `([^`]+)`\n")
	locs := heading.FindAllStringSubmatchIndex(string(doc), -1)
	for i, loc := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		if next := strings.Index(string(doc[loc[1]:end]), "\n## "); next >= 0 {
			end = loc[1] + next
		}
		sections[string(doc[loc[2]:loc[3]])] = string(doc[loc[1]:end])
	}
	for _, name := range names {
		body, ok := sections[name]
		require.True(t, ok, "docs/events.md has no entry for the event %q", name)
		for _, part := range []string{"**When**", "**Measurements**", "**Fields**"} {
			require.Contains(t, body, part, "the entry for %q says nothing under %s", name, part)
		}
	}
	for name := range sections {
		require.True(t, slices.Contains(names, name), "docs/events.md describes %q, which is not an event", name)
	}
}
