package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func mustParse(t *testing.T, expr string, every time.Duration, tz string) *Spec {
	t.Helper()
	s, err := Parse(expr, every, tz)
	require.NoError(t, err)
	return s
}

// fires lists the fire times after from up to to, in the zone's wall clock.
func fires(s *Spec, from, to time.Time, loc *time.Location) []string {
	var out []string
	for t := s.Next(from); !t.IsZero() && !t.After(to); t = s.Next(t) {
		out = append(out, t.In(loc).Format("01-02 15:04:05 MST"))
	}
	return out
}

func TestParseRejectsBadInput(t *testing.T) {
	for _, c := range []struct {
		expr  string
		every time.Duration
		tz    string
		want  string
	}{
		{"", 0, "", "neither"},
		{"* * * * *", time.Minute, "", "set one"},
		{"", 500 * time.Millisecond, "", "at least 1s"},
		{"", time.Minute, "Europe/Berlin", "same in every zone"},
		{"61 * * * *", 0, "", `cron expression "61 * * * *"`},
		{"* * * *", 0, "", `cron expression "* * * *"`},
		{"@every 5m", 0, "", "interval field"},
		{"CRON_TZ=UTC * * * * *", 0, "", "own field"},
		{"0 0 30 2 *", 0, "", "never fires"},
		{"* * * * *", 0, "Mars/Olympus", `time zone "Mars/Olympus"`},
		{"* * * * *", 0, "Local", `time zone "Local"`},
	} {
		_, err := Parse(c.expr, c.every, c.tz)
		require.ErrorContains(t, err, c.want, "%q %v %q", c.expr, c.every, c.tz)
	}
}

func TestNextFiveAndSixFields(t *testing.T) {
	at := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC) // a Monday
	require.Equal(t, []string{"05-04 10:05:00 UTC", "05-04 10:10:00 UTC"},
		fires(mustParse(t, "*/5 * * * *", 0, ""), at, at.Add(10*time.Minute), time.UTC))
	require.Equal(t, []string{"05-04 10:00:15 UTC", "05-04 10:00:45 UTC"},
		fires(mustParse(t, "15,45 * * * * *", 0, ""), at, at.Add(time.Minute), time.UTC))
	berlin, _ := time.LoadLocation("Europe/Berlin")
	// 02:00 Berlin on weekdays: Friday then Monday.
	require.Equal(t, []string{"05-08 02:00:00 CEST", "05-11 02:00:00 CEST"},
		fires(mustParse(t, "0 0 2 * * MON-FRI", 0, "Europe/Berlin"), time.Date(2026, 5, 7, 3, 0, 0, 0, berlin),
			time.Date(2026, 5, 11, 3, 0, 0, 0, berlin), berlin))
	require.Equal(t, []string{"05-05 00:00:00 UTC"}, fires(mustParse(t, "@daily", 0, ""), at, at.Add(24*time.Hour), time.UTC))
}

func TestIntervalsAreAlignedToTheEpoch(t *testing.T) {
	s := mustParse(t, "", 5*time.Minute, "")
	at := time.Date(2026, 5, 4, 10, 2, 3, 0, time.UTC)
	require.Equal(t, time.Date(2026, 5, 4, 10, 5, 0, 0, time.UTC), s.Next(at))
	require.Equal(t, time.Date(2026, 5, 4, 10, 10, 0, 0, time.UTC), s.Next(s.Next(at)))
	require.Equal(t, 5*time.Minute, s.Interval())
}

