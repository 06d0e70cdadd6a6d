package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// plainTop is the top-level benchmark of the reference contender (the
// plain SQL, BenchmarkPlainSQL): its cases are compared with the library's
// cases of the same name, and with BenchmarkStore's bare transaction.
const plainTop = "PlainSQL"

// targets are the ratios to the bare effect transaction (median of
// the rounds), per package and case of BenchmarkStore (or of any other
// library benchmark, such as BenchmarkLookupAlways).
// Mixed8 is compared with BareParallel8 (8 goroutines each).
var targets = map[string]map[string]float64{
	"postgres": {"NewKey": 1.45, "Replay": 0.25, "RunLocal1": runLocal1Target, "Mixed8": 0.8},
	"mysql":    {"NewKey": 2.0, "Replay": 0.30, "RunLocal1": runLocal1Target, "Mixed8": 1.0},
	"sqlite":   {"NewKey": 1.3, "Replay": 0.10, "RunLocal1": runLocal1Target, "Mixed8": 0.8},
	// Redis runs no operations (no backend.Stepper): RunLocal1 is skipped.
	// A replay is one round trip, as the bare pipeline is.
	"redis": {"NewKey": 2.0, "Replay": 1.0, "SameKey20": 2.5, "Mixed8": 1.5},
}

// floorTargets are targets relative to the floor of the same round rather
// than to the bare transaction: 20 callers of one key (SameKey20) within
// 1.3x of the same 20 goroutines answered from one bare effect without
// the library (SameKey20Bare), on every store.
var floorTargets = map[string]float64{"SameKey20": 1.3}

// floorOf is the case whose time a floor target divides by.
const floorOf = "SameKey20Bare"

// runLocal1Target is the target of RunLocal1 on every SQL store: an
// operation of one Local step then Finish, one transaction like Do's.
const runLocal1Target = 1.6

// plainTargets are the cases in which the library must be faster than the
// plain SQL: new keys and replays.
var plainTargets = map[string]bool{"NewKey": true, "Replay": true}

// scaleTargets are the scale targets of BenchmarkScale. A new key with 1M
// keys in the table stays within 1.1x of an empty table (NewKeyFull). The
// p99 of Do during a purge of 1M keys stays within 2x of its p99 without it.
var scaleTargets = map[string]float64{"NewKeyFull": 1.1, "PurgeUnderLoad": 2}

// baseline returns the benchmark that name is compared with in the same
// round, or metric, the name of a ratio the benchmark reports itself;
// both empty for a baseline (or an unknown case).
func baseline(name string) (base, metric string) {
	top, sub, _ := strings.Cut(name, "/")
	if top == "Scale" {
		switch sub {
		case "NewKeyFull":
			return "", "full-ratio"
		case "PurgeUnderLoad":
			return "", "p99-ratio"
		}
		return "", ""
	}
	if top == plainTop {
		top = "Store"
	}
	switch sub {
	case "Bare", "BareParallel8", "":
		return "", ""
	case "Mixed8", "NewKey8", "Replay8":
		return top + "/BareParallel8", ""
	}
	return top + "/Bare", ""
}

func target(pkg, name string) float64 {
	top, sub, _ := strings.Cut(name, "/")
	switch top {
	case "Scale":
		return scaleTargets[sub]
	case plainTop:
		return 0
	}
	return targets[pkg][sub]
}

// row is one line of the table.
type row struct {
	pkg, display, code string
	ratios             []float64 // per round, to the baseline
	vsPlain            []float64 // per round, to the plain SQL's same case
	aheadOfPlain       bool      // the target includes: faster than the plain SQL
	vsFloor            []float64 // per round, to the floor (floorTargets)
	floorTarget        float64
	ns, allocs         float64 // medians over the rounds
	target             float64
	isBase             bool
}

// rows turns r into the table's rows: per package, each library case
// followed by the plain SQL's same case.
func rows(r *results) []row {
	var out []row
	done := map[*series]bool{}
	add := func(s *series) {
		done[s] = true
		out = append(out, makeRow(r, s))
	}
	for _, s := range r.series {
		if done[s] {
			continue
		}
		top, sub, _ := strings.Cut(s.name, "/")
		if top == plainTop && r.get(s.pkg, "Store/"+sub) != nil {
			continue // printed after the library's case
		}
		add(s)
		if top == "Store" {
			if plain := r.get(s.pkg, plainTop+"/"+sub); plain != nil && !done[plain] {
				add(plain)
			}
		}
	}
	return out
}

