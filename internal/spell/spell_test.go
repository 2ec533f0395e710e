package spell

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/logrecord"
	"github.com/stretchr/testify/require"
)

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
	h := &logrecord.Recorder{}
	log := slog.New(h)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Log{Every: 10 * time.Second, Now: func() time.Time { return now }}

	// No spell: success logs nothing.
	s.Succeeded(log, "ok again", "queue", "q")
	require.Empty(t, h.Records())

	// A spell of 25 failures, one a second: the first, then one line per 10s.
	for i := range 25 {
		s.Failed(log, "pick failed", "queue", "q", "try", i)
		now = now.Add(time.Second)
	}
	require.Len(t, h.Records(), 3)
	for _, r := range h.Records() {
		require.Equal(t, slog.LevelWarn, r.Level)
		require.Equal(t, "pick failed", r.Message)
		require.Equal(t, "q", attrs(r)["queue"])
	}
	first, second, third := attrs(h.Records()[0]), attrs(h.Records()[1]), attrs(h.Records()[2])
	require.NotContains(t, first, "unlogged")
	require.EqualValues(t, 0, first["try"])
	require.EqualValues(t, 10, second["try"], "the reminder carries the failure that made it")
	require.EqualValues(t, 9, second["unlogged"])
	require.Equal(t, 10*time.Second, second["failing_for"])
	require.EqualValues(t, 20, third["try"])
	require.EqualValues(t, 9, third["unlogged"])

	// Its end: one Info line with every failure of the spell.
	s.Succeeded(log, "ok again", "queue", "q")
	require.Len(t, h.Records(), 4)
	end := h.Records()[3]
	require.Equal(t, slog.LevelInfo, end.Level)
	require.Equal(t, "ok again", end.Message)
	require.EqualValues(t, 25, attrs(end)["failures"])
	require.Equal(t, 25*time.Second, attrs(end)["failed_for"])
	s.Succeeded(log, "ok again")
	require.Len(t, h.Records(), 4, "a second success ends nothing")

	// The next failure begins a new spell, logged at once.
	s.Failed(log, "pick failed")
	require.Len(t, h.Records(), 5)
	require.NotContains(t, attrs(h.Records()[4]), "unlogged")

	// A loop that went quiet without a success (nothing to do): a failure more than Every after
	// the last begins a new spell, logged as its first.
	now = now.Add(11 * time.Second)
	s.Failed(log, "pick failed")
	require.Len(t, h.Records(), 6)
	require.NotContains(t, attrs(h.Records()[5]), "unlogged")
	now = now.Add(time.Second)
	s.Failed(log, "pick failed")
	require.Len(t, h.Records(), 6, "the new spell's second failure is counted")
	s.Succeeded(log, "ok again")
	require.EqualValues(t, 2, attrs(h.Records()[6])["failures"], "the new spell's failures only")
}

// Racing goroutines: the end's count is every failure, no line claims more than happened, and
// reminders fall among the races. (Which failures go unlogged after the last reminder depends on
// the interleaving; the first test checks the reminders' counts exactly.)
func TestASpellCountsEveryFailureUnderRaces(t *testing.T) {
	h := &logrecord.Recorder{}
	log := slog.New(h)
	// A clock that moves a microsecond at every reading. A goroutine reads it once before it
	// takes the lock, so two failures in a row are at most eight readings apart: never a gap of
	// Every, which would begin a new spell.
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
	s.Succeeded(log, "again")
	const all = goroutines * each
	warned, unlogged := 0, int64(0)
	for _, r := range h.Records()[:len(h.Records())-1] {
		require.Equal(t, "failed", r.Message)
		warned++
		if n, ok := attrs(r)["unlogged"]; ok {
			unlogged += n.(int64)
		}
	}
	require.Greater(t, warned, 2, "reminders among the races")
	end := h.Records()[len(h.Records())-1]
	require.Equal(t, "again", end.Message)
	require.EqualValues(t, all, attrs(end)["failures"], "one spell, every failure counted")
	require.LessOrEqual(t, int64(warned)+unlogged, int64(all))
	require.Greater(t, int64(warned)+unlogged, int64(all-50), "only the failures after the last reminder are in no line")
}
