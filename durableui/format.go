package durableui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
)

// funcs are the templates' helpers. Each returns plain text: html/template escapes it where it
// lands.
var funcs = template.FuncMap{
	"json":    prettyJSON,
	"time":    formatTime,
	"timep":   func(t *time.Time) string { return formatTimePtr(t) },
	"ago":     ago,
	"agop":    func(t *time.Time, now time.Time) string { return agoPtr(t, now) },
	"dur":     formatDuration,
	"exact":   exactDuration,
	"count":   formatCount,
	"rate":    formatRate,
	"trim":    trim,
	"status":  func(s gendurable.Status) string { return string(s) },
	"id":      func(p *int64) int64 { return *p },
	"cond":    func(a, b gendurable.Status) bool { return a == b },
	"statusN": func(m map[gendurable.Status]int64, s gendurable.Status) int64 { return m[s] },
	"kind":    kindText,
	"int64":   func(n int) int64 { return int64(n) },
	"plural": func(n int64, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	},
}

// prettyJSON indents a stored JSON document; what is not JSON is shown as it is.
func prettyJSON(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}

const timeLayout = "2006-01-02 15:04:05Z07:00"

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeLayout)
}

func formatTimePtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return formatTime(*t)
}

// ago says how far t is from now, in the largest unit that fits: "3m ago", "in 2h".
func ago(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + formatDuration(-d)
	}
	return formatDuration(d) + " ago"
}

func agoPtr(t *time.Time, now time.Time) string {
	if t == nil {
		return ""
	}
	return ago(*t, now)
}

// formatDuration rounds d to what a person reads at a glance: "850ms", "42s", "7m", "3h 5m", "2d 4h".
func formatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd %dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// exactDuration writes d without rounding, in the units that are not zero: "5m", "1h 30m",
// "2d", "1m 30s", "1500ms".
func exactDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	var parts []string
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if n := d / u.d; n > 0 {
			parts = append(parts, strconv.FormatInt(int64(n), 10)+u.name)
			d %= u.d
		}
	}
	if d > 0 {
		parts = append(parts, d.String())
	}
	return strings.Join(parts, " ")
}

// formatCount groups thousands: 1234567 is "1,234,567".
func formatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func formatRate(f float64) string {
	switch {
	case f == 0:
		return "0"
	case f < 10:
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return formatCount(int64(f + 0.5))
}

// trim shortens s to n characters with an ellipsis.
func trim(n int, s string) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// kindText explains a kind of stuck instances.
func kindText(k gendurable.StuckKind) string {
	switch k {
	case gendurable.StuckUnknownRateLimit:
		return "Runnable, but their rate limit is not configured on the client serving this dashboard: no pick of such a client admits them. If your workers configure it, they are not stuck."
	case gendurable.StuckUnknownMachine:
		return "Runnable, but their machine is not registered on the client serving this dashboard: its workers hand them back for a node that knows the machine."
	case gendurable.StuckUnknownStep:
		return "Runnable, at a step this client's version of the machine does not have (a deploy that removed or renamed it?)."
	case gendurable.StuckBlocked:
		return "No running node can run them (the node registry of every started client says what each runs): they wait, untouched, for a deploy that can. The reason column says why."
	case gendurable.StuckAwaitOverdue:
		return "Parked past their await deadline: the reaper wakes these within its interval; if they stay, no node runs the reaper."
	}
	return string(k)
}

// describe turns an error of the client into a sentence: the package prefixes go, the first
// letter is upper case.
func describe(err error) string {
	s := strings.ReplaceAll(err.Error(), "gendurable: ", "")
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	s = string(unicode.ToUpper(r)) + s[n:]
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}
