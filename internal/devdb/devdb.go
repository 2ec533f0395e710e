// Package devdb finds a Postgres for the demo, the CLI and the test suite, or starts one.
//
// In order: DATABASE_URL if set; else a server on 127.0.0.1:5432 (user postgres, or $PGUSER);
// else a throwaway cluster from the Postgres binaries on this machine (initdb and pg_ctl, looked
// up on PATH and in the usual distribution folders), installing the distribution's postgresql
// package first when it is missing and this process may (root on Debian or Ubuntu). initdb
// refuses to run as root, so as root the cluster runs as the postgres user (or nobody). The
// throwaway cluster lives in a temporary folder and is removed by Close.
package devdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DB is a Postgres to connect to.
type DB struct {
	// URL is a connection string for the postgres database on the server.
	URL string
	// Source says where it came from, for logs.
	Source string

	dir    string
	pgCtl  string
	data   string
	runAs  *account
	logOut io.Writer
}

// Options adjusts Resolve.
type Options struct {
	// Log receives progress lines (starting a cluster can take seconds). Nil discards them.
	Log io.Writer
	// SkipEnv ignores DATABASE_URL; SkipLocal skips the probe of 127.0.0.1:5432. Tests of the
	// throwaway path use them.
	SkipEnv, SkipLocal bool
	// NoInstall never installs packages.
	NoInstall bool
}

// Resolve returns a reachable Postgres, starting one if needed. Close it when done.
func Resolve(ctx context.Context, opts Options) (*DB, error) {
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	if url := os.Getenv("DATABASE_URL"); url != "" && !opts.SkipEnv {
		if err := ping(ctx, url); err != nil {
			return nil, fmt.Errorf("DATABASE_URL is set but Postgres is not reachable there: %w", err)
		}
		return &DB{URL: url, Source: "DATABASE_URL"}, nil
	}
	if !opts.SkipLocal {
		user := os.Getenv("PGUSER")
		if user == "" {
			user = "postgres"
		}
		url := "postgres://" + user + "@127.0.0.1:5432/postgres?sslmode=disable"
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := ping(pctx, url)
		cancel()
		if err == nil {
			return &DB{URL: url, Source: "127.0.0.1:5432"}, nil
		}
		fmt.Fprintf(logw, "devdb: no usable Postgres on 127.0.0.1:5432 (%v); starting a throwaway cluster\n", err)
	}
	bin, err := findBinaries()
	if err != nil && !opts.NoInstall {
		if ierr := install(ctx, logw); ierr != nil {
			return nil, fmt.Errorf("%w (and installing it failed: %w)", err, ierr)
		}
		bin, err = findBinaries()
	}
	if err != nil {
		return nil, err
	}
	return startCluster(ctx, bin, logw)
}

// Close stops and removes a throwaway cluster; for other sources it does nothing.
func (d *DB) Close() error {
	if d == nil || d.dir == "" {
		return nil
	}
	cmd := exec.Command(d.pgCtl, "-D", d.data, "-m", "immediate", "-w", "stop")
	cmd.Stdout, cmd.Stderr = d.logOut, d.logOut
	d.runAs.apply(cmd)
	err := cmd.Run()
	if rerr := os.RemoveAll(d.dir); err == nil {
		err = rerr
	}
	return err
}

func ping(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return conn.Ping(ctx)
}

// binaries are the server programs of one Postgres installation.
type binaries struct {
	initdb, pgCtl string
}

// searchDirs are where distributions put the server programs, newest version first after
// sorting.
var searchGlobs = []string{
	"/usr/lib/postgresql/*/bin",         // Debian, Ubuntu
	"/usr/pgsql-*/bin",                  // RHEL, Fedora (PGDG)
	"/usr/local/pgsql/bin",              // source builds
	"/opt/homebrew/opt/postgresql*/bin", // macOS Homebrew (Apple silicon)
	"/usr/local/opt/postgresql*/bin",    // macOS Homebrew (Intel)
	"/usr/lib64/pgsql/bin",
}

func findBinaries() (binaries, error) {
	if i, err := exec.LookPath("initdb"); err == nil {
		if p, err := exec.LookPath("pg_ctl"); err == nil {
			return binaries{i, p}, nil
		}
	}
	var dirs []string
	for _, g := range searchGlobs {
		m, _ := filepath.Glob(g)
		dirs = append(dirs, m...)
	}
	sort.Slice(dirs, func(a, b int) bool { return versionOf(dirs[a]) > versionOf(dirs[b]) })
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "pg_ctl")
		if isExec(i) && isExec(p) {
			return binaries{i, p}, nil
		}
	}
	return binaries{}, errors.New("no Postgres found: set DATABASE_URL, run a server on 127.0.0.1:5432, " +
		"or install Postgres 15 or newer (Debian/Ubuntu: apt-get install postgresql; " +
		"Fedora/RHEL: dnf install postgresql-server; macOS: brew install postgresql)")
}

func versionOf(dir string) int {
	for _, part := range strings.Split(dir, string(filepath.Separator)) {
		digits := strings.TrimLeftFunc(part, func(r rune) bool { return r < '0' || r > '9' })
		if n, err := strconv.Atoi(digits); err == nil {
			return n
		}
	}
	return 0
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// install installs the distribution's postgresql package where that is possible without asking:
// as root on a Debian-family system.
func install(ctx context.Context, logw io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("not root, so not installing packages")
	}
	if _, err := os.Stat("/etc/debian_version"); err != nil {
		return errors.New("not a Debian-family system, so not installing packages")
	}
	fmt.Fprintln(logw, "devdb: installing the postgresql package (apt-get install -y postgresql)")
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "postgresql"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = logw, logw
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("apt-get %s: %w", strings.Join(args, " "), err)
		}
	}
	return nil
}

func startCluster(ctx context.Context, bin binaries, logw io.Writer) (*DB, error) {
	acct, err := unprivileged()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gendurable-pg-")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*DB, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return fail(err)
	}
	if err := acct.own(dir); err != nil {
		return fail(fmt.Errorf("give %s to the postgres user: %w", dir, err))
	}
	fmt.Fprintf(logw, "devdb: initdb %s\n", data)
	initdb := exec.CommandContext(ctx, bin.initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.Stdout, initdb.Stderr = logw, logw
	acct.apply(initdb)
	if err := initdb.Run(); err != nil {
		return fail(fmt.Errorf("initdb: %w", err))
	}
	port, err := freePort()
	if err != nil {
		return fail(err)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300", port, sock)
	start := exec.CommandContext(ctx, bin.pgCtl, "-D", data, "-o", opts, "-l", filepath.Join(dir, "postgres.log"), "-w", "-t", "60", "start")
	start.Stdout, start.Stderr = logw, logw
	acct.apply(start)
	if err := start.Run(); err != nil {
		logText, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		return fail(fmt.Errorf("pg_ctl start: %w\n%s", err, logText))
	}
	db := &DB{
		URL:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Source: "throwaway cluster in " + dir,
		dir:    dir, pgCtl: bin.pgCtl, data: data, runAs: acct, logOut: logw,
	}
	if err := ping(ctx, db.URL); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("throwaway cluster started but is unreachable: %w", err)
	}
	fmt.Fprintf(logw, "devdb: Postgres running at 127.0.0.1:%d\n", port)
	return db, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
