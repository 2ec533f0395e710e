package chaos

import (
	"os"
	"testing"

	"github.com/gendurable/gendurable/durabledbtest"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(workerEnv); cfg != "" {
		// The test binary re-executed as a worker process (worker_test.go).
		os.Exit(workerMain(cfg))
	}
	durabledbtest.Main(m)
}
