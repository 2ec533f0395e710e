// Package durabledbtest is gendurable's own test infrastructure, usable by anyone testing
// against a real Postgres: it finds or starts one (DATABASE_URL, 127.0.0.1:5432, or a throwaway
// cluster), gives each test its own pool and its own migrated schema, and drops what it made.
package durabledbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durablemigrate"
	"github.com/gendurable/gendurable/internal/devdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// url is the database of this test process, set once by Main before any test runs.
var url string

// Main resolves a Postgres, runs the package's tests, stops a throwaway cluster if it started
// one, and exits. Call it from TestMain.
func Main(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	db, err := devdb.Resolve(ctx, devdb.Options{Log: os.Stderr})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "durabledbtest: no Postgres for the tests:", err)
		os.Exit(2)
	}
	url = db.URL
	// Examples and programs under test read DATABASE_URL like any user program.
	_ = os.Setenv("DATABASE_URL", url)
	code := m.Run()
	if err := db.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "durabledbtest: stopping the throwaway cluster:", err)
	}
	// Every client, pool and helper a test started must be gone by now.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "durabledbtest: goroutines leaked by the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// URL is the connection string of the tests' Postgres (its postgres database).
func URL(t testing.TB) string {
	t.Helper()
	if url == "" {
		if u := os.Getenv("DATABASE_URL"); u != "" {
			return u
		}
		t.Fatal("durabledbtest: call durabledbtest.Main from TestMain")
	}
	return url
}

// Pool returns a pool for this test, closed when it ends. Its connections carry the
// application_name gd-test-<pid>, so tests can find their backends. Each of set, if any, changes
// the pool's configuration before it opens (session settings in ConnConfig.RuntimeParams, a
// tracer, a callback).
func Pool(t testing.TB, maxConns int32, set ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("durabledbtest: parse url: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("gd-test-%d", os.Getpid())
	for _, f := range set {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("durabledbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

var unsafe = regexp.MustCompile(`[^a-z0-9_]+`)

// Schema creates and migrates a schema for this test and drops it when the test ends.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := unsafe.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + name + "_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := durablemigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("durabledbtest: migrate %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := durablemigrate.Drop(ctx, pool, schema); err != nil {
			t.Errorf("durabledbtest: drop %s: %v", schema, err)
		}
	})
	return schema
}