func makeRow(r *results, s *series) row {
	top, sub, _ := strings.Cut(s.name, "/")
	w := row{pkg: s.pkg, display: s.name, code: "library", target: target(s.pkg, s.name)}
	switch top {
	case "Store":
		w.display = sub
	case plainTop:
		w.display, w.code = sub, "plain SQL"
	}
	var ns, allocs []float64
	for _, x := range s.samples {
		ns = append(ns, x.ns)
		allocs = append(allocs, x.allocs)
	}
	w.ns, w.allocs = median(ns), median(allocs)
	base, metric := baseline(s.name)
	switch {
	case metric != "":
		// One op is a share of one long measurement: its time means
		// nothing; the purge's own figures do.
		w.ns, w.allocs = math.NaN(), math.NaN()
		var purged, secs []float64
		for _, x := range s.samples {
			if v, ok := x.metrics[metric]; ok {
				w.ratios = append(w.ratios, v)
			}
			// NewKeyFull's range is over the chunks of its one run.
			lo, okLo := x.metrics[metric+"-min"]
			hi, okHi := x.metrics[metric+"-max"]
			if okLo && okHi {
				w.ratios = append(w.ratios, lo, hi)
			}
			if v, ok := x.metrics["full-ns/op"]; ok {
				w.ns, w.allocs = v, x.allocs/2 // one op of the pair
			}
			if n, ok := x.metrics["purged"]; ok {
				purged, secs = append(purged, n), append(secs, x.metrics["purge-s"])
			}
		}
		if len(purged) > 0 {
			w.display += fmt.Sprintf(" (p99 during/before; %.0f keys purged in %.1f s)", median(purged), median(secs))
		}
	case base != "":
		w.ratios = pairRatios(s, r.get(s.pkg, base))
	case top != "Scale" && (sub == "Bare" || sub == "BareParallel8"):
		w.code, w.isBase = "bare", true
	}
	if sub == "SameKey20Bare" {
		w.code = "no library" // the least 20 answers cost here
	}
	if t := floorTargets[sub]; t > 0 && top != plainTop && top != "Scale" {
		w.floorTarget = t
		w.vsFloor = pairRatios(s, r.get(s.pkg, top+"/"+floorOf))
	}
	if top != plainTop && top != "Scale" {
		w.vsPlain = pairRatios(s, r.get(s.pkg, plainTop+"/"+sub))
		w.aheadOfPlain = len(w.vsPlain) > 0 && plainTargets[sub]
	}
	return w
}

// pairRatios returns s/base of each round that both were measured in.
func pairRatios(s, base *series) []float64 {
	if base == nil {
		return nil
	}
	var out []float64
	for _, x := range s.samples {
		for _, y := range base.samples {
			if y.round == x.round && y.ns > 0 {
				out = append(out, x.ns/y.ns)
				break
			}
		}
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// met says whether w meets its target and is ahead of the plain SQL: "yes", or
// "no" with by how much it misses; "" when there is nothing to meet.
func (w row) met() string {
	var miss []string
	checked := false
	if w.target > 0 && len(w.ratios) > 0 {
		checked = true
		if m := median(w.ratios); m > w.target {
			miss = append(miss, fmt.Sprintf("+%.0f%%", (m/w.target-1)*100))
		}
	}
	if w.floorTarget > 0 && len(w.vsFloor) > 0 {
		checked = true
		if m := median(w.vsFloor); m > w.floorTarget {
			miss = append(miss, fmt.Sprintf("%.2fx the floor", m))
		}
	}
	if w.aheadOfPlain {
		checked = true
		if median(w.vsPlain) >= 1 {
			miss = append(miss, "behind contender")
		}
	}
	switch {
	case !checked:
		return ""
	case len(miss) == 0:
		return "yes"
	}
	return "no (" + strings.Join(miss, ", ") + ")"
}

// columns of the table.
var columns = []string{"backend", "case", "code", "ratio", "range", "vs plain SQL", "time/op", "allocs/op", "target", "met"}

func (w row) cells() []string {
	ratio, rng, vs, tgt := "", "", "", ""
	switch {
	case w.isBase:
		ratio = "1.00x"
	case len(w.ratios) > 0:
		ratio = fmt.Sprintf("%.2fx", median(w.ratios))
		rng = fmt.Sprintf("%.2f-%.2fx", slices.Min(w.ratios), slices.Max(w.ratios))
	}
	if len(w.vsPlain) > 0 {
		vs = fmt.Sprintf("%.2fx", median(w.vsPlain))
	}
	if w.target > 0 {
		tgt = fmt.Sprintf("<= %.2fx", w.target)
	}
	if w.floorTarget > 0 {
		if tgt != "" {
			tgt += ", "
		}
		tgt += fmt.Sprintf("<= %.2fx floor", w.floorTarget)
	}
	if w.aheadOfPlain {
		if tgt != "" {
			tgt += ", "
		}
		tgt += "< contender"
	}
	allocs := ""
	if !math.IsNaN(w.allocs) && w.allocs > 0 {
		allocs = fmt.Sprintf("%.0f", w.allocs)
	}
	return []string{w.pkg, w.display, w.code, ratio, rng, vs, dur(w.ns), allocs, tgt, w.met()}
}

// printTable writes rs as a markdown table (markdown) or as aligned text.
func printTable(w io.Writer, rs []row, markdown bool) {
	if markdown {
		fmt.Fprintln(w, "| "+strings.Join(columns, " | ")+" |")
		fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---|---|")
		for _, r := range rs {
			fmt.Fprintln(w, "| "+strings.Join(r.cells(), " | ")+" |")
		}
		return
	}
	var buf strings.Builder
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns, "\t"))
	for _, r := range rs {
		fmt.Fprintln(tw, strings.Join(r.cells(), "\t"))
	}
	_ = tw.Flush()
	for line := range strings.Lines(buf.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}

func dur(ns float64) string {
	switch {
	case math.IsNaN(ns):
		return ""
	case ns >= 1e9:
		return fmt.Sprintf("%.2f s", ns/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}
