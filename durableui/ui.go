// Package durableui is gendurable's web dashboard: an http.Handler that shows a schema's queues
// (live counts, lag, throughput), lists instances with the filters and keyset paging of
// Client.List, shows one instance (state, result, the steps it took, inbox, children, errors),
// lists stuck instances with the database checkup's findings, and the schedules with their fire
// history, and lets an operator signal, retry, cancel, pause or resume an instance, pause or
// resume a queue or a machine, and pause, resume, trigger or remove a schedule.
//
// It is server-rendered HTML from html/template with its stylesheet and a few lines of script
// embedded: no external network, no CDN. Mount it in your own server (see Options.Prefix) or run
// it with `gendurable ui`.
//
// Actions are POST forms, each checked in this order: the handler is not ReadOnly (else 403);
// the request is not a cross-origin browser request (http.CrossOriginProtection; else 403); its
// body is within the size limit (else 413); it carries the CSRF token bound to the session cookie
// the pages set (else 403); when Options.Token is set, it comes from a signed-in browser or
// carries the token (missing: 401, wrong: 403, too many wrong ones: 429);
// Options.Authorize accepts it (else 401 or 403). Only then is the form read and the client
// called; a refused request changes nothing.
//
// Reading is guarded by Options.Token (with a token set, every page needs it: a browser signs in
// once) and by the Host check (Options.AllowedHosts); without a token, put the dashboard behind
// your own authentication as you would any admin page.
package durableui

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

//go:embed templates/*.html static/*
var files embed.FS

// ErrUnauthenticated is what an Options.Authorize hook wraps to say that the request carries no
// credentials at all (401), rather than credentials that may not act (403).
var ErrUnauthenticated = errors.New("durableui: not authenticated")

// Options configures the dashboard. The zero value (or nil) is a dashboard at "/" whose actions
// are open to whoever reaches it: set ReadOnly, Token or Authorize, or put it behind your own
// authentication.
type Options struct {
	// Prefix is the path the handler is mounted at, as the browser sees it: it starts and ends
	// with "/", like "/admin/durable/" (default "/"). Mount the handler at that pattern without
	// http.StripPrefix: every link and form the pages hold starts with it.
	Prefix string
	// ReadOnly renders no action forms and refuses every POST with 403 Forbidden.
	ReadOnly bool
	// Token, when set, guards the whole dashboard: reading a page needs it as much as acting.
	// A browser signs in once with it (the sign-in page; a cookie then proves it for 12 hours,
	// and changing the token signs everyone out); a script sends "Authorization: Bearer
	// <token>", or, on an action's POST, a form field "token". A request without it gets the
	// sign-in page (401); a wrong one is refused (403; compared in constant time), and after 5
	// wrong tokens from one address that address is refused (429) for 30 seconds, doubling with
	// each further wrong one. `gendurable ui --token` sets it.
	Token string
	// AllowedHosts are the host names (as in the request's Host header, with or without the
	// port) the dashboard answers to besides IP addresses and localhost; "*" allows any. A
	// request for another name is refused with 403: a dashboard on 127.0.0.1 cannot be reached
	// through a name an attacker's DNS points there (DNS rebinding). Mounted behind a name,
	// list it. `gendurable ui --allow-host` sets it.
	AllowedHosts []string
	// Authorize, when set, decides each action after the CSRF and token checks: an error
	// refuses it, with 401 Unauthorized if the error wraps ErrUnauthenticated and 403 Forbidden
	// otherwise, and its text is shown. The request's form is parsed (r.PostForm) when it is
	// called. Nil allows every action that passes the other checks.
	Authorize func(*http.Request) error
	// Refresh is how often the queues page reloads itself: default 5s; negative: never.
	Refresh time.Duration
	// ThroughputWindow is the window the queues page counts finished instances over
	// (Client.Throughput), shown per minute: default 1 minute, at most an hour.
	ThroughputWindow time.Duration
	// CountEvery is how often, at most, the queues page counts the parked and finished
	// instances: that count reads every parked row (through their index) and the finished
	// counts, so it is shared by every viewer and reused for this long. Default 30s; negative:
	// never (the page shows only available, due, executing and the lag).
	CountEvery time.Duration
	// MaxPayloadBytes caps the JSON payload of a signal sent from the form: default 1 MiB (the
	// client's own Config.MaxPayloadBytes applies too). A larger one is refused with 413 and
	// nothing is stored.
	MaxPayloadBytes int
	// CSRFKey signs the CSRF tokens: at least 32 bytes. Default: random per handler, which
	// invalidates open forms when the process restarts; give every replica behind one load
	// balancer the same key.
	CSRFKey []byte
	// Logger receives a line per action (never a payload) and per failed request: default
	// slog.Default().
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultRefresh         = 5 * time.Second
	DefaultCountEvery      = 30 * time.Second
	DefaultMaxPayloadBytes = 1 << 20
)

