package durableui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
)

// pauseAction pauses (pause true) or resumes the queue or machine its form names (field "queue"
// or "machine", exactly one), and sends the browser back to the queues page.
func (h *handler) pauseAction(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		action := actionName(r)
		back := h.toQueues()
		if !h.guard(w, r, action, back) {
			return
		}
		t := gendurable.PauseTarget{Queue: strings.TrimSpace(r.PostForm.Get("queue")),
			Machine: strings.TrimSpace(r.PostForm.Get("machine"))}
		if (t.Queue == "") == (t.Machine == "") {
			h.failTo(w, r, http.StatusBadRequest, "The form must name one queue or one machine. Nothing was changed.", back)
			return
		}
		reason := strings.TrimSpace(r.PostForm.Get("reason"))
		if utf8.RuneCountInString(reason) > maxReason {
			h.failTo(w, r, http.StatusBadRequest, fmt.Sprintf("The reason is too long: at most %d characters.", maxReason), back)
			return
		}
		var err error
		if pause {
			err = h.client.Pause(r.Context(), t, reason)
		} else {
			err = h.client.Resume(r.Context(), t)
		}
		if err != nil {
			if status := statusOf(err); status != http.StatusInternalServerError {
				h.log.InfoContext(r.Context(), "durableui: action failed", "action", action, "target", t.String(), "status", status)
			}
			switch {
			case errors.Is(err, gendurable.ErrUnknownQueue):
				h.failTo(w, r, http.StatusNotFound, fmt.Sprintf("There is no queue %q: no node works it. Nothing was changed.", t.Queue), back)
			case errors.Is(err, gendurable.ErrUnknownMachine):
				h.failTo(w, r, http.StatusNotFound, fmt.Sprintf("There is no machine %q: no node registers it. Nothing was changed.", t.Machine), back)
			default:
				h.failErrTo(w, r, action, err, back)
			}
			return
		}
		h.log.InfoContext(r.Context(), "durableui: action", "action", action, "target", t.String(), "remote", r.RemoteAddr)
		q := url.Values{"done": {action}}
		if t.Queue != "" {
			q.Set("queue", t.Queue)
		} else {
			q.Set("machine", t.Machine)
		}
		http.Redirect(w, r, h.prefix+"?"+q.Encode(), http.StatusSeeOther)
	}
}

func (h *handler) pauseInstance(r *http.Request, id int64) (url.Values, error) {
	return url.Values{}, h.client.Pause(r.Context(), gendurable.PauseTarget{Instance: id}, "")
}

func (h *handler) resumeInstance(r *http.Request, id int64) (url.Values, error) {
	return url.Values{}, h.client.Resume(r.Context(), gendurable.PauseTarget{Instance: id})
}
