package gendurable

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gendurable/gendurable/durabletype"
	"github.com/gendurable/gendurable/internal/engine"
	"github.com/gendurable/gendurable/internal/store"
)

// Explanation says why an instance is not running right now; see Client.Explain.
type Explanation = durabletype.Explanation

// ExplainReason is the kind of an Explanation.
type ExplainReason = durabletype.ExplainReason

// ExplainPause is what pauses an instance (Explanation.Paused).
type ExplainPause = durabletype.ExplainPause

// ExplainGate is a concurrency key's state (Explanation.Gate).
type ExplainGate = durabletype.ExplainGate

// ExplainRate is a rate-limit bucket's state (Explanation.Rate).
type ExplainRate = durabletype.ExplainRate

// ExplainClaim is a running step's claim (Explanation.Claim).
type ExplainClaim = durabletype.ExplainClaim

// The reasons of an Explanation; see durabletype for each.
const (
	ExplainFinished    = durabletype.ExplainFinished
	ExplainExecuting   = durabletype.ExplainExecuting
	ExplainAwaiting    = durabletype.ExplainAwaiting
	ExplainJoining     = durabletype.ExplainJoining
	ExplainPaused      = durabletype.ExplainPaused
	ExplainScheduled   = durabletype.ExplainScheduled
	ExplainBackoff     = durabletype.ExplainBackoff
	ExplainBlocked     = durabletype.ExplainBlocked
	ExplainGateFull    = durabletype.ExplainGateFull
	ExplainRateLimited = durabletype.ExplainRateLimited
	ExplainFairShare   = durabletype.ExplainFairShare
	ExplainWaiting     = durabletype.ExplainWaiting
)

// Explain says why the instance is not running right now, as a reason with its details and as a
// sentence: finished; executing (the claim, its client, whether that client is in the node
// registry, the lease); awaiting signals (which, until when); joining (how many children are
// left, a few of them); and for a runnable row, the first that applies of: paused (by the
// instance, its queue or its machine), scheduled for later or backing off after an error (until
// when), blocked (no running node works its queue or knows its machine, version or step), its
// concurrency key's gate full or key busy (the limit and the instances holding it), its rate
// limit's bucket empty (when the next token comes), waiting for its fair share (an instance with
// a fairness key behind instances of other keys in its queue's fair order), and otherwise waiting
// for a free slot (how many due instances are ahead of it). It reads a few rows by index in one snapshot, and the
// node registry; it changes nothing. No instance: ErrNotFound.
func (c *Client) Explain(ctx context.Context, id int64) (*Explanation, error) {
	r, err := c.store.Explain(ctx, c.pool, id)
	if err != nil {
		return nil, fmt.Errorf("gendurable: explain %d: %w", id, err)
	}
	nodes, err := c.store.LiveNodes(ctx, c.pool, engine.NodeLive)
	if err != nil {
		return nil, fmt.Errorf("gendurable: explain %d: read the node registry: %w", id, err)
	}
	return explain(id, r, nodes), nil
}

