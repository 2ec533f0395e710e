package durableui

import (
	"context"
	"fmt"
	"html"
	"html/template"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// The pictures are inline SVG written here, server-side: no script, nothing fetched.

// history is what the queues page's charts draw: the instances finished per queue and minute
// over the last hour (counted from the database: the whole hour once, then only the minutes
// since the last count), and each queue's lag as sampled at the page's loads.
type history struct {
	mu      sync.Mutex
	fetched time.Time // local clock: when the minutes were last counted
	current time.Time // the database's current minute at that count
	minutes map[string]map[time.Time]gendurable.MinuteCount
	lag     map[string][]lagSample
	sampled time.Time
}

type lagSample struct {
	At  time.Time
	Lag time.Duration
}

// chartMinutes is how far back the charts go.
const chartMinutes = 60

// refresh counts the minutes finished since the last count (the whole hour the first time, or
// after a gap) at most every 10 seconds, and samples the lag at most every 5.
func (hs *history) refresh(ctx context.Context, c *gendurable.Client, lags map[string]time.Duration) error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	now := time.Now()
	if hs.minutes == nil {
		hs.minutes, hs.lag = map[string]map[time.Time]gendurable.MinuteCount{}, map[string][]lagSample{}
	}
	if now.Sub(hs.fetched) >= 10*time.Second {
		n := chartMinutes
		if !hs.fetched.IsZero() {
			// The minutes since the last count's current minute, and that one (complete now).
			n = min(chartMinutes, int(now.Sub(hs.fetched)/time.Minute)+2)
		}
		counts, cur, err := c.FinishedByMinute(ctx, n)
		if err != nil {
			return err
		}
		from := cur.Add(-time.Duration(n) * time.Minute)
		for _, m := range hs.minutes { // the recounted minutes are replaced
			for t := range m {
				if !t.Before(from) || t.Before(cur.Add(-chartMinutes*time.Minute)) {
					delete(m, t)
				}
			}
		}
		for _, mc := range counts {
			if hs.minutes[mc.Queue] == nil {
				hs.minutes[mc.Queue] = map[time.Time]gendurable.MinuteCount{}
			}
			hs.minutes[mc.Queue][mc.Minute] = mc
		}
		hs.fetched, hs.current = now, cur
	}
	if now.Sub(hs.sampled) >= 5*time.Second {
		hs.sampled = now
		for q, l := range lags {
			s := append(hs.lag[q], lagSample{At: now, Lag: l})
			for len(s) > 0 && now.Sub(s[0].At) > chartMinutes*time.Minute {
				s = s[1:]
			}
			hs.lag[q] = s
		}
	}
	return nil
}

// queueCharts are one queue's pictures.
type queueCharts struct {
	Queue      string
	Throughput template.HTML
	Lag        template.HTML
}

// charts draws every queue's charts, in name order.
func (hs *history) charts() ([]queueCharts, time.Time, time.Time) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	queues := map[string]bool{}
	for q := range hs.minutes {
		queues[q] = true
	}
	for q := range hs.lag {
		queues[q] = true
	}
	var out []queueCharts
	for _, q := range slices.Sorted(maps.Keys(queues)) {
		out = append(out, queueCharts{Queue: q, Throughput: throughputSVG(hs.minutes[q], hs.current),
			Lag: lagSVG(hs.lag[q])})
	}
	var since time.Time
	for _, s := range hs.lag {
		if len(s) > 0 && (since.IsZero() || s[0].At.Before(since)) {
			since = s[0].At
		}
	}
	return out, hs.current, since
}

const chartW, chartH, chartPad = 480.0, 110.0, 22.0

// throughputSVG is a bar per minute over the last hour: done (green) with failed (red) and
// cancelled (grey) stacked on it.
func throughputSVG(m map[time.Time]gendurable.MinuteCount, cur time.Time) template.HTML {
	var top int64 = 1
	for _, c := range m {
		top = max(top, c.Done+c.Failed+c.Cancelled)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="finished per minute, last hour">`, chartW, chartH)
	plotH, barW := chartH-2*chartPad, (chartW-2*chartPad)/chartMinutes
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" class="axis"/>`, chartPad, chartH-chartPad, chartW-chartPad, chartH-chartPad)
	var failed, done int64
	for i := range chartMinutes {
		t := cur.Add(time.Duration(i-chartMinutes) * time.Minute)
		c, ok := m[t]
		if !ok {
			continue
		}
		x := chartPad + float64(i)*barW
		y := chartH - chartPad
		for _, part := range []struct {
			n     int64
			class string
		}{{c.Done, "done"}, {c.Failed, "failed"}, {c.Cancelled, "cancelled"}} {
			if part.n == 0 {
				continue
			}
			h := plotH * float64(part.n) / float64(top)
			y -= h
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" class="bar-%s"><title>%s: %d %s</title></rect>`,
				x+0.5, y, math.Max(barW-1, 1), h, part.class, t.Format("15:04"), part.n, part.class)
		}
		done += c.Done
		failed += c.Failed
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="14" class="label">%s/min max · last hour: %s done, %s failed</text>`, chartPad,
		formatCount(top), formatCount(done), formatCount(failed))
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" class="tick">−60 min</text><text x="%.0f" y="%.0f" class="tick end">%s</text>`,
		chartPad, chartH-6, chartW-chartPad, chartH-6, cur.Format("15:04"))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here from numbers and formatted times only
}

// lagSVG is the lag as sampled, a line over the last hour.
func lagSVG(s []lagSample) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="lag, last hour">`, chartW, chartH)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" class="axis"/>`, chartPad, chartH-chartPad, chartW-chartPad, chartH-chartPad)
	top := time.Second
	for _, x := range s {
		top = max(top, x.Lag)
	}
	if len(s) > 0 {
		end := s[len(s)-1].At
		var pts []string
		var px, py float64
		for _, x := range s {
			px = chartPad + (chartW-2*chartPad)*(1-float64(end.Sub(x.At))/float64(chartMinutes*time.Minute))
			py = chartH - chartPad - (chartH-2*chartPad)*float64(x.Lag)/float64(top)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
		}
		fmt.Fprintf(&b, `<polyline points="%s" class="lag"/>`, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" class="lag-now"/>`, px, py) // the latest sample
		fmt.Fprintf(&b, `<text x="%.0f" y="14" class="label">lag now %s · max %s (sampled at each load of this page)</text>`,
			chartPad, html.EscapeString(formatDuration(s[len(s)-1].Lag)), html.EscapeString(formatDuration(top)))
	} else {
		fmt.Fprintf(&b, `<text x="%.0f" y="14" class="label">no lag sampled yet</text>`, chartPad)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // numbers and durations only
}
