package durableui

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
)

// formSlack is what a form's other fields (CSRF token, name, reason, step, token) may add to
// its payload.
const formSlack = 64 << 10

// maxReason caps a cancel reason (it goes into the instance's error history).
const maxReason = 1000

// act is one action on one instance, called once every check has passed. It returns the
// query of the page to send the browser back to (what happened, for the message shown there).
type act func(r *http.Request, id int64) (url.Values, error)

// action wraps an act with the checks every POST passes (guard) before anything is read from
// the form or written to the database.
func (h *handler) action(do act) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := actionName(r)
		if !h.guard(w, r, name, backLink{}) {
			return
		}
		id, ok := h.pathID(w, r)
		if !ok {
			return
		}
		back, err := do(r, id)
		if err != nil {
			if status := statusOf(err); status != http.StatusInternalServerError {
				h.log.InfoContext(r.Context(), "durableui: action failed", "action", name, "id", id, "status", status)
			}
			h.failErrTo(w, r, name, err, h.toInstance(id))
			return
		}
		h.log.InfoContext(r.Context(), "durableui: action", "action", name, "id", id, "remote", r.RemoteAddr)
		back.Set("done", name)
		http.Redirect(w, r, fmt.Sprintf("%sinstances/%d?%s", h.prefix, id, back.Encode()), http.StatusSeeOther)
	}
}

// actionName is the last segment of an action's path: "cancel", "pause".
func actionName(r *http.Request) string {
	return r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
}

// guard runs the checks every POST passes, in the package's documented order, and answers a
// request that fails one with the error page (linking to back, if set). It reports whether the
// request passed; its form is parsed then.
func (h *handler) guard(w http.ResponseWriter, r *http.Request, name string, back backLink) bool {
	refuse := func(status int, why, message string) bool {
		h.log.WarnContext(r.Context(), "durableui: action refused", "action", name, "path", r.URL.Path,
			"status", status, "why", why, "remote", r.RemoteAddr)
		h.failTo(w, r, status, message, back)
		return false
	}
	if h.opts.ReadOnly {
		return refuse(http.StatusForbidden, "read-only", "This dashboard is read-only: it takes no actions.")
	}
	if err := h.xorigin.Check(r); err != nil {
		return refuse(http.StatusForbidden, "cross-origin", "A page of another site tried to send this form; it was refused.")
	}
	// A payload may be escaped threefold in a URL-encoded form (%XX); its decoded size is
	// checked by the signal action.
	r.Body = http.MaxBytesReader(w, r.Body, int64(3*h.opts.MaxPayloadBytes+formSlack))
	if err := r.ParseForm(); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return refuse(http.StatusRequestEntityTooLarge, "too large",
				fmt.Sprintf("The form is too large: a signal's payload may hold at most %d bytes. Nothing was sent.", h.opts.MaxPayloadBytes))
		}
		return refuse(http.StatusBadRequest, "malformed form", "The form could not be read: "+err.Error())
	}
	if !h.checkCSRF(r) {
		return refuse(http.StatusForbidden, "csrf",
			"The form did not carry the CSRF token of your dashboard session: it was not sent from this dashboard, or the page is stale. Reload the page and try again.")
	}
	if h.opts.Token != "" && !h.signedIn(r) {
		// (A bearer token was checked before routing; a wrong one never gets here.)
		if _, ok := bearer(r); !ok {
			tok := r.PostForm.Get("token")
			if tok == "" {
				return refuse(http.StatusUnauthorized, "no token",
					"This action needs the dashboard's token: sign in, or send it in the form's token field.")
			}
			if !h.tryToken(w, r, tok, func(status int, msg string) { refuse(status, "token", msg) }) {
				return false
			}
		}
	}
	if h.opts.Authorize != nil {
		if err := h.opts.Authorize(r); err != nil {
			status := http.StatusForbidden
			if errors.Is(err, ErrUnauthenticated) {
				status = http.StatusUnauthorized
			}
			return refuse(status, "authorize", "Not allowed: "+err.Error())
		}
	}
	return true
}

// formError is a field of an action's form that cannot be used as it is.
type formError struct {
	status int
	msg    string
}

func (e *formError) Error() string { return e.msg }

func (h *handler) signal(r *http.Request, id int64) (url.Values, error) {
	name := r.PostForm.Get("name")
	if name == "" {
		return nil, &formError{http.StatusBadRequest, "A signal needs a name."}
	}
	var payload any
	if raw := strings.TrimSpace(r.PostForm.Get("payload")); raw != "" {
		if len(raw) > h.opts.MaxPayloadBytes {
			return nil, &formError{http.StatusRequestEntityTooLarge,
				fmt.Sprintf("The payload is %d bytes; the limit is %d. Nothing was sent.", len(raw), h.opts.MaxPayloadBytes)}
		}
		var doc json.RawMessage
		if err := json.Unmarshal([]byte(raw), &doc); err != nil {
			return nil, &formError{http.StatusBadRequest, "The payload is not valid JSON (" + err.Error() + "). Nothing was sent."}
		}
		payload = doc
	}
	res, err := h.client.Signal(r.Context(), gendurable.ByID(id), name, payload)
	if err != nil {
		return nil, err
	}
	back := url.Values{"signal": {strconv.FormatInt(res.SignalID, 10)}}
	if res.Woke {
		back.Set("woke", "1")
	}
	return back, nil
}

func (h *handler) retry(r *http.Request, id int64) (url.Values, error) {
	step := strings.TrimSpace(r.PostForm.Get("step"))
	if err := h.client.Retry(r.Context(), id, &gendurable.RetryOpts{Step: step}); err != nil {
		return nil, err
	}
	return url.Values{}, nil
}

func (h *handler) cancel(r *http.Request, id int64) (url.Values, error) {
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if utf8.RuneCountInString(reason) > maxReason {
		return nil, &formError{http.StatusBadRequest, fmt.Sprintf("The reason is too long: at most %d characters.", maxReason)}
	}
	if reason == "" {
		reason = "cancelled from the dashboard"
	}
	if err := h.client.Cancel(r.Context(), id, reason); err != nil {
		return nil, err
	}
	return url.Values{}, nil
}
