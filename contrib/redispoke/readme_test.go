package redispoke_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// README.md quotes the usage region of Example verbatim (dedented by one tab), so that its
// snippet is compiled code.
func TestREADMEQuotesTheExample(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?ms)^\t// docs:begin usage\n(.*?)^\t// docs:end\n`).FindSubmatch(src)
	require.NotNil(t, m, "example_test.go has no usage region")
	lines := strings.Split(string(m[1]), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "```go\n"+strings.Join(lines, "\n")+"```\n")
}
