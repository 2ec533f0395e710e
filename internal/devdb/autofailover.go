package devdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// HA is a pg_auto_failover formation a test started: a monitor and two Postgres nodes, each a
// `pg_autoctl run` keeper in a process group of its own, in one temporary folder, with
// synchronous replication (the formation's default) between the nodes. Clients reach the
// primary, whichever node it is, through URL.
type HA struct {
	// URL reaches the formation's primary: both nodes' addresses and
	// target_session_attrs=read-write, the way an application connects to such a formation.
	URL string
	// MonitorURL is the monitor's database (pgautofailover.node holds the states).
	MonitorURL string
	// Nodes are the Postgres nodes, in creation order (the first starts as the primary).
	Nodes []*HANode

	dir     string
	autoctl string
	runAs   *account
	logw    io.Writer
	env     []string
	monitor *HANode
}

// HANode is one node of an HA formation: its name, port and keeper process.
type HANode struct {
	// Name is the node's name in the formation (n1, n2).
	Name string
	// Port is its Postgres port on 127.0.0.1.
	Port int

	data   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// HAOptions configures StartHA.
type HAOptions struct {
	// Log receives progress lines and the keepers' output; nil discards them.
	Log io.Writer
	// NoInstall never installs packages.
	NoInstall bool
	// Unhealthy is how long the monitor goes without hearing from a node before it calls it
	// unhealthy (pgautofailover.node_considered_unhealthy_timeout; its health checks run at a
	// fifth of it and may take a third, at least a second); DemoteTimeout how long it then waits for a silent primary to have demoted
	// itself before promoting the standby (pgautofailover.primary_demote_timeout). Zero keeps
	// pg_auto_failover's defaults (20 s and 30 s). The keepers' network partition timeout (how
	// soon a primary that reaches neither monitor nor standby demotes itself) is set to half of
	// DemoteTimeout, so that a primary cut off from the monitor demotes before the monitor
	// promotes its standby, as in pg_auto_failover's defaults (20 s against 30 s).
	Unhealthy, DemoteTimeout time.Duration
	// Settings are server settings (name → value) for both nodes, on top of max_connections 300,
	// fsync off (the tests kill processes, not the machine) and unspread checkpoints.
	Settings map[string]string
}

// StartHA starts a monitor and two nodes (Debian's postgresql-<version>-auto-failover package,
// installed when missing and this process may), waits until one node is primary and the other
// a synchronous secondary, and creates the database "gendurable" on the primary. As root the
// keepers and servers run as the postgres user (or nobody). Close stops them and removes the
// folder.
func StartHA(ctx context.Context, opts HAOptions) (*HA, error) {
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	// pg_autoctl finds the other server programs beside pg_ctl: the installation's own folder,
	// not a folder of symbolic links to some of them.
	pgCtl, err := filepath.EvalSymlinks(bin.pgCtl)
	if err != nil {
		return nil, err
	}
	binDir := filepath.Dir(pgCtl)
	version := versionOf(binDir)
	autoctl, err := findAutoctl(binDir, version)
	if err != nil && !opts.NoInstall {
		if ierr := installPackage(ctx, logw, fmt.Sprintf("postgresql-%d-auto-failover", version)); ierr != nil {
			return nil, fmt.Errorf("%w (and installing it failed: %w)", err, ierr)
		}
		autoctl, err = findAutoctl(binDir, version)
	}
	if err != nil {
		return nil, err
	}
	acct, err := unprivileged()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gendurable-ha-")
	if err != nil {
		return nil, err
	}
	// pg_autoctl keeps its configuration and state under XDG folders, the formation's own here;
	// a runtime folder that does not exist sends it to /tmp/pg_autoctl instead.
	for _, sub := range []string{"config", "share", "run"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := acct.own(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("give %s to the postgres user: %w", dir, err)
	}
	h := &HA{dir: dir, autoctl: autoctl, runAs: acct, logw: logw,
		env: []string{"PATH=" + binDir + ":" + os.Getenv("PATH"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config"),
			"XDG_DATA_HOME=" + filepath.Join(dir, "share"), "XDG_RUNTIME_DIR=" + filepath.Join(dir, "run")}}
	fail := func(err error) (*HA, error) {
		_ = h.Close()
		return nil, err
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return fail(err)
		}
	}
	h.monitor = &HANode{Name: "monitor", Port: ports[0], data: filepath.Join(dir, "monitor")}
	if err := h.autoctlRun(ctx, "create", "monitor", "--pgdata", h.monitor.data, "--pgport", fmt.Sprint(ports[0]),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", pgCtl); err != nil {
		return fail(err)
	}
	// Sockets in the formation's own folder: the distribution's may not be writable, and a
	// killed server leaves its socket behind.
	sockets := fmt.Sprintf("'%s'", filepath.Join(dir, "run"))
	mon := map[string]string{"listen_addresses": "'127.0.0.1'", "unix_socket_directories": sockets}
	if opts.Unhealthy > 0 {
		ms := opts.Unhealthy.Milliseconds()
		mon["pgautofailover.node_considered_unhealthy_timeout"] = fmt.Sprint(ms)
		// A health check may take a second on a loaded machine before it counts as failed.
		mon["pgautofailover.health_check_period"] = fmt.Sprint(max(ms/5, 100))
		mon["pgautofailover.health_check_timeout"] = fmt.Sprint(max(ms/3, 1000))
		mon["pgautofailover.health_check_retry_delay"] = fmt.Sprint(max(ms/10, 100))
		mon["pgautofailover.health_check_max_retries"] = "1"
	}
	if opts.DemoteTimeout > 0 {
		mon["pgautofailover.primary_demote_timeout"] = fmt.Sprint(opts.DemoteTimeout.Milliseconds())
	}
	if err := appendSettings(h.monitor.data, mon); err != nil {
		return fail(err)
	}
	if err := h.start(h.monitor); err != nil {
		return fail(err)
	}
	h.MonitorURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", ports[0])
	if err := waitPing(ctx, h.MonitorURL); err != nil {
		return fail(fmt.Errorf("devdb: the monitor: %w", err))
	}
	// A node that rejoins after a crash may take a base backup, which waits for a checkpoint:
	// an unspread one is over in moments rather than minutes.
	nodeConf := map[string]string{"listen_addresses": "'127.0.0.1'", "unix_socket_directories": sockets,
		"max_connections": "300", "fsync": "off",
		"checkpoint_completion_target": "0"}
	for k, v := range opts.Settings {
		nodeConf[k] = v
	}
	monURL := fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", ports[0])
	var hosts []string
	for i := 1; i <= 2; i++ {
		n := &HANode{Name: fmt.Sprint("n", i), Port: ports[i], data: filepath.Join(dir, fmt.Sprint("n", i))}
		h.Nodes = append(h.Nodes, n) // Close stops whatever of it a failure below leaves running
		if err := h.autoctlRun(ctx, "create", "postgres", "--pgdata", n.data, "--pgport", fmt.Sprint(n.Port),
			"--hostname", "127.0.0.1", "--name", n.Name, "--auth", "trust", "--no-ssl", "--monitor", monURL,
			"--dbname", "gendurable", "--pgctl", pgCtl); err != nil {
			return fail(err)
		}
		if opts.DemoteTimeout > 0 {
			secs := max(int(opts.DemoteTimeout.Seconds()/2), 1)
			if err := h.autoctlRun(ctx, "config", "set", "--pgdata", n.data, "timeout.network_partition_timeout", fmt.Sprint(secs)); err != nil {
				return fail(err)
			}
		}
		// The first node's settings travel to the second with its base backup; the second
		// gets them again for when it is initialised some other way.
		if err := appendSettings(n.data, nodeConf); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fail(err)
		}
		if err := h.start(n); err != nil {
			return fail(err)
		}
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", n.Port))
		if err := h.WaitStable(ctx, 2*time.Minute); err != nil {
			return fail(err)
		}
	}
	h.URL = fmt.Sprintf("postgres://postgres@%s/gendurable?sslmode=disable&target_session_attrs=read-write",
		strings.Join(hosts, ","))
	if err := waitPing(ctx, h.URL); err != nil {
		return fail(fmt.Errorf("devdb: the formation's primary: %w", err))
	}
	fmt.Fprintf(logw, "devdb: pg_auto_failover formation up: %s (monitor %s)\n", h.URL, h.MonitorURL)
	return h, nil
}

// findAutoctl finds pg_autoctl and checks that the server of this version has the extension.
func findAutoctl(binDir string, version int) (string, error) {
	missing := fmt.Errorf("pg_auto_failover is not installed for Postgres %d (Debian/Ubuntu: apt-get install postgresql-%d-auto-failover)", version, version)
	p, err := exec.LookPath("pg_autoctl")
	if err != nil {
		if p = filepath.Join(binDir, "pg_autoctl"); !isExec(p) {
			return "", missing
		}
	}
	if _, err := os.Stat(fmt.Sprintf("/usr/share/postgresql/%d/extension/pgautofailover.control", version)); err != nil &&
		strings.HasPrefix(binDir, "/usr/lib/postgresql/") {
		return "", missing
	}
	return p, nil
}

// appendSettings appends settings to a data folder's postgresql.conf (later lines win over the
// ones pg_autoctl included before them).
func appendSettings(data string, settings map[string]string) error {
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("\n# devdb.StartHA\n")
	for k, v := range settings {
		fmt.Fprintf(&b, "%s = %s\n", k, v)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// command is a pg_autoctl command as the formation's user, with its environment.
func (h *HA) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, h.autoctl, args...)
	h.runAs.apply(cmd)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, h.env...)
	if cmd.Dir == "" {
		cmd.Dir = h.dir
	}
	return cmd
}

