package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/durableui"
	"github.com/stretchr/testify/require"
)

const doorToken = "correct horse battery staple"

func withToken(o *durableui.Options) { o.Token = doorToken }

// signIn types token into the sign-in form and submits it, returning the status of the page it
// lands on.
func signIn(t *testing.T, ctx context.Context, token string) int {
	t.Helper()
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(`#signin-form input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`#signin-form input[name="token"]`), token))
	return load(t, ctx, chromedp.Click(chromedp.CSS(`#signin-form button[type="submit"]`)))
}

// With a token, the dashboard shows nothing before the browser signs in: the page asked for
// becomes the sign-in page, a wrong token is refused, the right one leads on to the page asked
// for, whose actions then need nothing more; signing out closes the door again.
func TestSignInGuardsEveryPage(t *testing.T) {
	s := newSite(t, withToken)
	ctx := newBrowser(t)
	asked := acceptDialogs(t, ctx)
	victim := s.awaiting[0]
	page := fmt.Sprintf("%s/instances/%d", s.url, victim)
	resp := get(t, ctx, chromedp.NavigateResponse(page))
	require.Equal(t, http.StatusUnauthorized, int(resp.Status))
	require.Equal(t, "Sign in", strings.TrimSpace(get(t, ctx, chromedp.Text(chromedp.CSS("h1")))))
	body := get(t, ctx, chromedp.Text(chromedp.CSS("body")))
	require.NotContains(t, body, "A-10", "the sign-in page shows no instance's data")
	do(t, ctx, shoot(t, "dashboard-signin"))

	require.Equal(t, http.StatusForbidden, signIn(t, ctx, "horse"))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("#signin-message"))), "The token is wrong")

	require.Equal(t, http.StatusOK, signIn(t, ctx, doorToken))
	require.Equal(t, page, get(t, ctx, chromedp.Location()), "the sign-in leads on to the page asked for")
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("h1"))), fmt.Sprintf("Instance %d", victim))
	none := get(t, ctx, chromedp.Evaluate[bool](`document.querySelector('input[name="token"]') === null`))
	require.True(t, none, "a signed-in browser is not asked for the token again")
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(`#cancel-form input[name="reason"]`), "signed in"))
	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`#cancel-form button[type="submit"]`))))
	asked("never run again")
	require.Equal(t, gendurable.StatusCancelled, s.status(t, victim).Status)

	require.Equal(t, http.StatusOK, load(t, ctx, chromedp.Click(chromedp.CSS(`form.signout button`))))
	require.Equal(t, "Sign in", strings.TrimSpace(get(t, ctx, chromedp.Text(chromedp.CSS("h1")))))
	resp = get(t, ctx, chromedp.NavigateResponse(s.url+"/instances"))
	require.Equal(t, http.StatusUnauthorized, int(resp.Status), "signed out, the pages need the token again")
}

// Wrong tokens typed into the sign-in form are slowed down: after five, the browser's address
// is refused for a while, even with the right token.
func TestWrongTokensAreSlowedDownInTheBrowser(t *testing.T) {
	s := newSite(t, withToken)
	ctx := newBrowser(t)
	get(t, ctx, chromedp.NavigateResponse(s.url+"/"))
	for i := range 5 {
		require.Equal(t, http.StatusForbidden, signIn(t, ctx, fmt.Sprintf("guess %d", i)), "guess %d", i)
	}
	require.Equal(t, http.StatusTooManyRequests, signIn(t, ctx, doorToken))
	msg := get(t, ctx, chromedp.Text(chromedp.CSS("#signin-message")))
	require.Contains(t, msg, "Too many wrong tokens from your address: try again in")
	do(t, ctx, shoot(t, "dashboard-signin-throttled"))
}

// DNS rebinding: a page of the attacker's name, which its DNS now points at 127.0.0.1, asks the
// dashboard for its pages as that name. The browser here maps the name to 127.0.0.1 the way the
// rebound DNS would; the dashboard answers only to addresses, localhost and its allowed names.
func TestDNSRebindingIsRefused(t *testing.T) {
	s := newSite(t)
	u, err := url.Parse(s.url)
	require.NoError(t, err)
	ctx := newBrowser(t, chromedp.Flag("host-resolver-rules", "MAP attacker.example 127.0.0.1"))
	rebound := fmt.Sprintf("http://attacker.example:%s/instances", u.Port())
	resp := get(t, ctx, chromedp.NavigateResponse(rebound))
	require.Equal(t, http.StatusForbidden, int(resp.Status))
	require.Contains(t, get(t, ctx, chromedp.Text(chromedp.CSS("body"))), `does not answer to the host "attacker.example:`)
	require.NotContains(t, get(t, ctx, chromedp.Text(chromedp.CSS("body"))), "A-10")
	// The same server by its address answers.
	resp = get(t, ctx, chromedp.NavigateResponse(s.url+"/instances"))
	require.Equal(t, http.StatusOK, int(resp.Status))
}