var prefixPattern = regexp.MustCompile(`^/([A-Za-z0-9._~-]+/)*$`)

// handler is the dashboard of one client.
type handler struct {
	client  *gendurable.Client
	opts    Options
	prefix  string
	key     []byte
	token   [32]byte // sha256 of Options.Token
	strikes strikes  // wrong tokens per client address
	log     *slog.Logger
	pages   map[string]*template.Template
	mux     *http.ServeMux
	xorigin *http.CrossOriginProtection
	version string // of the embedded assets, for their URLs

	countMu sync.Mutex // held while counting, so that concurrent viewers share one count
	counted time.Time
	counts  []gendurable.QueueStats
	// hist is what the queues page's charts draw, shared by every viewer.
	hist history
}

// New returns the dashboard of client's schema. The client need not be started; if it is, its
// pokes tell workers on other nodes about signals and retries at once (Config.Poke), and
// otherwise their poll finds them. The stuck page judges rate limits, machines and steps by the
// client's configuration: give it the same Machines and RateLimits as your workers.
func New(client *gendurable.Client, opts *Options) (http.Handler, error) {
	if client == nil {
		return nil, errors.New("durableui: New: nil client")
	}
	h := &handler{client: client}
	if opts != nil {
		h.opts = *opts
	}
	o := &h.opts
	if o.Prefix == "" {
		o.Prefix = "/"
	}
	if !prefixPattern.MatchString(o.Prefix) {
		return nil, fmt.Errorf("durableui: Prefix %q: must start and end with / and hold only letters, digits and ._~- between", o.Prefix)
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Refresh > 0 && o.Refresh < time.Second {
		return nil, fmt.Errorf("durableui: Refresh %v: at least 1s, or negative for never", o.Refresh)
	}
	if o.ThroughputWindow == 0 {
		o.ThroughputWindow = gendurable.DefaultThroughputWindow
	}
	if o.ThroughputWindow < time.Second || o.ThroughputWindow > gendurable.MaxThroughputWindow {
		return nil, fmt.Errorf("durableui: ThroughputWindow %v: between 1s and %v", o.ThroughputWindow, gendurable.MaxThroughputWindow)
	}
	if o.CountEvery == 0 {
		o.CountEvery = DefaultCountEvery
	}
	if o.MaxPayloadBytes == 0 {
		o.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if o.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("durableui: MaxPayloadBytes %d: must be positive, or 0 for %d", o.MaxPayloadBytes, DefaultMaxPayloadBytes)
	}
	switch {
	case o.CSRFKey == nil:
		h.key = make([]byte, 32)
		_, _ = rand.Read(h.key)
	case len(o.CSRFKey) < 32:
		return nil, fmt.Errorf("durableui: CSRFKey: %d bytes, at least 32 needed", len(o.CSRFKey))
	default:
		h.key = append([]byte(nil), o.CSRFKey...)
	}
	for _, a := range o.AllowedHosts {
		if a == "" || strings.ContainsAny(a, " \t/\\") {
			return nil, fmt.Errorf("durableui: AllowedHosts: %q is not a host name (host or host:port, or *)", a)
		}
	}
	h.token = sha256.Sum256([]byte(o.Token))
	h.log = o.Logger
	if h.log == nil {
		h.log = slog.Default()
	}
	h.prefix = o.Prefix
	if err := h.parse(); err != nil {
		return nil, err
	}
	h.xorigin = http.NewCrossOriginProtection()
	h.routes()
	return h, nil
}

// parse builds one template per page: the layout and the page's content.
func (h *handler) parse() error {
	sum := sha256.New()
	if err := fs.WalkDir(files, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(path)
		sum.Write(b)
		return err
	}); err != nil {
		return fmt.Errorf("durableui: assets: %w", err)
	}
	h.version = hex.EncodeToString(sum.Sum(nil))[:12]
	h.pages = map[string]*template.Template{}
	for _, page := range []string{"queues", "instances", "instance", "stuck", "schedules", "bulk", "machines", "machine", "error", "signin"} {
		t, err := template.New(page).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return fmt.Errorf("durableui: template %s: %w", page, err)
		}
		h.pages[page] = t
	}
	return nil
}