// autoctlRun runs a pg_autoctl command to its end.
func (h *HA) autoctlRun(ctx context.Context, args ...string) error {
	cmd := h.command(ctx, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = io.MultiWriter(h.logw, &out), io.MultiWriter(h.logw, &out)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pg_autoctl %s: %w\n%s", strings.Join(args[:2], " "), err, tail(out.String(), 3000))
	}
	return nil
}

// start starts a node's keeper (`pg_autoctl run`), which starts its Postgres, in a process
// group of its own so that Kill takes the keeper and the server down together.
func (h *HA) start(n *HANode) error {
	// The keeper outlives the call that starts it: only Kill and Close end it.
	cmd := h.command(context.Background(), "run", "--pgdata", n.data)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	logf, err := os.OpenFile(filepath.Join(h.dir, n.Name+".keeper.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("pg_autoctl run %s: %w", n.Name, err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(n.exited)
	}()
	return nil
}

// node finds a node by name.
func (h *HA) node(name string) (*HANode, error) {
	for _, n := range h.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("devdb: no node %q in the formation", name)
}

// NodeState is what the monitor knows of a node.
type NodeState struct {
	Name            string
	Port            int
	Reported, Goal  string
	Health          int
	ReportedLSNText string
}

// States reads the monitor's view of the nodes.
func (h *HA) States(ctx context.Context) ([]NodeState, error) {
	conn, err := pgx.Connect(ctx, h.MonitorURL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text, health, reportedlsn::text
		FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeState, error) {
		var s NodeState
		err := r.Scan(&s.Name, &s.Port, &s.Reported, &s.Goal, &s.Health, &s.ReportedLSNText)
		return s, err
	})
}

