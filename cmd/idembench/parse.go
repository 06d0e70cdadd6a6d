package main

import (
	"bufio"
	"bytes"
	"regexp"
	"strconv"
	"strings"
)

// sample is one result line of `go test -bench`.
type sample struct {
	round   int     // the round it was measured in (0-based)
	ns      float64 // ns/op
	allocs  float64 // allocs/op (0 without -benchmem)
	metrics map[string]float64
}

// series is every sample of one benchmark of one package, in order.
type series struct {
	pkg     string // the package's last element: "postgres"
	name    string // the benchmark's name without "Benchmark" and "-N": "Store/NewKey"
	samples []sample
}

// results is what parse read: the series in order of first appearance, and
// the machine lines of the output.
type results struct {
	series []*series
	byKey  map[string]*series // pkg + " " + name
	goos   string
	goarch string
	cpu    string
	procs  string // the -N suffix of the benchmark names: GOMAXPROCS
}

func newResults() *results { return &results{byKey: map[string]*series{}} }

// get returns the series of pkg's benchmark name, or nil.
func (r *results) get(pkg, name string) *series { return r.byKey[pkg+" "+name] }

var (
	headerLine = regexp.MustCompile(`^(pkg|goos|goarch|cpu): (.+)$`)
	benchLine  = regexp.MustCompile(`^Benchmark(\S+?)(?:-(\d+))?\s+(\d+)\s+(.+)$`)
)

// parse adds the benchmark lines of out (the output of `go test -bench`, or
// of a test binary run with -test.bench) to r. With round >= 0 every sample
// is of that round; with round < 0 (output of an unknown run, such as
// `go test -count 5`) the n-th sample of a benchmark is of round n.
func (r *results) parse(out []byte, round int) {
	pkg := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if m := headerLine.FindStringSubmatch(line); m != nil {
			switch m[1] {
			case "pkg":
				pkg = m[2][strings.LastIndex(m[2], "/")+1:]
			case "goos":
				r.goos = m[2]
			case "goarch":
				r.goarch = m[2]
			case "cpu":
				r.cpu = m[2]
			}
			continue
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s, ok := parseValues(m[4])
		if !ok {
			continue
		}
		if m[2] != "" {
			r.procs = m[2]
		}
		ser := r.get(pkg, m[1])
		if ser == nil {
			ser = &series{pkg: pkg, name: m[1]}
			r.series = append(r.series, ser)
			r.byKey[pkg+" "+m[1]] = ser
		}
		s.round = round
		if round < 0 {
			s.round = len(ser.samples)
		}
		ser.samples = append(ser.samples, s)
	}
}

// parseValues reads the "value unit" pairs after a benchmark's iteration
// count: "440000 ns/op  9000 B/op  135 allocs/op  1.5 p99-ratio".
func parseValues(text string) (sample, bool) {
	f := strings.Fields(text)
	s := sample{metrics: map[string]float64{}}
	seenNs := false
	for i := 0; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return sample{}, false
		}
		switch unit := f[i+1]; unit {
		case "ns/op":
			s.ns, seenNs = v, true
		case "allocs/op":
			s.allocs = v
		default:
			s.metrics[unit] = v
		}
	}
	return s, seenNs
}