// explain turns what Explain read into the explanation.
func explain(id int64, r *store.ExplainRow, nodes []store.Node) *Explanation {
	x := &Explanation{ID: id, Status: r.Status, At: r.Now}
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	in := func(t time.Time) string {
		d := t.Sub(r.Now)
		if d <= 0 {
			return "now"
		}
		return "in " + roundDuration(d).String()
	}
	switch {
	case r.PausedAt != nil:
		x.Paused = &ExplainPause{Kind: "instance", At: *r.PausedAt}
	case r.QueuePauseAt != nil:
		x.Paused = &ExplainPause{Kind: "queue", Name: r.Queue, Reason: deref(r.QueuePauseReason), At: *r.QueuePauseAt}
	case r.MachinePauseAt != nil:
		x.Paused = &ExplainPause{Kind: "machine", Name: r.Machine, Reason: deref(r.MachinePauseReason), At: *r.MachinePauseAt}
	}
	pausedToo := ""
	if x.Paused != nil {
		pausedToo = "; it is paused too (" + pauseText(x.Paused) + "), so it will not run until resumed"
	}
	switch r.Status {
	case StatusDone, StatusFailed, StatusCancelled:
		x.Reason, x.Text = ExplainFinished, fmt.Sprintf("It is %s: it will not run again (a failed or cancelled instance can be retried).", r.Status)
		if r.Status == StatusDone {
			x.Text = "It is done: it will not run again."
		}
		return x
	case StatusExecuting:
		x.Reason = ExplainExecuting
		cl := &ExplainClaim{Token: r.LockedBy, Since: r.UpdatedAt}
		if r.LockedUntil != nil {
			cl.LeaseUntil = *r.LockedUntil
		}
		cl.Client, cl.ClientLive = claimNode(r.LockedBy, nodes)
		x.Claim = cl
		live := "which the node registry shows running"
		if !cl.ClientLive {
			live = "which the node registry does not show running"
		}
		x.Text = fmt.Sprintf("It is running step %s (attempt %d) on %s, %s, claimed %s ago; its lease runs to %s",
			r.Step, r.Attempt, cl.Client, live, roundDuration(r.Now.Sub(cl.Since)), at(cl.LeaseUntil))
		if cl.LeaseUntil.Before(r.Now) {
			x.Text += fmt.Sprintf(", %s ago: its heartbeat stopped, and the reaper will release it at its next sweep", roundDuration(r.Now.Sub(cl.LeaseUntil)))
		} else {
			x.Text += " (the last heartbeat set it)"
		}
		x.Text += pausedToo + "."
		return x
	case StatusAwaiting:
		x.Reason, x.Signals, x.Until = ExplainAwaiting, r.AwaitNames, r.AwaitDeadline
		x.Text = fmt.Sprintf("It waits for a signal named %s", orList(r.AwaitNames))
		if r.AwaitDeadline != nil {
			x.Text += fmt.Sprintf(", or its timeout at %s (%s)", at(*r.AwaitDeadline), in(*r.AwaitDeadline))
		}
		x.Text += ", before step " + r.Step + pausedToo + "."
		return x
	case StatusJoining:
		x.Reason, x.ChildrenLeft, x.Children = ExplainJoining, int(r.ChildrenLeft), r.Children
		x.Text = fmt.Sprintf("It waits for %d of its children to finish (%s), before step %s%s.",
			r.ChildrenLeft, idList(r.Children, r.ChildrenLeft), r.Step, pausedToo)
		return x
	}
	// Runnable (available).
	if x.Paused != nil {
		x.Reason, x.Text = ExplainPaused, "It is paused ("+pauseText(x.Paused)+"): no node claims it until it is resumed."
		return x
	}
	if r.ScheduledAt.After(r.Now) {
		x.Until = &r.ScheduledAt
		if r.LastError != nil && r.Attempt > 0 && r.LastErrorAttempt == r.Attempt {
			x.Reason, x.Attempt, x.Error = ExplainBackoff, int(r.Attempt), *r.LastError
			x.Text = fmt.Sprintf("Step %s failed at attempt %d (%s); it is tried again at %s (%s).",
				r.Step, r.Attempt, oneLine(*r.LastError, 200), at(r.ScheduledAt), in(r.ScheduledAt))
		} else {
			x.Reason = ExplainScheduled
			x.Text = fmt.Sprintf("It is scheduled for %s (%s), step %s.", at(r.ScheduledAt), in(r.ScheduledAt), r.Step)
		}
		return x
	}
	if len(nodes) == 0 {
		x.Reason, x.Blocked = ExplainBlocked, "no node is running (the node registry shows none)"
	} else {
		x.Blocked = engine.Blocked(nodes, store.LiveGroup{Queue: r.Queue, Machine: r.Machine, Version: int(r.MachineVersion), Step: r.Step})
		if x.Blocked != "" {
			x.Reason = ExplainBlocked
		}
	}
	if x.Reason == ExplainBlocked {
		x.Text = "No running node can run it: " + x.Blocked + "."
		return x
	}
	if r.ConcurrencyKey != nil {
		g := &ExplainGate{Key: *r.ConcurrencyKey, Limit: int(r.GateCapacity), Held: int(r.GateN), Holders: r.GateHolders}
		full := r.GateN > 0     // a key no gate owns: one at a time
		if r.GateCapacity > 0 { // a gated key: its counters
			g.Held = int(r.GateHeld)
			full = r.GateHeld >= r.GateCapacity
		}
		if full {
			x.Reason, x.Gate = ExplainGateFull, g
			if g.Limit > 0 {
				x.Text = fmt.Sprintf("Its concurrency key %s holds all %d of its slots (%s): it runs when one is given back.",
					g.Key, g.Limit, idList(g.Holders, r.GateN))
			} else {
				x.Text = fmt.Sprintf("Its concurrency key %s runs one instance at a time, and %s runs now: it runs when that one's step ends.",
					g.Key, idList(g.Holders, r.GateN))
			}
			return x
		}
	}
	if r.RateLimit != nil && r.Bucket != nil && r.Bucket[0] < float64(r.Weight) {
		b := r.Bucket
		x.Reason = ExplainRateLimited
		x.Rate = &ExplainRate{Key: *r.RateLimit, Tokens: b[0], Rate: b[1], Burst: b[2], Weight: int(r.Weight)}
		if b[1] > 0 {
			wait := time.Duration(math.Ceil((float64(r.Weight) - b[0]) / b[1] * float64(time.Second)))
			next := r.Now.Add(wait)
			x.Until = &next
			refill := fmt.Sprintf("%.3g tokens a second", b[1])
			if b[1] < 1 {
				refill = "a token every " + roundDuration(time.Duration(float64(time.Second)/b[1])).String()
			}
			x.Text = fmt.Sprintf("Its rate limit %s has %.2f tokens and its step needs %d; enough come at %s (%s; it refills %s).",
				*r.RateLimit, b[0], r.Weight, at(next), in(next), refill)
		} else {
			x.Text = fmt.Sprintf("Its rate limit %s has %.2f tokens, its step needs %d, and it refills at no rate.", *r.RateLimit, b[0], r.Weight)
		}
		return x
	}
	x.Reason, x.Ahead = ExplainWaiting, r.Ahead
	ahead := fmt.Sprintf("%d due instances are", r.Ahead)
	switch {
	case r.Ahead == 0:
		ahead = "none is"
	case r.Ahead == 1:
		ahead = "1 due instance is"
	case r.Ahead >= 10000:
		ahead = "10,000 or more due instances are"
	}
	if r.FairKey != nil && r.AheadOtherKeys > 0 {
		x.Reason, x.FairnessKey, x.AheadOtherKeys = ExplainFairShare, *r.FairKey, r.AheadOtherKeys
		x.Text = fmt.Sprintf("It is runnable and waits for its fair share of queue %s (fairness key %s): %s ahead of it "+
			"in the fair order, %d of them of other keys.", r.Queue, *r.FairKey, ahead, r.AheadOtherKeys)
		return x
	}
	x.Text = fmt.Sprintf("It is runnable and waits for a free slot on a node that works queue %s; %s ahead of it.", r.Queue, ahead)
	return x
}

