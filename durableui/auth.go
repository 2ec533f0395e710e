package durableui

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The door: with Options.Token set, every page but the sign-in page and the stylesheet and
// script needs the token. A browser signs in once (POST signin) and gets a cookie that proves
// it knew the token: HMAC-SHA256(key, expiry and a digest of the token), HttpOnly, for
// signInLifetime; changing the token signs every browser out. A script sends
// "Authorization: Bearer <token>" instead. Wrong tokens are counted per client address
// (strikes): from the freeStrikes-th on, that address is refused (429) for a time that doubles
// with each further wrong token.
const (
	authCookie     = "gendurable_auth"
	signInLifetime = 12 * time.Hour
	// After freeStrikes wrong tokens from one address, it is refused for firstLockout; each
	// further wrong token doubles that, up to maxLockout. An address's strikes are forgotten
	// strikeMemory after its last one.
	freeStrikes  = 5
	firstLockout = 30 * time.Second
	maxLockout   = 15 * time.Minute
	strikeMemory = 15 * time.Minute
)

// authValue is the sign-in cookie's value for a sign-in valid until exp (Unix seconds).
func (h *handler) authValue(exp int64) string {
	e := strconv.FormatInt(exp, 10)
	return e + "." + base64.RawURLEncoding.EncodeToString(h.authMAC(e))
}

func (h *handler) authMAC(exp string) []byte {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("gendurable auth\x00"))
	m.Write([]byte(exp))
	m.Write([]byte{0})
	m.Write(h.token[:])
	return m.Sum(nil)
}

