package main

import (
	"fmt"
	"strconv"
	"strings"
)

// markdown writes the results as the Markdown tables BENCHMARKS.md quotes.
func (rep *report) markdown(w *strings.Builder) {
	fmt.Fprintf(w, "Command: `%s` (%s mode), %s to %s UTC.\n\n", rep.Command, rep.Config.Mode,
		rep.Started.Format("2006-01-02 15:04"), rep.Finished.Format("15:04"))
	m := rep.Machine
	fmt.Fprintf(w, "Machine: %d cores (%s), %s RAM, %s, %s. Load average (1, 5, 15 min) %s before, %s after.\n\n",
		m.Cores, m.CPU, m.Memory, m.Kernel, m.Go, m.LoadBefore, m.LoadAfter)
	fmt.Fprintf(w, "Rows: %s.\n\nLibrary source: %s.\n\n", m.Payload, m.Source)

	fmt.Fprintf(w, "### Targets\n\n| metric |")
	for _, b := range rep.Backends {
		fmt.Fprintf(w, " %s |", b.Backend)
	}
	fmt.Fprintf(w, " target |\n|---|")
	for range rep.Backends {
		fmt.Fprintf(w, "---:|")
	}
	fmt.Fprintf(w, "---|\n")
	for _, t := range targets {
		fmt.Fprintf(w, "| `%s` |", t.metric)
		for _, b := range rep.Backends {
			cell := "–"
			if b.Skipped != "" {
				cell = "skipped"
			}
			for _, x := range b.metrics(rep.Config) {
				if x.Metric == t.metric {
					cell = strconv.FormatFloat(x.Value, 'f', -1, 64)
					if t.pass != nil && !t.pass(x.Value) {
						cell = "**" + cell + " miss**"
					}
				}
			}
			fmt.Fprintf(w, " %s |", cell)
		}
		fmt.Fprintf(w, " %s |\n", t.text)
	}

	for _, b := range rep.Backends {
		fmt.Fprintf(w, "\n### %s", b.Backend)
		if b.Skipped != "" {
			fmt.Fprintf(w, ": skipped (%s)\n", b.Skipped)
			continue
		}
		fmt.Fprintf(w, ": %s\n\nDurability: %s. Connection: %s. Measured in %s.\n", b.Server.Version, b.Server.Durability, b.Server.Connection, b.Elapsed)
		if b.Error != "" {
			fmt.Fprintf(w, "\n**Error:** %s\n", b.Error)
		}
		if len(b.Enqueue) > 0 {
			fmt.Fprintf(w, "\nEnqueue, transactions/s (median of %d alternating rounds of %s):\n\n", rep.Config.EnqueueRounds, rep.Config.EnqueueDur)
			fmt.Fprintf(w, "| concurrency | business only | + raw INSERT | + library Enqueue | library ÷ raw | library ÷ business | raw ÷ business |\n|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, e := range b.Enqueue {
				fmt.Fprintf(w, "| %d | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f |\n", e.Concurrency, e.Business.Median, e.Raw.Median, e.Library.Median, e.LibVsRaw, e.LibVsBusiness, e.RawVsBusiness)
			}
		}
		if len(b.Batch) > 0 {
			fmt.Fprintf(w, "\nBatch enqueue, rows/s, one transaction per batch (median of %d rounds of %s):\n\n", rep.Config.BatchRounds, rep.Config.BatchDur)
			fmt.Fprintf(w, "| batch | library | best raw | raw forms | library ÷ best raw |\n|---:|---:|---:|---|---:|\n")
			for _, x := range b.Batch {
				var forms []string
				for _, f := range sortedKeys(x.Raw) {
					forms = append(forms, fmt.Sprintf("%s %.0f", f, x.Raw[f].Median))
				}
				fmt.Fprintf(w, "| %d | %.0f | %.0f | %s | %.3f |\n", x.Batch, x.Library.Median, x.BestRaw.Median, strings.Join(forms, ", "), x.Ratio)
			}
		}
		if len(b.Sweep) > 0 {
			fmt.Fprintf(w, "\nBurn-down, rows/s, %d workers (headline batch %d: median of %d pairs; other sizes: %d pairs):\n\n",
				rep.Config.Workers, rep.Config.Batch, rep.Config.BurnRounds, rep.Config.SweepRounds)
			fmt.Fprintf(w, "| batch | rows | library | raw | library ÷ raw |\n|---:|---:|---:|---:|---:|\n")
			for _, p := range b.Sweep {
				fmt.Fprintf(w, "| %d | %d | %.0f | %.0f | %.3f |\n", p.Batch, p.N, p.Library.Median, p.Raw.Median, p.Ratio)
			}
			if h := b.Burndown; h != nil {
				var lib, raw []float64
				for _, r := range h.Runs {
					switch r.Kind {
					case "library":
						lib = append(lib, r.Rate)
					case kindRaw:
						raw = append(raw, r.Rate)
					}
				}
				fmt.Fprintf(w, "\nHeadline pairs, library ÷ raw in run order (their median is the ratio above): %s.\n", pairRatios(lib, raw))
			}
		}
		if len(b.Breakdown) > 0 {
			fmt.Fprintf(w, "\nBurn-down breakdown: each library step swapped for its raw counterpart, rows/s (÷ raw loop), %d workers, %d alternating rounds:\n\n| loop |", rep.Config.Workers, rep.Config.BreakdownRounds)
			for _, br := range b.Breakdown {
				fmt.Fprintf(w, " batch %d (%d rows) |", br.Batch, br.N)
			}
			fmt.Fprintf(w, "\n|---|")
			for range b.Breakdown {
				fmt.Fprintf(w, "---:|")
			}
			fmt.Fprintln(w)
			for _, k := range breakdownKinds {
				fmt.Fprintf(w, "| %s |", breakdownLabel[k])
				for _, br := range b.Breakdown {
					fmt.Fprintf(w, " %.0f (%.2f) |", br.Rates[k].Median, br.VsRaw[k])
				}
				fmt.Fprintln(w)
			}
		}
		if h := b.Burndown; h != nil {
			fmt.Fprintf(w, "\nCommits during the headline burn-down: library %.2f per batch (%.4f per message), raw loop %.2f per batch. %s. %s.\n",
				h.CommitsPerBatch, h.CommitsPerMessage, h.RawCommitsPerBatch, h.RawCommitsCheck, h.LibraryCommitsDetail)
		}
		if v := b.Validation; v != nil {
			fmt.Fprintf(w, "\nCommit counter: %s. Validation with %s (expected %s): %s.\n", v.Count.Method, v.Workload, v.Expected, v.Count.Check)
		}
		if len(b.Latency) > 0 {
			fmt.Fprintf(w, "\nCommit-to-publish latency over %s (first fifth discarded as warm-up), the median of %d rounds in rotated order: fixed rates with default options, and saturated (producer at half the library burn-down rate):\n\n", rep.Config.LatencyDur, max(1, rep.Config.LatencyRounds))
			fmt.Fprintf(w, "| kind | publisher | target msg/s | achieved msg/s | producer tx/s | messages | p50 ms | p90 ms | p99 ms | max ms | p99 per round |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
			for _, l := range b.Latency {
				per := make([]string, len(l.RoundsP99))
				for i, v := range l.RoundsP99 {
					per[i] = fmt.Sprintf("%.1f", v)
				}
				fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %.0f | %d | %.1f | %.1f | %.1f | %.1f | %s |\n", l.Kind, l.Config, l.TargetRate, l.AchievedRate, l.TxPerSecond, l.Messages, l.P50, l.P90, l.P99, l.Max, strings.Join(per, ", "))
			}
		}
		if len(b.Idle) > 0 {
			fmt.Fprintf(w, "\nOne event after the publisher sat idle, default options:\n\n| idle | producer | latency ms |\n|---|---|---:|\n")
			for _, i := range b.Idle {
				where := "on the publisher's Store (one process)"
				if !i.Shared {
					where = "on a Store of its own (another process)"
				}
				fmt.Fprintf(w, "| %s | %s | %.1f |\n", i.Idle, where, i.LatencyMs)
			}
		}
		if g := b.Growth; g != nil {
			fmt.Fprintf(w, "\nGrowth: burn-down of %d rows (batch %d) next to %d retained delivered rows (loaded in %.0fs) against an empty table, %d alternating rounds:\n\n",
				g.N, g.Batch, g.Retained, g.LoadSeconds, rep.Config.GrowthRounds)
			fmt.Fprintf(w, "| | empty rows/s | retained rows/s | retained ÷ empty |\n|---|---:|---:|---:|\n")
			fmt.Fprintf(w, "| library | %.0f | %.0f | %.3f |\n| raw | %.0f | %.0f | %.3f |\n", g.LibEmpty.Median, g.LibRetained.Median, g.Ratio, g.RawEmpty.Median, g.RawRetained.Median, g.RawRatio)
		}
		rep.markdownCosts(w, b)
	}
}

var breakdownLabel = map[string]string{
	kindRaw:          "raw claim + raw ack (baseline)",
	kindGuarded:      "raw claim + raw ack guarded by lease token (a possible library fast path)",
	kindLibClaimOnly: "library Store.Claim + raw ack",
	kindLibAckOnly:   "raw claim + library Store.Ack",
	kindStore:        "library Store.Claim + Store.Ack, no Publisher",
	"library":        "library Publisher",
}

// markdownCosts writes the short drains, the drain-cost fit and the table cost of one
// backend.
func (rep *report) markdownCosts(w *strings.Builder, b *backendResult) {
	cfg := rep.Config
	if br := b.Broker; br != nil {
		fmt.Fprintf(w, "\nBroker latency: the burn-down with a publish that takes %s per batch on both sides (the raw loop waits between its claim and its ack), %d alternating pairs after one warm-up pair: %s; pairs %s.\n",
			br.Publish, cfg.BrokerRounds, br.describe(), pairRatios(br.Library.All, br.Raw.All))
	}
	if len(b.ShortDrain) > 0 {
		fmt.Fprintf(w, "\nShort drains: %d freshly loaded rows of 200-byte payloads, Publisher with default options against the raw loop, %d alternating pairs per configuration after one warm-up pair:\n\n",
			b.ShortDrain[0].N, cfg.ShortRounds)
		fmt.Fprintf(w, "| batch | loops | library rows/s | raw rows/s | library ÷ raw | pairs | commits per batch, library / raw |\n|---:|---:|---:|---:|---:|---|---|\n")
		for _, s := range b.ShortDrain {
			fmt.Fprintf(w, "| %d | %d | %.0f | %.0f | %.3f | %s | %.2f / %.2f |\n", s.Batch, s.Workers, s.Library.Median, s.Raw.Median, s.Ratio,
				pairRatios(s.Library.All, s.Raw.All), s.LibraryCommitsPerBatch, s.RawCommitsPerBatch)
		}
	}
	if c := b.Costs; c != nil {
		fmt.Fprintf(w, "\nDrain costs, one claim loop: drains of %s rows at batch %s, library and raw back to back, %d round(s), fitted to time = fixed + per batch × batches + per row × rows (least squares on relative error, medians of each size); the last row fits the pairs' differences:\n\n",
			joinInts(cfg.CostNs), joinInts(cfg.CostBatches), cfg.CostRounds)
		fmt.Fprintf(w, "| loop | fixed ms | µs per batch | µs per row | worst point off |\n|---|---:|---:|---:|---:|\n")
		for _, k := range []struct {
			name string
			f    costFit
		}{{"library Publisher", c.Library}, {"raw loop", c.Raw}} {
			fmt.Fprintf(w, "| %s | %.1f | %.0f | %.2f | %.0f %% |\n", k.name, k.f.FixedMs, k.f.PerBatchUs, k.f.PerRowUs, 100*k.f.MaxResidual)
		}
		fmt.Fprintf(w, "| library − raw, pairs | %.1f | %.0f | %.2f | %.0f %% |\n", c.Extra.FixedMs, c.Extra.PerBatchUs, c.Extra.PerRowUs, 100*c.Extra.MaxResidual)
		if n := cfg.ShortN; n > 0 {
			fmt.Fprintf(w, "\nWhat the fit gives for one loop draining %d rows:\n\n| batch | library ms | raw ms | library ÷ raw (rate) | extra: fixed | per batch | per row |\n|---:|---:|---:|---:|---:|---:|---:|\n", n)
			for _, batch := range cfg.ShortBatches {
				r := c.Raw.predict(n, batch)
				l := r + c.Extra.predict(n, batch)
				f, pb, pr := c.costShares(n, batch)
				fmt.Fprintf(w, "| %d | %.0f | %.0f | %.3f | %.0f ms | %.0f ms | %.0f ms |\n", batch, 1e3*l, 1e3*r, r/l, 1e3*f, 1e3*pb, 1e3*pr)
			}
		}
	}
	if t := b.TableCost; t != nil {
		fmt.Fprintf(w, "\nTable cost, rows of 200-byte payloads, %d alternating rounds: the raw loop draining %d rows (batch %d, %d loops), "+
			"transactions of a business row plus one raw outbox insert (%d producers, %s windows), and %d-row raw inserts (one producer). "+
			"Each figure ÷ the library's table, paired by round; the cost is the share of the library table's time that what a variant drops accounts for (1 − 1/ratio), "+
			"and for the table with the ordered set, the share of its own time that the order index accounts for (1 − ratio):\n\n",
			t.Rounds, t.N, t.Batch, t.Workers, t.EnqueueConc, t.EnqueueDur, t.InsertBatch)
		fmt.Fprintf(w, "| table | drain rows/s | ÷ ours | cost | enqueue tx/s | ÷ ours | cost | batch insert rows/s | ÷ ours | cost |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, v := range t.Variants {
			fmt.Fprintf(w, "| %s | %.0f | %.3f | %.1f %% | %.0f | %.3f | %.1f %% | %.0f | %.3f | %.1f %% |\n", v.Label,
				v.Drain.Median, v.DrainVsOurs, 100*v.cost(v.DrainVsOurs),
				v.Enqueue.Median, v.EnqueueVsOurs, 100*v.cost(v.EnqueueVsOurs),
				v.Batch.Median, v.BatchVsOurs, 100*v.cost(v.BatchVsOurs))
		}
		var ours *tableWork
		for _, v := range t.Variants {
			if v.Name == "ours" {
				ours = v.Work
			}
		}
		if ours != nil {
			pg := b.Backend == "postgres"
			unit, how := "WAL pages", fmt.Sprintf("the WAL pages each commit appended (the WAL file's growth, on one connection that never checkpoints) and the time of each statement, client included, of %d claims of %d rows out of %d pending, the ack of each, and %d inserts of %d rows, each its own transaction",
				workRepeats, t.Batch, t.N, workRepeats, t.Batch)
			if pg {
				unit, how = "WAL records", fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, WAL) of %d claims of %d rows out of %d pending, the ack of each, and %d inserts of %d rows "+
					"(the statements only, not their commits; WAL bytes include full-page images, which depend on when the last checkpoint ran)",
					workRepeats, t.Batch, t.N, workRepeats, t.Batch)
			}
			fmt.Fprintf(w, "\nWork per row, from %s:\n\n", how)
			if pg {
				fmt.Fprintf(w, "| table | insert: %s | WAL bytes | buffers | µs | claim + ack: %s | WAL bytes | full-page images (all) | buffers | dirtied | µs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", unit, unit)
			} else {
				fmt.Fprintf(w, "| table | insert: %s | WAL bytes | µs | claim + ack: %s | WAL bytes | µs |\n|---|---:|---:|---:|---:|---:|---:|\n", unit, unit)
			}
			for _, v := range t.Variants {
				x := v.Work
				if x == nil {
					continue
				}
				in := x.Insert
				per := func(f func(stmtWork) float64) float64 { return x.drainPerRow(f) }
				rec, byt := per(func(s stmtWork) float64 { return s.WALRecords }), per(func(s stmtWork) float64 { return s.WALBytes })
				us := per(func(s stmtWork) float64 { return 1e3 * s.ExecMs })
				if pg {
					fmt.Fprintf(w, "| %s | %.2f | %.0f | %.2f | %.1f | %.2f | %.0f | %.0f | %.2f | %.2f | %.1f |\n", v.Label,
						in.perRow(in.WALRecords), in.perRow(in.WALBytes), in.perRow(in.Buffers), in.perRow(1e3*in.ExecMs),
						rec, byt, x.Claim.WALFPI+x.Ack.WALFPI, per(func(s stmtWork) float64 { return s.Buffers }), per(func(s stmtWork) float64 { return s.Dirtied }), us)
				} else {
					fmt.Fprintf(w, "| %s | %.2f | %.0f | %.1f | %.2f | %.0f | %.1f |\n", v.Label,
						in.perRow(in.WALRecords), in.perRow(in.WALBytes), in.perRow(1e3*in.ExecMs), rec, byt, us)
				}
			}
		}
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}