func (h *handler) routes() {
	p := h.prefix
	m := http.NewServeMux()
	m.HandleFunc("GET "+p+"{$}", h.queues)
	m.HandleFunc("GET "+p+"signin", func(w http.ResponseWriter, r *http.Request) {
		h.signInPage(w, r, http.StatusOK, "", r.URL.Query().Get("next"))
	})
	m.HandleFunc("POST "+p+"signin", h.signIn)
	m.HandleFunc("POST "+p+"signout", h.signOut)
	m.HandleFunc("GET "+p+"instances", h.instances)
	m.HandleFunc("GET "+p+"instances/{id}", h.instance)
	m.HandleFunc("GET "+p+"stuck", h.stuck)
	m.HandleFunc("POST "+p+"instances/{id}/signal", h.action(h.signal))
	m.HandleFunc("POST "+p+"instances/{id}/retry", h.action(h.retry))
	m.HandleFunc("POST "+p+"instances/{id}/cancel", h.action(h.cancel))
	m.HandleFunc("POST "+p+"instances/{id}/pause", h.action(h.pauseInstance))
	m.HandleFunc("POST "+p+"instances/{id}/resume", h.action(h.resumeInstance))
	m.HandleFunc("POST "+p+"bulk", h.bulk)
	m.HandleFunc("POST "+p+"pause", h.pauseAction(true))
	m.HandleFunc("POST "+p+"resume", h.pauseAction(false))
	m.HandleFunc("GET "+p+"schedules", h.schedules)
	m.HandleFunc("GET "+p+"machines", h.machines)
	m.HandleFunc("GET "+p+"machines/{name}", h.machine)
	// The schedule is a form field, not a path segment: a name may hold "/" or be "..".
	m.HandleFunc("POST "+p+"schedules/pause", h.scheduleAction(h.pauseSchedule))
	m.HandleFunc("POST "+p+"schedules/resume", h.scheduleAction(h.resumeSchedule))
	m.HandleFunc("POST "+p+"schedules/trigger", h.scheduleAction(h.triggerSchedule))
	m.HandleFunc("POST "+p+"schedules/remove", h.scheduleAction(h.removeSchedule))
	static, _ := fs.Sub(files, "static")
	assets := http.StripPrefix(p+"static/", http.FileServerFS(static))
	m.Handle("GET "+p+"static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=86400")
		assets.ServeHTTP(w, r)
	}))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "There is no page at "+r.URL.Path+".")
	})
	h.mux = m
}