// Primary names the node the monitor has as primary (reported and assigned).
func (h *HA) Primary(ctx context.Context) (string, error) {
	states, err := h.States(ctx)
	if err != nil {
		return "", err
	}
	for _, s := range states {
		if s.Reported == s.Goal && (s.Goal == "primary" || s.Goal == "wait_primary" || s.Goal == "single") {
			return s.Name, nil
		}
	}
	return "", fmt.Errorf("devdb: no primary now: %v", states)
}

// WaitStable waits until every node whose keeper runs has reached the state the monitor
// assigned it, one of them a primary: primary and secondary when both run, wait_primary when
// the other node is down (killed, not yet restarted).
func (h *HA) WaitStable(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last []NodeState
	var err error
	for {
		last, err = h.States(ctx)
		if err == nil && h.stable(last) {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("devdb: the formation did not settle in %s: reading its states: %w", timeout, err)
			}
			return fmt.Errorf("devdb: the formation did not settle in %s: %+v", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stable says whether states show every running node settled, one of them primary: with every
// node running, a primary and synchronous secondaries; with some down, wait_primary is enough.
func (h *HA) stable(states []NodeState) bool {
	if len(states) != len(h.Nodes) {
		return false
	}
	running := 0
	for _, n := range h.Nodes {
		if n.cmd != nil && !n.gone() {
			running++
		}
	}
	primary := false
	for _, s := range states {
		n, err := h.node(s.Name)
		if err != nil {
			return false
		}
		if n.cmd == nil || n.gone() {
			continue
		}
		switch {
		case s.Reported != s.Goal:
			return false
		case s.Goal == "primary", s.Goal == "single" && len(h.Nodes) == 1:
			primary = true
		case s.Goal == "wait_primary" && running < len(h.Nodes):
			primary = true
		case s.Goal != "secondary":
			return false
		}
	}
	return primary
}

func (n *HANode) gone() bool {
	select {
	case <-n.exited:
		return true
	default:
		return false
	}
}

// Switchover runs `pg_autoctl perform switchover` (the monitor demotes the primary, the standby
// catches up and is promoted, the old primary rejoins as its standby) and waits until the
// formation is stable again.
func (h *HA) Switchover(ctx context.Context) error {
	if err := h.autoctlRun(ctx, "perform", "switchover", "--pgdata", h.monitor.data); err != nil {
		return err
	}
	return h.WaitStable(ctx, 2*time.Minute)
}

// Kill SIGKILLs a node's keeper and its Postgres together (the process group), as a machine
// that loses power would stop them; nothing of it runs afterwards until Restart.
func (h *HA) Kill(name string) error {
	n, err := h.node(name)
	if err != nil {
		return err
	}
	if n.cmd == nil || n.gone() {
		return fmt.Errorf("devdb: node %s is not running", name)
	}
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("devdb: kill node %s: %w", name, err)
	}
	<-n.exited
	// The server's processes are in the group; wait until its postmaster has gone too.
	for range 100 {
		if !postmasterAlive(n.data) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("devdb: node %s's postmaster survived SIGKILL", name)
}

// Restart starts a killed node's keeper again: it rejoins the formation (rewinding if it must)
// as the standby of the node promoted in its place.
func (h *HA) Restart(name string) error {
	n, err := h.node(name)
	if err != nil {
		return err
	}
	if n.cmd != nil && !n.gone() {
		return fmt.Errorf("devdb: node %s is running", name)
	}
	return h.start(n)
}

// postmasterPID is the pid recorded in data's postmaster.pid (0: none).
func postmasterPID(data string) int {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	var pid int
	if _, err := fmt.Sscan(strings.SplitN(string(b), "\n", 2)[0], &pid); err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// postmasterAlive says whether the postmaster recorded in data's postmaster.pid still runs.
func postmasterAlive(data string) bool {
	pid := postmasterPID(data)
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// ServerLogs returns what the nodes' servers have logged (pg_autoctl's servers write their logs
// under the data folder's log/).
func (h *HA) ServerLogs() (string, error) {
	var b strings.Builder
	for _, n := range h.Nodes {
		files, err := filepath.Glob(filepath.Join(n.data, "log", "*"))
		if err != nil {
			return "", err
		}
		for _, f := range files {
			text, err := os.ReadFile(f)
			if err != nil {
				return "", err
			}
			b.Write(text)
		}
	}
	return b.String(), nil
}

// Close stops every keeper (SIGTERM, then SIGKILL after 20 s) and its server, and removes the
// folder.
func (h *HA) Close() error {
	nodes := append([]*HANode{}, h.Nodes...)
	if h.monitor != nil {
		nodes = append(nodes, h.monitor)
	}
	for _, n := range nodes {
		if n.cmd != nil && !n.gone() {
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	for _, n := range nodes {
		if n.cmd == nil {
			continue
		}
		select {
		case <-n.exited:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.exited
		}
	}
	// Every server the keepers started, or a create left behind, is gone before its folder.
	var errs []error
	for _, n := range nodes {
		if err := stopPostmaster(n.data); err != nil {
			errs = append(errs, fmt.Errorf("devdb: node %s: %w", n.Name, err))
		}
	}
	errs = append(errs, os.RemoveAll(h.dir))
	return errors.Join(errs...)
}

// stopPostmaster waits up to 5 s for the postmaster recorded in data to exit, then SIGKILLs it
// and its backends (they exit with it), and fails if it still runs.
func stopPostmaster(data string) error {
	for range 100 {
		if !postmasterAlive(data) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid := postmasterPID(data); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for range 100 {
		if !postmasterAlive(data) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("its postmaster survived SIGKILL")
}

// waitPing pings url until it answers or a minute passes.
func waitPing(ctx context.Context, url string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := ping(ctx, url)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Events returns the monitor's event log (pgautofailover.event), oldest first: every state the
// monitor assigned and every state a node reported, with the monitor's comment.
func (h *HA) Events(ctx context.Context) ([]string, error) {
	conn, err := pgx.Connect(ctx, h.MonitorURL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	rows, err := conn.Query(ctx, `SELECT format('%s %s %s/%s %s', eventtime::time, nodename, reportedstate, goalstate, description)
		FROM pgautofailover.event ORDER BY eventid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
