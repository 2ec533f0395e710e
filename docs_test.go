package gendurable_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every Go snippet in the guides is compiled code: a region between "docs:begin" and "docs:end"
// markers in a test or example file (dedented by one tab; the contrib modules' tests count too),
// or a whole example program. This test keeps the guides identical to that code.
func TestGuidesQuoteCompiledCode(t *testing.T) {
	t.Parallel()
	var quotable []string
	sources, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	more, err := filepath.Glob("*/*_test.go")
	require.NoError(t, err)
	sources = append(sources, more...)
	contrib, err := filepath.Glob("contrib/*/*_test.go")
	require.NoError(t, err)
	sources = append(sources, contrib...)
	region := regexp.MustCompile(`(?ms)^[ \t]*// docs:begin \S+\n(.*?)^[ \t]*// docs:end\n`)
	for _, f := range sources {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range region.FindAllStringSubmatch(string(b), -1) {
			lines := strings.Split(m[1], "\n")
			for i, l := range lines {
				lines[i] = strings.TrimPrefix(l, "\t")
			}
			quotable = append(quotable, strings.Join(lines, "\n"))
		}
	}
	programs, err := filepath.Glob("examples/*/main.go")
	require.NoError(t, err)
	for _, p := range programs {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		quotable = append(quotable, string(b))
		for _, m := range region.FindAllStringSubmatch(string(b), -1) {
			// Top-level code: nothing to dedent, and gofmt puts a blank line before the end marker.
			quotable = append(quotable, strings.TrimRight(m[1], "\n")+"\n")
		}
	}
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	docs = append(docs, "README.md")
	block := regexp.MustCompile("(?ms)^```go\n(.*?)^```\n")
	snippets := 0
	for _, d := range docs {
		b, err := os.ReadFile(d)
		require.NoError(t, err)
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			snippets++
			found := false
			for _, q := range quotable {
				if q == m[1] {
					found = true
					break
				}
			}
			require.True(t, found, "%s: a Go snippet is not compiled code (quote a docs region or an example program):\n%s", d, m[1])
		}
	}
	require.GreaterOrEqual(t, snippets, 4)
}