// ServeHTTP sets the headers every response carries and routes the request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Nothing is loaded from elsewhere, nothing runs inline, and no other site may frame the
	// pages (their forms act).
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	if !h.hostAllowed(r.Host) {
		h.log.WarnContext(r.Context(), "durableui: host refused", "host", r.Host, "remote", r.RemoteAddr)
		http.Error(w, fmt.Sprintf("durableui: this dashboard does not answer to the host %q: list it in its allowed hosts "+
			"(Options.AllowedHosts, gendurable ui --allow-host) if it is yours", r.Host), http.StatusForbidden)
		return
	}
	if !h.door(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// view is what every page's template gets.
type view struct {
	Title   string
	Nav     string // the active tab
	Prefix  string
	Version string
	Refresh int // seconds; 0 for no reload
	Actions bool
	SignOut bool // the dashboard has a token: show the sign-out button
	CSRF    string
	Now     time.Time
	Data    any
}

// render executes a page into a buffer first, so that a template error is a clean 500 and not
// half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, page, title, nav string, data any) {
	v := view{Title: title, Nav: nav, Prefix: h.prefix, Version: h.version, Actions: !h.opts.ReadOnly,
		SignOut: h.opts.Token != "" && page != "signin" && h.signedIn(r), Now: time.Now().UTC(), Data: data}
	if v.Actions {
		v.CSRF = h.csrfToken(w, r)
	}
	if page == "queues" && h.opts.Refresh > 0 {
		v.Refresh = int(h.opts.Refresh / time.Second)
	}
	var buf bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&buf, "layout", v); err != nil {
		h.log.ErrorContext(r.Context(), "durableui: render", "page", page, "err", err)
		http.Error(w, "durableui: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// failure is the error page's data.
type failure struct {
	Status     int
	StatusText string
	Message    string
	Back       backLink // a page to go back to; none: the queues
}

// backLink is the link of an error page back to the page the request came from.
type backLink struct {
	Href, Text string
}

// toInstance is the link back to an instance's page.
func (h *handler) toInstance(id int64) backLink {
	return backLink{fmt.Sprintf("%sinstances/%d", h.prefix, id), "Back to the instance"}
}

// toSchedules is the link back to the schedules page.
// toQueues is the link back to the queues page.
func (h *handler) toQueues() backLink {
	return backLink{h.prefix, "Back to the queues"}
}

func (h *handler) toSchedules() backLink {
	return backLink{h.prefix + "schedules", "Back to the schedules"}
}

// fail answers with the error page: the status, and a message for a person.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, message string) {
	h.failTo(w, r, status, message, backLink{})
}

// failTo is fail with a link back to the page the request came from.
func (h *handler) failTo(w http.ResponseWriter, r *http.Request, status int, message string, back backLink) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `FormToken realm="gendurable dashboard"`)
	}
	h.render(w, r, status, "error", http.StatusText(status), "", failure{Status: status,
		StatusText: http.StatusText(status), Message: message, Back: back})
}

// failErr answers for an error of the client: the status that fits it, and its text. Errors
// the user cannot fix are logged (never with a payload: the client's errors hold none).
func (h *handler) failErr(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.failErrTo(w, r, what, err, backLink{})
}

func (h *handler) failErrTo(w http.ResponseWriter, r *http.Request, what string, err error, back backLink) {
	status := statusOf(err)
	if status == http.StatusInternalServerError {
		h.log.ErrorContext(r.Context(), "durableui: "+what, "path", r.URL.Path, "err", err)
	}
	h.failTo(w, r, status, describe(err), back)
}

func statusOf(err error) int {
	if fe, ok := errors.AsType[*formError](err); ok {
		return fe.status
	}
	switch {
	case errors.Is(err, gendurable.ErrNotFound), errors.Is(err, gendurable.ErrUnknownSchedule),
		errors.Is(err, gendurable.ErrUnknownQueue), errors.Is(err, gendurable.ErrUnknownMachine):
		return http.StatusNotFound
	case errors.Is(err, gendurable.ErrWrongStatus), errors.Is(err, gendurable.ErrNoTarget),
		errors.Is(err, gendurable.ErrScheduleOwned):
		return http.StatusConflict
	case errors.Is(err, gendurable.ErrPayloadTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, gendurable.ErrInvalidInput), errors.Is(err, gendurable.ErrInvalidPayload):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
