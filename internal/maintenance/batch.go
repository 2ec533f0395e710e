package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/store"
)

// shrinking is the batch of a maintenance statement that the server may cancel (query_canceled:
// a statement_timeout on the role, which a full batch can outlast): each cancellation halves it,
// since a timeout the engine cannot change would otherwise fail every sweep while the work piles
// up. It grows back, doubling, once a full batch runs in under a quarter of the time the last
// cancelled statement ran (the cancellation came from a slow spell, not from a timeout the
// smaller batch is close to), or once no statement was cancelled for regrowAfter (one doubling
// each time: a lasting timeout then costs one cancelled statement per period). The zero value
// starts at the configured size.
type shrinking struct {
	n, def int
	// began is when the statement of the last size call began; limit how long the last
	// cancelled one ran, cut when it was cancelled or the batch last grew for want of news.
	began, cut time.Time
	limit      time.Duration
}

// regrowAfter is how long a shrunk batch stays without a cancellation before it doubles anyway.
const regrowAfter = 10 * time.Minute

// size is the batch to use, of at most def rows, for a statement that begins now.
func (b *shrinking) size(def int) int {
	if b.n == 0 || b.n > def {
		b.n = def
	}
	b.def, b.began = def, time.Now()
	return b.n
}

// shrunk halves the batch and reports true when err is the server's cancellation of a batch of
// more than one row (not the caller's: ctx is live), logging the new size; the caller then
// tries again at once.
func (b *shrinking) shrunk(ctx context.Context, err error, log *slog.Logger, what string, attrs ...any) bool {
	if err == nil || !store.QueryCanceled(err) || ctx.Err() != nil || b.n <= 1 {
		return false
	}
	b.n /= 2
	b.limit = time.Since(b.began)
	b.cut = time.Now()
	log.Warn("gendurable: the server cancelled a maintenance statement (a statement_timeout?); "+
		"smaller batches for now", append([]any{"statement", what, "batch", b.n, "error", err}, attrs...)...)
	return true
}

// ran notes that the statement of the last size call succeeded on rows rows, and doubles a
// shrunk batch that was full, when the time it took allows (see shrinking).
func (b *shrinking) ran(rows int, log *slog.Logger, what string) {
	if b.n >= b.def || rows < b.n {
		return
	}
	switch {
	case time.Since(b.began) < b.limit/4:
	case time.Since(b.cut) >= regrowAfter:
		b.cut = time.Now()
	default:
		return
	}
	b.n = min(2*b.n, b.def)
	log.Debug("gendurable: a maintenance statement's batch grows again", "statement", what, "batch", b.n)
}
