package chaos

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/logrecord"
	"github.com/stretchr/testify/require"
)

// A worker cut off from the database (every connection reset, new ones refused) fails each beat
// and each pick, again and again, until the path heals. Its log holds one line per spell of
// each (more only past a minute), and one line when each loop succeeds again, whose count of
// failures is exactly the number of failure events the loop emitted: the events count every
// failure, the log summarises them. (Regression: one Warn line per failure, hundreds a minute.)
func TestAnOutageIsLoggedOncePerSpell(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 16)
	pool, proxy := proxiedPool(t, e.url, 8)
	logs := &logrecord.Recorder{}
	var (
		mu     sync.Mutex
		events = map[gendurable.EventName][]time.Time{}
	)
	release := make(chan struct{})
	m := linear("linear5", 0, func(ctx *gendurable.Ctx) {
		if ctx.Step == "s0" {
			<-release // claims to beat for while the path is cut
		}
	})
	cfg := &gendurable.Config{
		Schema: e.schema, Machines: []gendurable.Machine{m}, Lease: 30 * time.Second, Heartbeat: 100 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, Queues: map[string]gendurable.QueueConfig{"work": {Concurrency: 4}},
		Reaper: &gendurable.ReaperConfig{Disabled: true}, GC: &gendurable.GCConfig{Disabled: true},
		Logger: slog.New(logs),
		Hooks: []func(gendurable.Event){func(ev gendurable.Event) {
			mu.Lock()
			defer mu.Unlock()
			events[ev.Name] = append(events[ev.Name], ev.At)
		}},
	}
	cl, err := gendurable.NewClient(pool, cfg)
	require.NoError(t, err)
	start(t, cl)
	ctx := context.Background()
	inserter := e.client(t, &gendurable.Config{Machines: []gendurable.Machine{m}})
	const n = 2
	for range n {
		_, err := inserter.Insert(ctx, m.With(path{}), nil)
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "steps running", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'executing'`) == n
	})
	countOf := func(name gendurable.EventName, until time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		c := 0
		for _, at := range events[name] {
			if !at.After(until) {
				c++
			}
		}
		return c
	}

	proxy.RefuseNew(true)
	proxy.ResetAll()
	eventually(t, 60*time.Second, "beats and picks failing again and again", func() bool {
		far := time.Now().Add(time.Hour)
		return countOf(gendurable.EventHeartbeatFailed, far) >= 20 && countOf(gendurable.EventSchedulerFailed, far) >= 10
	})
	healed := time.Now()
	proxy.Heal()

	for _, loop := range []struct {
		failed, again string
		event         gendurable.EventName
	}{
		{"gendurable: heartbeat failed", "gendurable: the heartbeat reaches the database again", gendurable.EventHeartbeatFailed},
		{"gendurable: pick failed", "gendurable: picks succeed again", gendurable.EventSchedulerFailed},
	} {
		// The loop's spells up to its first success after the heal (a connection dialled just
		// as the path was cut could let one try through and split the outage in two spells).
		var ends []slog.Record
		eventually(t, 30*time.Second, loop.again, func() bool {
			ends = logs.With(loop.again)
			return len(ends) > 0 && ends[len(ends)-1].Time.After(healed)
		})
		last := ends[len(ends)-1].Time
		failures, allowed := 0, 0
		for _, end := range ends {
			require.Equal(t, slog.LevelInfo, end.Level)
			failedFor := logrecord.Attr(end, "failed_for").Duration()
			require.Positive(t, failedFor)
			failures += int(logrecord.Attr(end, "failures").Int64())
			allowed += 1 + int(failedFor/time.Minute) // the spell's first failure, then one a minute
		}
		// Every failure emitted its event before the line that ended its spell.
		eventually(t, 10*time.Second, "the spells' events delivered", func() bool {
			return countOf(loop.event, last) >= failures
		})
		require.Equal(t, failures, countOf(loop.event, last), "%s: the ends of the spells count their every failure", loop.failed)
		lines := 0
		for _, r := range logs.With(loop.failed) {
			if !r.Time.After(last) {
				require.Equal(t, slog.LevelWarn, r.Level)
				lines++
			}
		}
		t.Logf("%s: %d failures in %d spells, %d lines", loop.failed, failures, len(ends), lines)
		require.GreaterOrEqual(t, failures, 10)
		require.GreaterOrEqual(t, lines, len(ends), "%s: each spell's first failure is logged", loop.failed)
		require.LessOrEqual(t, lines, allowed, "%s: at most one line a minute of a spell", loop.failed)
	}

	// Healed, the work completes.
	close(release)
	eventually(t, 60*time.Second, "all done after the heal", func() bool {
		return e.count(t, `SELECT count(*) FROM {schema}.instances WHERE status = 'done'`) == n
	})
}
