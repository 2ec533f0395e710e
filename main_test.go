package gendurable_test

import (
	"os"
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
)

func TestMain(m *testing.M) {
	if os.Getenv("GD_HELPER") != "" {
		// The test binary re-executed as a worker process (crash tests).
		os.Exit(helperMain())
	}
	durabledbtest.Main(m)
}
