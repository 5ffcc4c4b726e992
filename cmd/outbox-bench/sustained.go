package main

import (
	"context"
	"math"
	"time"
)

// sustainedP99 is the commit-to-publish p99 a rate must keep to count as held.
const sustainedP99 = 50.0 // ms

// sustainedResult is the sustained-load scenario: producers at a fixed offered rate while a
// Publisher (or the raw loop, under the same producers) drains, the rate doubled from
// SustainStart by half each step until the p99 commit-to-publish passes 50 ms.
type sustainedResult struct {
	// Library and Raw are the highest offered rates held (messages/s): p99 <= 50 ms, every
	// message published, the achieved rate within 10 % of the offered one, and the second
	// half of the window not much slower than the first. 0 when not even the first held.
	Library float64 `json:"library_rate"`
	Raw     float64 `json:"raw_rate"`
	Ratio   float64 `json:"library_vs_raw"`
	// History is the delivered rows each window's table started with (-sustain-history).
	History int `json:"history_rows"`
	// Steps are every run, in order.
	Steps []latencyResult `json:"steps"`
}

// held reports whether a run at a fixed rate kept up.
func held(r latencyResult) bool {
	return r.P99 <= sustainedP99 && r.Unpublished == 0 && r.Steady && r.AchievedRate >= 0.9*r.TargetRate
}

// runSustained raises the offered rate for the Publisher and the raw loop side by side,
// each until it no longer holds. The producers enqueue on the publisher's Store (a service
// that produces and relays in one process: in-process wake-ups), and both sides poll every
// 10 ms after a claim that came back short.
func runSustained(ctx context.Context, cfg config, b backend, res *backendResult) error {
	c := cfg
	c.LatencyDur = cfg.SustainDur
	c.History = cfg.SustainHistory
	const poll = 10 * time.Millisecond
	s := &sustainedResult{History: cfg.SustainHistory}
	libOn, rawOn := true, true
	for rate := cfg.SustainStart; (libOn || rawOn) && rate <= cfg.SustainMax; rate = math.Round(rate * 1.5) {
		for _, raw := range []bool{false, true} {
			if (raw && !rawOn) || (!raw && !libOn) {
				continue
			}
			// A rate that fails is tried once more before it counts: on a shared machine a
			// burst of other work can push one window's p99 past the limit.
			var (
				r  latencyResult
				ok bool
			)
			for try := 0; try < 2 && !ok; try++ {
				var err error
				if r, err = latency(ctx, c, b, rate, poll, raw, true, false); err != nil {
					return err
				}
				r.Kind = "sustained"
				s.Steps = append(s.Steps, r)
				ok = held(r)
			}
			logf("%s: sustained %s at %.0f msg/s: achieved %.0f, p50 %.1fms p99 %.1fms, %d unpublished, steady %v: held %v",
				b.name(), map[bool]string{false: "library", true: "raw"}[raw], rate, r.AchievedRate, r.P50, r.P99, r.Unpublished, r.Steady, ok)
			switch {
			case ok && raw:
				s.Raw = rate
			case ok:
				s.Library = rate
			case raw:
				rawOn = false
			default:
				libOn = false
			}
		}
	}
	if s.Raw > 0 {
		s.Ratio = s.Library / s.Raw
	}
	logf("%s: sustained: library holds %.0f msg/s, raw %.0f msg/s (p99 <= %.0f ms)", b.name(), s.Library, s.Raw, sustainedP99)
	res.Sustained = s
	return nil
}
