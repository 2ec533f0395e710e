package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durableui"
)

// runUI serves the dashboard (package durableui) of a schema until ctx ends.
//
//	gendurable ui [--database-url URL] [--schema S] [--addr 127.0.0.1:8080] [--read-only] [--token T] [--allow-host NAMES]
func runUI(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	var db dbFlags
	db.register(fs, "gendurable")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on (host:port)")
	readOnly := fs.Bool("read-only", false, "show no action forms and refuse every action")
	token := fs.String("token", os.Getenv("GENDURABLE_UI_TOKEN"),
		"require this token to read the pages and to act (default $GENDURABLE_UI_TOKEN; the environment keeps it out of the process list)")
	allow := fs.String("allow-host", "", "comma-separated host names the dashboard answers to besides IP addresses and localhost "+
		"(the names it is reached by; any other Host header is refused, against DNS rebinding)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", *addr, err)
	}
	if *token == "" && !loopback(host) {
		return fmt.Errorf("--addr %s is reachable from other machines: pass --token (or set GENDURABLE_UI_TOKEN), "+
			"read-only or not: the pages show states, results, signal payloads and errors", *addr)
	}
	var hosts []string
	for _, h := range strings.Split(*allow, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	pool, closeDB, err := db.open(ctx, false, os.Stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	// No queues, no reaper, no GC: this node only reads and acts. Its pokes go over
	// LISTEN/NOTIFY, so workers that use PokePostgres see a signal or a retry at once (the others
	// at their next poll).
	codec, err := codecFromEnv()
	if err != nil {
		return err
	}
	client, err := gendurable.NewClient(pool, &gendurable.Config{
		Name:   "ui",
		Codec:  codec,
		Schema: db.schema,
		Reaper: &gendurable.ReaperConfig{Disabled: true},
		GC:     &gendurable.GCConfig{Disabled: true},
		Poke:   gendurable.PokePostgres(),
		Logger: quietLogger(),
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = client.Stop(stop)
	}()
	h, err := durableui.New(client, &durableui.Options{ReadOnly: *readOnly, Token: *token, AllowedHosts: hosts,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	mode := "open to whoever reaches it"
	if *token != "" {
		mode = "pages and actions need the token"
	}
	if *readOnly {
		mode += ", read-only"
	}
	fmt.Fprintf(out, "gendurable ui: schema %q on http://%s/ (%s)\n", db.schema, ln.Addr(), mode)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(stop); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loopback reports whether host is a name or address of this machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
