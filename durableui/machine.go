package durableui

import (
	"errors"
	"fmt"
	"html"
	"html/template"
	"net/http"
	"net/url"
	"strings"

	"github.com/gendurable/gendurable"
)

type machinesPage struct {
	Machines []string
}

func (h *handler) machines(w http.ResponseWriter, r *http.Request) {
	list, err := h.client.Machines(r.Context())
	if err != nil {
		h.failErr(w, r, "machines", err)
		return
	}
	h.render(w, r, http.StatusOK, "machines", "Machines", "machines", machinesPage{Machines: list})
}

type machinePage struct {
	G   *gendurable.MachineGraph
	SVG template.HTML
	// Live counts the machine's live instances by status, over its steps.
	Live map[gendurable.Status]int64
}

func (h *handler) machine(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	g, err := h.client.MachineGraph(r.Context(), name, 0)
	if err != nil {
		if errors.Is(err, gendurable.ErrUnknownMachine) {
			h.fail(w, r, http.StatusNotFound, fmt.Sprintf("There is no machine %q: no node registers it and no instance names it.", name))
			return
		}
		h.failErr(w, r, "machine graph", err)
		return
	}
	p := machinePage{G: g, SVG: machineSVG(h.prefix, g), Live: map[gendurable.Status]int64{}}
	for _, s := range g.Steps {
		for st, n := range s.Live {
			p.Live[st] += n
		}
	}
	h.render(w, r, http.StatusOK, "machine", "Machine "+name, "machines", p)
}

// Machine graph geometry: a step is a box; the boxes stand in columns by their distance from the
// first step (a walk of the transitions, busiest first), top to bottom in the graph's order.
const (
	boxW, boxH = 180.0, 62.0
	colGap     = 110.0
	rowGap     = 36.0
	graphPad   = 24.0
)

// machineSVG draws g: each step a box with its live instances by status (linked to the list of
// them), each transition an arrow labelled with how many times it was taken.
func machineSVG(prefix string, g *gendurable.MachineGraph) template.HTML {
	col := map[string]int{}
	for i, s := range g.Steps { // a walk from the first steps in g's order: depth = first reached
		if i == 0 || s.Starts > 0 {
			if _, ok := col[s.Name]; !ok {
				col[s.Name] = 0
			}
		}
		for _, e := range g.Edges {
			if c, ok := col[e.From]; ok {
				if _, seen := col[e.To]; !seen {
					col[e.To] = c + 1
				}
			}
		}
	}
	// Steps no walk reaches go in a last column.
	last := 0
	for _, c := range col {
		last = max(last, c)
	}
	for _, s := range g.Steps {
		if _, ok := col[s.Name]; !ok {
			col[s.Name] = last + 1
		}
	}
	rows := map[int]int{}
	type pos struct{ x, y float64 }
	at := map[string]pos{}
	maxRow, maxCol := 0, 0
	for _, s := range g.Steps {
		c := col[s.Name]
		at[s.Name] = pos{graphPad + float64(c)*(boxW+colGap), graphPad + 18 + float64(rows[c])*(boxH+rowGap)}
		maxRow, maxCol = max(maxRow, rows[c]), max(maxCol, c)
		rows[c]++
	}
	w := 2*graphPad + float64(maxCol+1)*boxW + float64(maxCol)*colGap
	h := 2*graphPad + 18 + float64(maxRow+1)*boxH + float64(maxRow)*rowGap + 40
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, `<svg class="graph" viewBox="0 0 %.0f %.0f" width="%.0f" role="img" aria-label="the steps of machine %s">`, w, h, w, esc(g.Machine))
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" markerWidth="10" markerHeight="10" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>`)
	var top int64 = 1
	for _, e := range g.Edges {
		top = max(top, e.Count)
	}
	for _, e := range g.Edges {
		from, to := at[e.From], at[e.To]
		width := 1 + 4*float64(e.Count)/float64(top)
		var d string
		var lx, ly float64
		switch {
		case e.From == e.To: // a loop over the box's top
			x, y := from.x+boxW/2, from.y
			d = fmt.Sprintf("M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f", x-20, y, x-40, y-40, x+40, y-40, x+20, y)
			lx, ly = x, y-34
		case to.x > from.x: // forward
			x1, y1, x2, y2 := from.x+boxW, from.y+boxH/2, to.x, to.y+boxH/2
			d = fmt.Sprintf("M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f", x1, y1, x1+colGap/2, y1, x2-colGap/2, y2, x2, y2)
			lx, ly = (x1+x2)/2, (y1+y2)/2-6
		default: // back or across a column: under the boxes
			x1, y1, x2, y2 := from.x+boxW/2, from.y+boxH, to.x+boxW/2, to.y+boxH
			dip := max(y1, y2) + rowGap*0.8
			d = fmt.Sprintf("M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f", x1, y1, x1, dip, x2, dip, x2, y2)
			lx, ly = (x1+x2)/2, dip-4
		}
		fmt.Fprintf(&b, `<g class="edge" data-from="%s" data-to="%s"><path d="%s" stroke-width="%.1f" marker-end="url(#arrow)"/><text x="%.1f" y="%.1f" class="count">%s</text><title>%s → %s: %d</title></g>`,
			esc(e.From), esc(e.To), d, width, lx, ly, formatCount(e.Count), esc(e.From), esc(e.To), e.Count)
	}
	order := []gendurable.Status{gendurable.StatusAvailable, gendurable.StatusExecuting, gendurable.StatusAwaiting, gendurable.StatusJoining}
	for _, s := range g.Steps {
		p := at[s.Name]
		var total int64
		for _, n := range s.Live {
			total += n
		}
		fmt.Fprintf(&b, `<g class="step" data-step="%s"><rect x="%.1f" y="%.1f" width="%.0f" height="%.0f" rx="8"%s/>`,
			esc(s.Name), p.x, p.y, boxW, boxH, map[bool]string{true: ` class="busy"`, false: ""}[total > 0])
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="name">%s</text>`, p.x+10, p.y+20, esc(trim(21, s.Name)))
		var parts []string
		for _, st := range order {
			if n := s.Live[st]; n > 0 {
				parts = append(parts, fmt.Sprintf(`<a href="%sinstances?machine=%s&amp;status=%s"><tspan class="st-%s">%s %s</tspan></a>`,
					esc(prefix), esc(url.QueryEscape(g.Machine)), st, st, formatCount(n), st))
			}
		}
		if len(parts) == 0 {
			parts = []string{`<tspan class="none">no live instance</tspan>`}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="live">%s</text>`, p.x+10, p.y+42, strings.Join(parts[:min(len(parts), 2)], " "))
		if len(parts) > 2 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="live">%s</text>`, p.x+10, p.y+56, strings.Join(parts[2:], " "))
		}
		if s.Starts > 0 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="start">start · %s</text>`, p.x, p.y-6, formatCount(s.Starts))
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // every name in it is escaped above
}