// claimNode returns the client a claim token names (name@host) and whether a live node holds it.
// A token is <client>:<queue>@<host>-<random>#<pick>; the node's id is <client>@<host>-<random>.
func claimNode(token string, nodes []store.Node) (string, bool) {
	base := token
	if i := strings.LastIndexByte(base, '#'); i >= 0 {
		base = base[:i]
	}
	name, at := base, strings.LastIndexByte(base, '@')
	if c := strings.IndexByte(base, ':'); c >= 0 && at > c {
		name = base[:c]
	}
	if at < 0 {
		return token, false
	}
	id := name + base[at:]
	for _, n := range nodes {
		if n.ID == id {
			return name + "@" + n.Host, true
		}
	}
	host := base[at+1:]
	if d := strings.LastIndexByte(host, '-'); d > 0 {
		host = host[:d]
	}
	return name + "@" + host, false
}

// roundDuration rounds d for a sentence: to the second from a minute up, else to the millisecond.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func pauseText(p *ExplainPause) string {
	var s string
	if p.Kind == "instance" {
		s = "the instance itself, since " + p.At.UTC().Format(time.RFC3339)
	} else {
		s = fmt.Sprintf("its %s %s, since %s", p.Kind, p.Name, p.At.UTC().Format(time.RFC3339))
	}
	if p.Reason != "" {
		s += ": " + p.Reason
	}
	return s
}

func orList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) <= 1 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// idList names up to five ids of n: "instances 4, 7 and 9 more".
func idList(ids []int64, n int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	s := "instance"
	if n != 1 {
		s = "instances"
	}
	s += " " + strings.Join(parts, ", ")
	if more := n - int64(len(ids)); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
