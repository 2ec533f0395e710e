package durableui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
)

// The CSRF defence is a signed double-submit token: the pages set a random session value in an
// HttpOnly, SameSite=Lax cookie, and every form carries HMAC-SHA256(key, that value). A POST
// passes only with both, matching (compared in constant time). Another site can make a browser
// send the cookie but can neither read it nor compute the token; a value planted in the cookie
// by a sibling site is useless without the key.
const csrfCookie = "gendurable_csrf"

// session returns the request's session value, if its cookie holds a well-formed one.
func session(r *http.Request) ([]byte, bool) {
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return nil, false
	}
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || len(b) != 32 {
		return nil, false
	}
	return b, true
}

func (h *handler) sign(sess []byte) []byte {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("gendurable csrf\x00"))
	m.Write(sess)
	return m.Sum(nil)
}

// csrfToken returns the token for the forms of the page being rendered, setting the session
// cookie first if the request has none.
func (h *handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	sess, ok := session(r)
	if !ok {
		sess = make([]byte, 32)
		_, _ = rand.Read(sess)
		http.SetCookie(w, &http.Cookie{
			Name:     csrfCookie,
			Value:    base64.RawURLEncoding.EncodeToString(sess),
			Path:     h.prefix,
			HttpOnly: true,
			Secure:   r.TLS != nil,
			SameSite: http.SameSiteLaxMode,
		})
	}
	return base64.RawURLEncoding.EncodeToString(h.sign(sess))
}

// checkCSRF reports whether the parsed form carries the token of the request's session.
func (h *handler) checkCSRF(r *http.Request) bool {
	sess, ok := session(r)
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(r.PostForm.Get("csrf"))
	if err != nil {
		return false
	}
	return hmac.Equal(got, h.sign(sess))
}

// checkToken compares a submitted token with Options.Token in constant time (digests, so the
// length does not leak either).
func (h *handler) checkToken(got string) bool {
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], h.token[:]) == 1
}
