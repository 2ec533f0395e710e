// Package logrecord is a slog handler that keeps every record, for tests that assert what was
// logged.
package logrecord

import (
	"context"
	"log/slog"
	"sync"
)

// Recorder keeps every record logged through it, whatever its level. It is safe for
// concurrent use; WithAttrs and WithGroup return the recorder itself (attributes given to a
// derived logger are not kept).
type Recorder struct {
	mu  sync.Mutex
	got []slog.Record
}

// Enabled implements slog.Handler: every level is recorded.
func (h *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (h *Recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, r.Clone())
	return nil
}

// WithAttrs implements slog.Handler.
func (h *Recorder) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup implements slog.Handler.
func (h *Recorder) WithGroup(string) slog.Handler { return h }

// Records returns the records so far, oldest first.
func (h *Recorder) Records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.got...)
}

// With returns the records whose message is msg, oldest first.
func (h *Recorder) With(msg string) []slog.Record {
	var out []slog.Record
	for _, r := range h.Records() {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// Attr returns the value of r's attribute key (the zero Value if it has none).
func Attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}
