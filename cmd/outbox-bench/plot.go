package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// series is one line of a panel.
type series struct {
	name   string
	color  string
	dashed bool
	xs, ys []float64
}

// plot draws rows per second against batch size, one panel per measured backend: burn-down
// (library and raw) and batch enqueue (library and best raw). The numbers come straight from
// the run.
func (rep *report) plot() string {
	var panels []*backendResult
	for _, b := range rep.Backends {
		if b.Skipped == "" && (len(b.Sweep) > 0 || len(b.Batch) > 0) {
			panels = append(panels, b)
		}
	}
	const (
		pw, ph     = 330.0, 300.0 // panel
		ml, mr     = 62.0, 14.0   // margins inside a panel
		mt, mb     = 34.0, 40.0
		top        = 44.0
		legendH    = 50.0
		fontFamily = "Helvetica, Arial, sans-serif"
	)
	width := math.Max(pw*float64(len(panels)), 660)
	height := top + ph + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="%s" font-size="11">`+"\n",
		width, height, width, height, fontFamily)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14" text-anchor="middle">Throughput against batch size (rows/s, higher is better) — outbox-bench %s mode, %s</text>`+"\n",
		width/2, html.EscapeString(rep.Config.Mode), rep.Started.Format("2006-01-02"))
	fmt.Fprintf(&b, `<text x="%.0f" y="36" font-size="10" text-anchor="middle" fill="#555">burn-down: %d workers draining preloaded rows, no-op transport; batch enqueue: one transaction per batch, 1 producer; %d cores, fsync on every commit</text>`+"\n",
		width/2, rep.Config.Workers, rep.Machine.Cores)

	for i, p := range panels {
		x0 := float64(i) * pw
		var ss []series
		if len(p.Sweep) > 0 {
			lib := series{name: "burn-down, library", color: "#1f6fb4"}
			raw := series{name: "burn-down, raw SQL", color: "#1f6fb4", dashed: true}
			for _, s := range p.Sweep {
				lib.xs, lib.ys = append(lib.xs, float64(s.Batch)), append(lib.ys, s.Library.Median)
				raw.xs, raw.ys = append(raw.xs, float64(s.Batch)), append(raw.ys, s.Raw.Median)
			}
			ss = append(ss, lib, raw)
		}
		if len(p.Batch) > 0 {
			lib := series{name: "batch enqueue, library", color: "#d9641c"}
			raw := series{name: "batch enqueue, best raw SQL", color: "#d9641c", dashed: true}
			for _, s := range p.Batch {
				lib.xs, lib.ys = append(lib.xs, float64(s.Batch)), append(lib.ys, s.Library.Median)
				raw.xs, raw.ys = append(raw.xs, float64(s.Batch)), append(raw.ys, s.BestRaw.Median)
			}
			ss = append(ss, lib, raw)
		}
		var allX, allY []float64
		for _, s := range ss {
			allX, allY = append(allX, s.xs...), append(allY, s.ys...)
		}
		if len(allX) == 0 {
			continue
		}
		xmin, xmax := slices.Min(allX), slices.Max(allX)
		if xmin == xmax {
			xmin, xmax = xmin/2, xmax*2
		}
		ystep := niceStep(slices.Max(allY) / 5)
		ymax := math.Ceil(slices.Max(allY)*1.05/ystep) * ystep
		left, right := x0+ml, x0+pw-mr
		upper, lower := top+mt, top+ph-mb
		px := func(x float64) float64 {
			return left + (math.Log10(x)-math.Log10(xmin))/(math.Log10(xmax)-math.Log10(xmin))*(right-left)
		}
		py := func(y float64) float64 { return lower - y/ymax*(lower-upper) }

		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="13" font-weight="bold" text-anchor="middle">%s</text>`+"\n",
			(left+right)/2, top+18, html.EscapeString(p.Server.Version))
		// grid and y axis
		for y := 0.0; y <= ymax+ystep/2; y += ystep {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", left, py(y), right, py(y))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#333">%s</text>`+"\n", left-5, py(y)+4, humanInt(y))
		}
		// x axis: the measured batch sizes
		xticks := slices.Compact(slices.Sorted(slices.Values(allX)))
		for _, x := range xticks {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f0f0f0"/>`+"\n", px(x), upper, px(x), lower)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#333">%.0f</text>`+"\n", px(x), lower+14, x)
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, lower, right, lower)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", left, upper, left, lower)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#333">batch size (rows, log scale)</text>`+"\n", (left+right)/2, lower+30)
		for _, s := range ss {
			var pts []string
			for k := range s.xs {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[k]), py(s.ys[k])))
			}
			dash := ""
			if s.dashed {
				dash = ` stroke-dasharray="5,3"`
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), s.color, dash)
			for k := range s.xs {
				fill := s.color
				if s.dashed {
					fill = "white"
				}
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s" stroke="%s"><title>%s, batch %.0f: %.0f rows/s</title></circle>`+"\n",
					px(s.xs[k]), py(s.ys[k]), fill, s.color, html.EscapeString(s.name), s.xs[k], s.ys[k])
			}
		}
	}
	// legend
	ly := top + ph + 14
	items := []series{
		{name: "burn-down, library Publisher", color: "#1f6fb4"},
		{name: "burn-down, raw claim + batched ack", color: "#1f6fb4", dashed: true},
		{name: "batch enqueue, library EnqueueBatch", color: "#d9641c"},
		{name: "batch enqueue, best raw multi-row INSERT", color: "#d9641c", dashed: true},
	}
	for k, it := range items {
		x := 20 + float64(k%2)*width/2
		y := ly + float64(k/2)*18
		dash := ""
		if it.dashed {
			dash = ` stroke-dasharray="5,3"`
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", x, y, x+28, y, it.color, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x+34, y+4, html.EscapeString(it.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep rounds a raw axis step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// humanInt prints 12000 as 12k.
func humanInt(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return fmt.Sprintf("%.0f", v)
}
