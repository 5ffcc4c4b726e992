package outboxui

import (
	"fmt"

	"github.com/outboxgo/outbox"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 600, 90
	chartTop       = 12 // room for the maximum's label
)

// chart is an inline SVG bar chart of one count per minute, laid out here so that the
// template only writes attributes.
type chart struct {
	Class   string
	W, H    int
	Bars    []bar
	Max     int64
	Total   int64
	First   string
	Last    string
	Inexact string
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

// newChart lays out a's minutes with value as the bars' heights.
func newChart(a outbox.Activity, value func(outbox.MinuteActivity) int64, class string) chart {
	c := chart{Class: class, W: chartW, H: chartH}
	for _, m := range a.Minutes {
		c.Max = max(c.Max, value(m))
		c.Total += value(m)
	}
	n := len(a.Minutes)
	if n == 0 {
		return c
	}
	step := float64(chartW) / float64(n)
	for i, m := range a.Minutes {
		v := value(m)
		h := 0.0
		if c.Max > 0 {
			h = float64(chartH-chartTop) * float64(v) / float64(c.Max)
		}
		if v > 0 && h < 1 {
			h = 1
		}
		c.Bars = append(c.Bars, bar{
			X: float64(i)*step + 0.5, Y: float64(chartH) - h, W: max(step-1, 1), H: h,
			Title: fmt.Sprintf("%s: %d %s", m.Start.Format("15:04 UTC"), v, class),
		})
	}
	c.First = a.Minutes[0].Start.Format("15:04")
	c.Last = a.Minutes[n-1].Start.Format("15:04 UTC")
	if !a.ExactSince.IsZero() {
		c.Inexact = "counts before " + a.ExactSince.Format("15:04 UTC") + " are incomplete (more rows than one read takes)"
	}
	return c
}
