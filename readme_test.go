package gendurable_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The README's program is examples/signup/main.go, which its own test runs: keep them the same.
func TestREADMEShowsTheTestedExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	prog, err := os.ReadFile("examples/signup/main.go")
	require.NoError(t, err)
	require.True(t, strings.Contains(string(readme), "```go\n"+string(prog)+"```"),
		"README.md must show examples/signup/main.go verbatim")
	// Exactly two set-up commands.
	require.Contains(t, string(readme), "make demo")
	require.Contains(t, string(readme), "make test")
}
