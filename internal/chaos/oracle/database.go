package oracle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/gendurable/gendurable/durabledbtest"
	"github.com/jackc/pgx/v5"
)

// Database creates a database of the test's own on the tests' server and returns its URL; it is
// dropped when the test ends. Postgres counts deadlocks per database (I8), and a backend hands
// its counts in when it exits: called before anything connects to the database, its cleanups
// run after every pool and worker process of the test has closed, and then deadlocks, if not
// nil, gets the database's exact count (DatabaseDeadlocks), which no other test shares.
func Database(t testing.TB, deadlocks func(n int64)) string {
	t.Helper()
	ctx := context.Background()
	admin := durabledbtest.Pool(t, 1)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "gd_db_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	if deadlocks != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n, err := DatabaseDeadlocks(ctx, admin, name)
			if err != nil {
				t.Errorf("I8: read the deadlock count: %v", err)
				return
			}
			deadlocks(n)
		})
	}
	u, err := url.Parse(durabledbtest.URL(t))
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("the tests' database URL is not a URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}
