package durabletype

import "time"

// ExplainReason is why an instance is not running right now (Client.Explain).
type ExplainReason string

// The reasons Client.Explain gives, the first that applies, in this order for a runnable row:
// paused, scheduled or backing off, blocked, gate full (or key busy), rate-limited, fair share,
// waiting.
const (
	// ExplainFinished: it is done, failed or cancelled.
	ExplainFinished ExplainReason = "finished"
	// ExplainExecuting: a step of it runs now (Claim says where).
	ExplainExecuting ExplainReason = "executing"
	// ExplainAwaiting: it waits for signals (Signals), until Until if it has a timeout.
	ExplainAwaiting ExplainReason = "awaiting"
	// ExplainJoining: it waits for its children (ChildrenLeft, a few of them in Children).
	ExplainJoining ExplainReason = "joining"
	// ExplainPaused: it, its queue or its machine is paused (Paused).
	ExplainPaused ExplainReason = "paused"
	// ExplainScheduled: it is due at Until.
	ExplainScheduled ExplainReason = "scheduled"
	// ExplainBackoff: its step failed (Error, at attempt Attempt) and it is tried again at Until.
	ExplainBackoff ExplainReason = "backoff"
	// ExplainBlocked: no running node can run it (Blocked says why: no node works its queue, or
	// every one lacks its machine, version or step; or no node runs at all).
	ExplainBlocked ExplainReason = "blocked"
	// ExplainGateFull: its concurrency key runs as many instances as its limit allows (Gate).
	ExplainGateFull ExplainReason = "gate_full"
	// ExplainRateLimited: its rate limit's bucket lacks the tokens its step needs (Rate).
	ExplainRateLimited ExplainReason = "rate_limited"
	// ExplainFairShare: it is runnable, has a fairness key (FairnessKey), and waits for its
	// key's turn: AheadOtherKeys of the Ahead instances before it in its queue's fair order are
	// of other keys.
	ExplainFairShare ExplainReason = "fair_share"
	// ExplainWaiting: it is runnable and waits for a free slot on a node that works its queue,
	// behind Ahead instances due before it.
	ExplainWaiting ExplainReason = "waiting"
)

// Explanation says why an instance is not running right now, as a reason with its details and
// as a sentence (Text).
type Explanation struct {
	ID     int64
	Status Status
	Reason ExplainReason
	// Text is the explanation as one sentence, for a person.
	Text string
	// At is the database's time of the explanation.
	At time.Time
	// Until is when the reason ends by itself, if it does: the due time (scheduled, backoff),
	// the await deadline, the next rate-limit token.
	Until *time.Time
	// Attempt and Error are the failed attempt and its error (backoff).
	Attempt int
	Error   string
	// Signals are the names awaited (awaiting).
	Signals []string
	// ChildrenLeft counts the children of the latest wave that have not finished, and Children
	// names up to five of them (joining).
	ChildrenLeft int
	Children     []int64
	// Paused is what pauses it (also set with another reason: a paused instance that awaits
	// signals awaits them first).
	Paused *ExplainPause
	// Blocked says why no running node can run it (blocked).
	Blocked string
	// Gate is its concurrency key's state (gate full).
	Gate *ExplainGate
	// Rate is its rate limit's bucket (rate-limited).
	Rate *ExplainRate
	// Claim is the claim of its running step (executing).
	Claim *ExplainClaim
	// Ahead counts the instances of its queue due before it, up to 10,000 (waiting, fair share);
	// AheadOtherKeys those of them of another fairness key than FairnessKey, its own (fair
	// share).
	Ahead          int64
	AheadOtherKeys int64
	FairnessKey    string
}

// ExplainPause is what pauses an instance: Kind "instance", "queue" or "machine".
type ExplainPause struct {
	Kind, Name, Reason string
	At                 time.Time
}

// ExplainGate is a concurrency key's state: Limit slots (0: a key no gate owns, which runs one
// at a time), Held of them taken, and up to five of the instances running under it.
type ExplainGate struct {
	Key     string
	Limit   int
	Held    int
	Holders []int64
}

// ExplainRate is a rate-limit bucket: the tokens it holds now, its refill rate per second, its
// burst, and the tokens the instance's step needs (Weight).
type ExplainRate struct {
	Key    string
	Tokens float64
	Rate   float64
	Burst  float64
	Weight int
}

// ExplainClaim is a running step's claim: the claim token, the client (name@host) that holds it
// and whether that client is in the node registry now, when it was claimed, and the end of its
// lease as the last heartbeat set it.
type ExplainClaim struct {
	Token      string
	Client     string
	ClientLive bool
	Since      time.Time
	LeaseUntil time.Time
}
