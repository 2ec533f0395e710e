package devdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PgBouncer is a pgbouncer process a test started in front of a Postgres.
type PgBouncer struct {
	// URL is a connection string for the upstream URL's database, through the pooler.
	URL string
	// Port is the pooler's port on 127.0.0.1.
	Port int

	dir string
	cmd *exec.Cmd
	// exited is closed once the process has been waited for.
	exited chan struct{}
}

// PgBouncerOptions configures StartPgBouncer.
type PgBouncerOptions struct {
	// Log receives progress lines and pgbouncer's own output; nil discards them.
	Log io.Writer
	// NoInstall never installs the pgbouncer package.
	NoInstall bool
	// PoolMode is pgbouncer's pool_mode; default "transaction".
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and user; default 20.
	PoolSize int
}

// StartPgBouncer starts a pgbouncer of its own, with a generated configuration in a temporary
// folder, on a free port of 127.0.0.1, in front of the Postgres at upstream (a postgres:// URL
// whose server trusts its user, as the test servers do). When the pgbouncer program is missing
// it installs Debian's pgbouncer package, as root on a Debian-family system (like Resolve does
// for Postgres). pgbouncer refuses to run as root: as root it runs as the postgres user (or
// nobody). Close stops it and removes the folder.
func StartPgBouncer(ctx context.Context, upstream string, opts PgBouncerOptions) (*PgBouncer, error) {
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin, err = "/usr/sbin/pgbouncer", nil
		if !isExec(bin) {
			err = errors.New("pgbouncer is not installed (Debian/Ubuntu: apt-get install pgbouncer)")
		}
	}
	if err != nil && !opts.NoInstall {
		if ierr := installPackage(ctx, logw, "pgbouncer"); ierr != nil {
			return nil, fmt.Errorf("%w (and installing it failed: %w)", err, ierr)
		}
		bin, err = "/usr/sbin/pgbouncer", nil
		if !isExec(bin) {
			err = errors.New("pgbouncer is still missing after installing its package")
		}
	}
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("devdb: upstream URL: %w", err)
	}
	user := u.User.Username()
	if user == "" {
		user = "postgres"
	}
	dbname := strings.TrimPrefix(u.Path, "/")
	if dbname == "" {
		dbname = user
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	mode := opts.PoolMode
	if mode == "" {
		mode = "transaction"
	}
	size := opts.PoolSize
	if size == 0 {
		size = 20
	}
	acct, err := unprivileged()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gendurable-pgbouncer-")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*PgBouncer, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	listen, err := freePort()
	if err != nil {
		return fail(err)
	}
	ini := fmt.Sprintf(`[databases]
%[1]s = host=%[2]s port=%[3]s dbname=%[1]s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[4]d
unix_socket_dir =
auth_type = trust
auth_file = %[5]s
pool_mode = %[6]s
default_pool_size = %[7]d
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = %[8]s
pidfile = %[9]s
`, dbname, host, port, listen, filepath.Join(dir, "userlist.txt"), mode, size,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o600); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(strconv.Quote(user)+` ""`+"\n"), 0o600); err != nil {
		return fail(err)
	}
	if err := acct.own(dir); err != nil {
		return fail(fmt.Errorf("give %s to the unprivileged user: %w", dir, err))
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Stdout, cmd.Stderr = logw, logw
	acct.apply(cmd)
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start pgbouncer: %w", err))
	}
	b := &PgBouncer{
		URL:  fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.User(user).String(), listen, dbname),
		Port: listen, dir: dir, cmd: cmd, exited: make(chan struct{}),
	}
	go func() { _ = cmd.Wait(); close(b.exited) }()
	fmt.Fprintf(logw, "devdb: pgbouncer (%s mode) on 127.0.0.1:%d in front of %s:%s\n", mode, listen, host, port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := ping(pctx, b.URL)
		cancel()
		if err == nil {
			return b, nil
		}
		select {
		case <-b.exited:
			logText, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer exited at start: %w\n%s", err, logText)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = b.Close()
			return nil, fmt.Errorf("pgbouncer started but does not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops pgbouncer (SIGINT: immediate shutdown, then SIGKILL if it lingers) and removes
// its folder.
func (b *PgBouncer) Close() error {
	if b == nil || b.cmd == nil {
		return nil
	}
	select {
	case <-b.exited:
	default:
		_ = b.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
	}
	return os.RemoveAll(b.dir)
}

// installPackage installs a Debian package where that is possible without asking: as root on a
// Debian-family system.
func installPackage(ctx context.Context, logw io.Writer, pkg string) error {
	if os.Geteuid() != 0 {
		return errors.New("not root, so not installing packages")
	}
	if _, err := os.Stat("/etc/debian_version"); err != nil {
		return errors.New("not a Debian-family system, so not installing packages")
	}
	fmt.Fprintf(logw, "devdb: installing the %s package (apt-get install -y %s)\n", pkg, pkg)
	// Tests of several packages may install at once: wait for the package manager's lock.
	lock := []string{"-o", "DPkg::Lock::Timeout=300"}
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", pkg}} {
		args = append(lock, args...)
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = logw, logw
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("apt-get %s: %w", strings.Join(args, " "), err)
		}
	}
	return nil
}
