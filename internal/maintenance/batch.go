package maintenance

import (
	"context"
	"log/slog"

	"github.com/gendurable/gendurable/internal/store"
)

// shrinking is the batch of a maintenance statement that the server may cancel (query_canceled:
// a statement_timeout on the role, which a full batch can outlast): each cancellation halves it,
// and the smaller size stays, since a timeout the engine cannot change would otherwise fail
// every sweep while the work piles up. The zero value starts at the configured size.
type shrinking struct{ n int }

// size is the batch to use, of at most def rows.
func (b *shrinking) size(def int) int {
	if b.n == 0 || b.n > def {
		b.n = def
	}
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
	log.Warn("gendurable: the server cancelled a maintenance statement (a statement_timeout?); "+
		"smaller batches from now on", append([]any{"statement", what, "batch", b.n, "error", err}, attrs...)...)
	return true
}
