package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// chromiumPath finds the browser: $GD_CHROMIUM, else Debian's chromium (or another Chromium or
// Chrome on PATH). Missing, it installs Debian's chromium package where this process may (root on
// a Debian-family system), like internal/devdb does for Postgres; elsewhere it says what to do.
func chromiumPath(ctx context.Context, log io.Writer) (string, error) {
	if p := os.Getenv("GD_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("GD_CHROMIUM=%s: %w", p, err)
		}
		return p, nil
	}
	find := func() string {
		for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p, nil
	}
	missing := errors.New("no Chromium found: install Debian's chromium package (apt-get install chromium) " +
		"or point GD_CHROMIUM at a Chromium or Chrome binary")
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%w (not root, so not installing it)", missing)
	}
	if _, err := os.Stat("/etc/debian_version"); err != nil {
		return "", fmt.Errorf("%w (not a Debian-family system, so not installing it)", missing)
	}
	fmt.Fprintln(log, "e2e: installing Debian's chromium package (apt-get install -y chromium)")
	// Other packages' tests may install at once (make test runs them in parallel): wait for the
	// package manager's lock instead of failing on it.
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "chromium"}} {
		args = append([]string{"-o", "DPkg::Lock::Timeout=300"}, args...)
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%w (apt-get %s failed: %w)", missing, strings.Join(args, " "), err)
		}
	}
	if p := find(); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("%w (the package installed, but no binary appeared)", missing)
}

// newBrowser starts a headless Chromium with a fresh profile, closed when the test ends, and
// returns a context for its first tab. The flags keep it off the network (which is closed here)
// and off the GPU.
func newBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900),
	}
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first Do starts the browser, for as long as ctx lives: no timeout on it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium (%s): %v", chromium, err)
	}
	return ctx
}

// screenshots is where the pages' screenshots go: $GD_SCREENSHOTS, else a folder in the
// temporary directory that each run overwrites.
func screenshots(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GD_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "gendurable-e2e-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("screenshots folder: %v", err)
	}
	return dir
}

// shoot saves a full-page PNG of the current page as name.png.
func shoot(t *testing.T, name string) chromedp.Action[chromedp.Void] {
	t.Helper()
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return fmt.Errorf("screenshot %s: %w", name, err)
		}
		path := filepath.Join(screenshots(t), name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			return err
		}
		t.Logf("screenshot: %s", path)
		return nil
	})
}

// step bounds one browser step (the browser itself lives as long as ctx).
func step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}

// do runs actions within a step's bound.
func do(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := step(ctx)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatal(err)
	}
}

// get runs one action that returns a value, within a step's bound.
func get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := step(ctx)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// load runs actions that make the tab load a page (a click on a link or a submit button) and
// returns that page's HTTP status.
func load(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) int {
	t.Helper()
	c, cancel := step(ctx)
	defer cancel()
	resp, err := chromedp.RunResponse(c, actions...)
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Status)
}

// acceptDialogs accepts every confirmation dialog the page opens (ui.js asks before the actions
// that need it) and returns a check that the next one was asked and said want.
func acceptDialogs(t *testing.T, ctx context.Context) func(want string) {
	dialogs := make(chan string, 4)
	events := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range events {
			if err != nil {
				return
			}
			dialogs <- ev.Message
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return func(want string) {
		t.Helper()
		select {
		case msg := <-dialogs:
			require.Contains(t, msg, want)
		default:
			t.Fatalf("no confirmation dialog (%q): the page's script did not run", want)
		}
	}
}