// signedIn reports whether the request carries a valid, unexpired sign-in cookie.
func (h *handler) signedIn(r *http.Request) bool {
	c, err := r.Cookie(authCookie)
	if err != nil {
		return false
	}
	exp, mac, ok := strings.Cut(c.Value, ".")
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || !hmac.Equal(got, h.authMAC(exp)) {
		return false
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && time.Now().Unix() < n
}

// bearer returns the token of an "Authorization: Bearer" header, if the request has one.
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// door decides a request of a dashboard with a token before it is routed, and answers the ones
// it refuses: it reports whether the request goes on. The sign-in page and the assets are open;
// a valid cookie or bearer token lets anything through; without either, a page (GET) gets the
// sign-in page and a POST goes on to the action's own checks (guard), which accept a form that
// carries the token.
func (h *handler) door(w http.ResponseWriter, r *http.Request) bool {
	if h.opts.Token == "" || h.open(r) || h.signedIn(r) {
		return true
	}
	if tok, ok := bearer(r); ok {
		return h.tryToken(w, r, tok, func(status int, msg string) {
			http.Error(w, "durableui: "+msg, status)
		})
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		h.signInPage(w, r, http.StatusUnauthorized, "", r.URL.RequestURI())
		return false
	}
	return true
}

// open reports whether a request needs no token: the sign-in form and its post, and the assets.
func (h *handler) open(r *http.Request) bool {
	p := strings.TrimPrefix(r.URL.Path, h.prefix)
	return p == "signin" || strings.HasPrefix(p, "static/")
}

// tryToken checks a presented token against Options.Token, under the strike count of the
// request's address: it reports whether the token is right, and otherwise calls refuse with the
// status (429 while the address is locked out, 403 for a wrong token) and a message.
func (h *handler) tryToken(w http.ResponseWriter, r *http.Request, tok string, refuse func(status int, msg string)) bool {
	addr := clientAddr(r)
	if wait := h.strikes.wait(addr, time.Now()); wait > 0 {
		secs := int(wait.Round(time.Second) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
		h.log.WarnContext(r.Context(), "durableui: token refused: too many wrong tokens", "remote", r.RemoteAddr, "retry_after", wait)
		refuse(http.StatusTooManyRequests, fmt.Sprintf("Too many wrong tokens from your address: try again in %s.", wait.Round(time.Second)))
		return false
	}
	if !h.checkToken(tok) {
		h.strikes.fail(addr, time.Now())
		h.log.WarnContext(r.Context(), "durableui: wrong token", "remote", r.RemoteAddr, "path", r.URL.Path)
		refuse(http.StatusForbidden, "The token is wrong. Nothing was changed.")
		return false
	}
	h.strikes.forgive(addr)
	return true
}

// clientAddr is the address the strikes are counted against: the connection's IP (a proxy in
// front of the dashboard makes all its clients one address).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// signInForm is the sign-in page's data.
type signInForm struct {
	Status  int
	Message string // why the last try failed
	Next    string // where to go once signed in
}

func (h *handler) signInPage(w http.ResponseWriter, r *http.Request, status int, msg, next string) {
	h.render(w, r, status, "signin", "Sign in", "", signInForm{Status: status, Message: msg, Next: h.safeNext(next)})
}

// signIn checks the sign-in form's token and, if it is right, sets the sign-in cookie and sends
// the browser on to the page it asked for.
func (h *handler) signIn(w http.ResponseWriter, r *http.Request) {
	if h.opts.Token == "" {
		http.Redirect(w, r, h.prefix, http.StatusSeeOther)
		return
	}
	if err := h.xorigin.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, "A page of another site tried to sign in to this dashboard; it was refused.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, formSlack)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	next := h.safeNext(r.PostForm.Get("next"))
	if !h.tryToken(w, r, r.PostForm.Get("token"), func(status int, msg string) {
		h.signInPage(w, r, status, msg, next)
	}) {
		return
	}
	exp := time.Now().Add(signInLifetime)
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: h.authValue(exp.Unix()), Path: h.prefix, Expires: exp,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
	h.log.InfoContext(r.Context(), "durableui: signed in", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// signOut clears the sign-in cookie.
func (h *handler) signOut(w http.ResponseWriter, r *http.Request) {
	if err := h.xorigin.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, "A page of another site tried to sign you out; it was refused.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: "", Path: h.prefix, MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, h.prefix+"signin", http.StatusSeeOther)
}

// safeNext keeps a sign-in's destination on this dashboard: a path under the prefix, else the
// queues page.
func (h *handler) safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, h.prefix) ||
		strings.HasPrefix(next, "//") || strings.Contains(next, "\\") || strings.TrimPrefix(u.Path, h.prefix) == "signin" {
		return h.prefix
	}
	return u.RequestURI()
}

// hostAllowed reports whether the dashboard answers to a request's Host: an IP address, a
// loopback name ("localhost"), or one of Options.AllowedHosts ("*": any). A name an attacker's
// DNS points at 127.0.0.1 (DNS rebinding) is none of these.
func (h *handler) hostAllowed(hostport string) bool {
	host := hostport
	if hh, _, err := net.SplitHostPort(hostport); err == nil {
		host = hh
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, a := range h.opts.AllowedHosts {
		a = strings.ToLower(a)
		if a == "*" || a == host || a == strings.ToLower(hostport) {
			return true
		}
	}
	return false
}

// strikes counts the wrong tokens of each client address.
type strikes struct {
	mu sync.Mutex
	by map[string]*strike
}

type strike struct {
	n     int
	last  time.Time
	until time.Time // refused until then
}

// wait returns how long addr is still refused (0: not).
func (s *strikes) wait(addr string, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.by[addr]; st != nil && now.Before(st.until) {
		return st.until.Sub(now)
	}
	return 0
}

// fail counts a wrong token from addr.
func (s *strikes) fail(addr string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string]*strike{}
	}
	if len(s.by) >= 4096 {
		for a, st := range s.by {
			if now.Sub(st.last) > strikeMemory && now.After(st.until) {
				delete(s.by, a)
			}
		}
	}
	st := s.by[addr]
	if st == nil || (now.Sub(st.last) > strikeMemory && now.After(st.until)) {
		st = &strike{}
		s.by[addr] = st
	}
	st.n++
	st.last = now
	if over := st.n - freeStrikes; over >= 0 {
		st.until = now.Add(min(firstLockout<<min(over, 10), maxLockout))
	}
}

// forgive clears addr's strikes after a right token.
func (s *strikes) forgive(addr string) {
	s.mu.Lock()
	delete(s.by, addr)
	s.mu.Unlock()
}