// The daylight-saving rules, in a zone with both transitions (Europe/Berlin, 2026: clocks jump
// from 02:00 to 03:00 on 29 March and fall back from 03:00 to 02:00 on 25 October).
func TestDaylightSavingTransitions(t *testing.T) {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	day := func(m time.Month, d, h int) time.Time { return time.Date(2026, m, d, h, 0, 0, 0, berlin) }

	// A daily 02:30 fires once on each transition day: shifted by the gap in spring (the wall
	// clock never reads 02:30), at the first 02:30 in autumn (it reads 02:30 twice).
	daily := mustParse(t, "30 2 * * *", 0, "Europe/Berlin")
	require.Equal(t, []string{"03-28 02:30:00 CET", "03-29 03:30:00 CEST", "03-30 02:30:00 CEST"},
		fires(daily, day(3, 27, 12), day(3, 30, 12), berlin))
	require.Equal(t, []string{"10-24 02:30:00 CEST", "10-25 02:30:00 CEST", "10-26 02:30:00 CET"},
		fires(daily, day(10, 23, 12), day(10, 26, 12), berlin))
	// Asked from inside the repeated hour, after the first 02:30: the second is not a new fire.
	require.Equal(t, day(10, 26, 2).Add(30*time.Minute).UTC(), daily.Next(time.Date(2026, 10, 25, 2, 10, 0, 0, berlin).Add(time.Hour)))

	// Named hours around the spring gap: 02:00 and 03:00 both land on 03:00, which fires once.
	hours := mustParse(t, "0 1-4 * * *", 0, "Europe/Berlin")
	require.Equal(t, []string{"03-29 01:00:00 CET", "03-29 03:00:00 CEST", "03-29 04:00:00 CEST"},
		fires(hours, day(3, 29, 0), day(3, 29, 5), berlin))
	require.Equal(t, []string{"10-25 01:00:00 CEST", "10-25 02:00:00 CEST", "10-25 03:00:00 CET", "10-25 04:00:00 CET"},
		fires(hours, day(10, 25, 0), day(10, 25, 5).Add(time.Hour), berlin))

	// Every 30 minutes keeps its pace in real time through both transitions.
	half := mustParse(t, "*/30 * * * *", 0, "Europe/Berlin")
	spring := fires(half, day(3, 29, 1), day(3, 29, 4), berlin)
	require.Equal(t, []string{"03-29 01:30:00 CET", "03-29 03:00:00 CEST", "03-29 03:30:00 CEST", "03-29 04:00:00 CEST"}, spring)
	autumn := fires(half, day(10, 25, 1), day(10, 25, 3).Add(time.Hour), berlin)
	require.Equal(t, []string{"10-25 01:30:00 CEST", "10-25 02:00:00 CEST", "10-25 02:30:00 CEST",
		"10-25 02:00:00 CET", "10-25 02:30:00 CET", "10-25 03:00:00 CET", "10-25 03:30:00 CET", "10-25 04:00:00 CET"}, autumn)

	// The same rules in another zone (America/New_York: 8 March and 1 November 2026).
	ny, _ := time.LoadLocation("America/New_York")
	nyDaily := mustParse(t, "30 2 * * *", 0, "America/New_York")
	require.Equal(t, []string{"03-08 03:30:00 EDT"}, fires(nyDaily, time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 8, 12, 0, 0, 0, ny), ny))
	require.Equal(t, []string{"11-01 01:30:00 EDT"},
		fires(mustParse(t, "30 1 * * *", 0, "America/New_York"), time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 11, 1, 12, 0, 0, 0, ny), ny))
}

func TestDueCatchesUpWithinTheWindow(t *testing.T) {
	s := mustParse(t, "", time.Second, "")
	next := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	now := next.Add(2*time.Minute + 300*time.Millisecond) // two minutes down

	// Default window (0): the latest missed time only, the rest skipped.
	c := s.Due(next, now, 0, 100)
	require.Equal(t, []time.Time{next.Add(2 * time.Minute)}, c.Fire)
	require.Equal(t, 120, c.Skipped)
	require.Equal(t, next, c.FirstSkipped)
	require.Equal(t, next.Add(119*time.Second), c.LastSkipped)
	require.Equal(t, next.Add(121*time.Second), c.Next)

	// A 10s window: the ten times inside it (10:01:50.3 to 10:02:00.3) fire.
	c = s.Due(next, now, 10*time.Second, 100)
	require.Len(t, c.Fire, 10)
	require.Equal(t, next.Add(111*time.Second), c.Fire[0])
	require.Equal(t, 111, c.Skipped)

	// A limit leaves the rest due.
	c = s.Due(next, now, time.Hour, 50)
	require.Len(t, c.Fire, 50)
	require.Zero(t, c.Skipped)
	require.Equal(t, next.Add(50*time.Second), c.Next)

	// On time: one fire, nothing skipped.
	c = s.Due(next, next.Add(5*time.Millisecond), 0, 100)
	require.Equal(t, []time.Time{next}, c.Fire)
	require.Zero(t, c.Skipped)

	// A long outage is skipped in bounded time: the count is a lower bound.
	c = s.Due(next, next.Add(72*time.Hour), 0, 100)
	require.Equal(t, []time.Time{next.Add(72 * time.Hour)}, c.Fire)
	require.True(t, c.Capped)
	require.Equal(t, maxCount, c.Skipped)
	c = s.Due(next, next.Add(72*time.Hour), 3*time.Second, 100)
	require.Len(t, c.Fire, 4)
	require.Equal(t, next.Add(72*time.Hour-3*time.Second), c.Fire[0])

	// A sparse schedule after a long outage: the latest due time fires.
	daily := mustParse(t, "0 0 3 * * *", 0, "")
	c = daily.Due(time.Date(2025, 1, 1, 3, 0, 0, 0, time.UTC), time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC), 0, 100)
	require.Equal(t, []time.Time{time.Date(2026, 5, 4, 3, 0, 0, 0, time.UTC)}, c.Fire)
	require.Equal(t, time.Date(2026, 5, 5, 3, 0, 0, 0, time.UTC), c.Next)
}

func TestJitterIsStableAndBounded(t *testing.T) {
	at := time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)
	require.Zero(t, Jitter("a", at, 0))
	seen := map[time.Duration]bool{}
	for i := range 100 {
		j := Jitter("a", at.Add(time.Duration(i)*time.Second), time.Minute)
		require.GreaterOrEqual(t, j, time.Duration(0))
		require.Less(t, j, time.Minute)
		require.Equal(t, j, Jitter("a", at.Add(time.Duration(i)*time.Second), time.Minute))
		seen[j] = true
	}
	require.Greater(t, len(seen), 90)
}
