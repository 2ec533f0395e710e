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
	"slices"
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
	// Port is a throwaway cluster's port (0 for the other sources).
	Port int

	dir    string
	pgCtl  string
	data   string
	runAs  *account
	logOut io.Writer
	opts   string   // a throwaway cluster's server options, for Start
	env    []string // a throwaway cluster's extra server environment (ClusterOptions.Env)
	mounts []string // the disks AddDisk mounted in dir, unmounted by Close
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
	return startCluster(ctx, bin, logw, nil, nil)
}

// Close stops and removes a throwaway cluster; for other sources it does nothing.
func (d *DB) Close() error {
	if d == nil || d.dir == "" {
		return nil
	}
	// Stopping a server that is already stopped (Stop without Start) fails harmlessly.
	cmd := exec.Command(d.pgCtl, "-D", d.data, "-m", "immediate", "-w", "stop")
	cmd.Stdout, cmd.Stderr = d.logOut, d.logOut
	d.runAs.apply(cmd)
	d.withEnv(cmd)
	err := cmd.Run()
	if _, serr := os.Stat(filepath.Join(d.data, "postmaster.pid")); os.IsNotExist(serr) {
		err = nil
	}
	if uerr := unmount(d.mounts, d.logOut); uerr != nil {
		// Removing the folder would empty a disk still mounted in it, and fail on its mount point.
		return errors.Join(err, uerr)
	}
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
	return installPackage(ctx, logw, "postgresql")
}

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// NoInstall never installs packages.
	NoInstall bool
	// Settings are server settings (name → value) on top of the test defaults (fsync off,
	// max_connections 300, listening on 127.0.0.1 only, log messages in English).
	Settings map[string]string
	// Env adds variables ("NAME=value") to the environment the server runs in: pg_ctl's, which
	// the postgres processes it starts inherit, at every start, restart and stop (a test runs
	// its server under a preloaded library, say: LD_PRELOAD and the library's settings).
	Env []string
}

// StartCluster starts a private throwaway cluster from this machine's binaries, whatever
// DATABASE_URL or 127.0.0.1:5432 offer: for tests that stop, restart or reconfigure their server,
// which they must never do to a shared one. Close stops it and removes its folder.
func StartCluster(ctx context.Context, opts ClusterOptions) (*DB, error) {
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
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
	return startCluster(ctx, bin, logw, opts.Settings, opts.Env)
}

func startCluster(ctx context.Context, bin binaries, logw io.Writer, settings map[string]string, env []string) (*DB, error) {
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
	// lc_messages=C: the server log is in English whatever the machine's locale, so that tests
	// can read it (deadlocks, cancelled statements).
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300 -c lc_messages=C", port, sock)
	names := make([]string, 0, len(settings))
	for name := range settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		opts += fmt.Sprintf(" -c %s=%s", name, settings[name])
	}
	db := &DB{
		URL:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Source: "throwaway cluster in " + dir,
		dir:    dir, pgCtl: bin.pgCtl, data: data, runAs: acct, logOut: logw, opts: opts, Port: port,
		env: slices.Clone(env),
	}
	if err := db.Start(ctx); err != nil {
		return fail(err)
	}
	if err := ping(ctx, db.URL); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("throwaway cluster started but is unreachable: %w", err)
	}
	fmt.Fprintf(logw, "devdb: Postgres running at 127.0.0.1:%d\n", port)
	return db, nil
}

// ServerLog returns what the server of a throwaway cluster has logged so far, across its
// restarts (pg_ctl appends to one file).
func (d *DB) ServerLog() (string, error) {
	if d.dir == "" {
		return "", errors.New("devdb: ServerLog: not a throwaway cluster")
	}
	b, err := os.ReadFile(filepath.Join(d.dir, "postgres.log"))
	return string(b), err
}

// Start starts the server of a throwaway cluster that Stop stopped (same port, same data),
// waiting until it accepts connections (after crash recovery, if it was stopped in immediate
// mode).
func (d *DB) Start(ctx context.Context) error {
	if d.dir == "" {
		return errors.New("devdb: Start: not a throwaway cluster")
	}
	return d.pgctl(ctx, "-o", d.opts, "-l", filepath.Join(d.dir, "postgres.log"), "-w", "-t", "60", "start")
}

// Program is the path of one of the server's client programs (pg_dump, pg_restore, psql) in a
// throwaway cluster's binaries folder: the version that matches its server.
func (d *DB) Program(name string) (string, error) {
	if d.pgCtl == "" {
		return "", errors.New("devdb: Program: not a throwaway cluster")
	}
	pgCtl, err := filepath.EvalSymlinks(d.pgCtl) // a link on PATH to the binaries folder
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(pgCtl), name)
	if !isExec(path) {
		return "", fmt.Errorf("devdb: %s is not in %s", name, filepath.Dir(pgCtl))
	}
	return path, nil
}

// Running says whether the postmaster of a throwaway cluster runs (it exits when its startup
// fails, as after a crash it cannot recover from; it keeps running while it restarts after a
// backend's PANIC).
func (d *DB) Running() bool {
	return d.dir != "" && postmasterAlive(d.data)
}

// Stop stops the server of a throwaway cluster and keeps its data: mode is pg_ctl's shutdown
// mode ("smart", "fast", or "immediate": no checkpoint, crash recovery at the next start).
func (d *DB) Stop(ctx context.Context, mode string) error {
	if d.dir == "" {
		return errors.New("devdb: Stop: not a throwaway cluster")
	}
	return d.pgctl(ctx, "-m", mode, "-w", "-t", "60", "stop")
}

// Restart restarts the server of a throwaway cluster (pg_ctl restart in mode), waiting until it
// accepts connections again.
func (d *DB) Restart(ctx context.Context, mode string) error {
	if d.dir == "" {
		return errors.New("devdb: Restart: not a throwaway cluster")
	}
	return d.pgctl(ctx, "-m", mode, "-o", d.opts, "-l", filepath.Join(d.dir, "postgres.log"), "-w", "-t", "60", "restart")
}

func (d *DB) pgctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, d.pgCtl, append([]string{"-D", d.data}, args...)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = io.MultiWriter(d.logOut, &out), io.MultiWriter(d.logOut, &out)
	d.runAs.apply(cmd)
	d.withEnv(cmd)
	if err := cmd.Run(); err != nil {
		logText, _ := os.ReadFile(filepath.Join(d.dir, "postgres.log"))
		return fmt.Errorf("pg_ctl %s: %w\n%s\n%s", args[len(args)-1], err, out.String(), tail(string(logText), 2000))
	}
	return nil
}

// withEnv adds the cluster's extra server environment (ClusterOptions.Env) to a pg_ctl command,
// on top of what it has (the account's, when it runs as the postgres user) or else this
// process's.
func (d *DB) withEnv(cmd *exec.Cmd) {
	if len(d.env) == 0 {
		return
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, d.env...)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
