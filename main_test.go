package gendurable_test

import (
	"os"
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
)

func TestMain(m *testing.M) {
	switch os.Getenv("GD_HELPER") {
	case "":
	case "chaos":
		// The test binary re-executed as a chaos worker (infrastructure-fault tests).
		os.Exit(chaosWorkerMain())
	default:
		// The test binary re-executed as a worker process (crash tests).
		os.Exit(helperMain())
	}
	durabledbtest.Main(m)
}
