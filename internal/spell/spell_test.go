package spell

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lines is a slog handler that keeps every record.
type lines struct {
	mu  sync.Mutex
	got []slog.Record
}

func (h *lines) Enabled(context.Context, slog.Level) bool { return true }
func (h *lines) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, r)
	return nil
}
func (h *lines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *lines) WithGroup(string) slog.Handler      { return h }

// attrs returns a record's attributes by key.
func attrs(r slog.Record) map[string]any {
	m := map[string]any{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Any()
		return true
	})
	return m
}

func TestASpellLogsItsFirstFailureRemindersAndItsEnd(t *testing.T) {
	h := &lines{}
	log := slog.New(h)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Log{Every: 10 * time.Second, Now: func() time.Time { return now }}

	// No spell: success logs nothing.
	s.Succeeded(log, "ok again", "queue", "q")
	require.Empty(t, h.got)

	// A spell of 25 failures, one a second: the first, then one line per 10s.
	for i := range 25 {
		s.Failed(log, "pick failed", "queue", "q", "try", i)
		now = now.Add(time.Second)
	}
	require.Len(t, h.got, 3)
	for _, r := range h.got {
		require.Equal(t, slog.LevelWarn, r.Level)
		require.Equal(t, "pick failed", r.Message)
		require.Equal(t, "q", attrs(r)["queue"])
	}
	first, second, third := attrs(h.got[0]), attrs(h.got[1]), attrs(h.got[2])
	require.NotContains(t, first, "unlogged")
	require.EqualValues(t, 0, first["try"])
	require.EqualValues(t, 10, second["try"], "the reminder carries the failure that made it")
	require.EqualValues(t, 9, second["unlogged"])
	require.Equal(t, 10*time.Second, second["failing_for"])
	require.EqualValues(t, 20, third["try"])
	require.EqualValues(t, 9, third["unlogged"])

	// Its end: one Info line with every failure of the spell.
	s.Succeeded(log, "ok again", "queue", "q")
	require.Len(t, h.got, 4)
	end := h.got[3]
	require.Equal(t, slog.LevelInfo, end.Level)
	require.Equal(t, "ok again", end.Message)
	require.EqualValues(t, 25, attrs(end)["failures"])
	require.Equal(t, 25*time.Second, attrs(end)["failed_for"])
	s.Succeeded(log, "ok again")
	require.Len(t, h.got, 4, "a second success ends nothing")

	// The next failure begins a new spell, logged at once.
	s.Failed(log, "pick failed")
	require.Len(t, h.got, 5)
	require.NotContains(t, attrs(h.got[4]), "unlogged")
}

// Racing goroutines: every failure is either logged or counted in a later line's "unlogged",
// and the end's count is all of them.
func TestASpellCountsEveryFailureUnderRaces(t *testing.T) {
	h := &lines{}
	log := slog.New(h)
	// A clock that moves a microsecond at every reading, so reminders fall among the races.
	var ticks atomic.Int64
	t0 := time.Now()
	s := &Log{Every: 50 * time.Microsecond, Now: func() time.Time { return t0.Add(time.Duration(ticks.Add(1)) * time.Microsecond) }}
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				s.Failed(log, "failed")
			}
		})
	}
	wg.Wait()
	// One more failure a while later: its reminder carries the failures since the last line.
	ticks.Add(int64(time.Second / time.Microsecond))
	s.Failed(log, "failed")
	s.Succeeded(log, "again")
	h.mu.Lock()
	defer h.mu.Unlock()
	const all = goroutines*each + 1
	warned, unlogged := 0, int64(0)
	for _, r := range h.got[:len(h.got)-1] {
		require.Equal(t, "failed", r.Message)
		warned++
		if n, ok := attrs(r)["unlogged"]; ok {
			unlogged += n.(int64)
		}
	}
	require.Greater(t, warned, 2, "reminders among the races")
	end := h.got[len(h.got)-1]
	require.Equal(t, "again", end.Message)
	require.EqualValues(t, all, attrs(end)["failures"])
	require.EqualValues(t, all, int64(warned)+unlogged, "every failure logged or counted in a line's unlogged")
}
