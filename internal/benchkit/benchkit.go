// Package benchkit holds what the benchmarks of this module share:
//
//   - a percentile recorder ([Latencies]);
//   - a prefix that keeps one run's keys apart ([Prefix]);
//   - the check that callers released together on one key ran the effect
//     once ([SameKey]).
//
// It imports only the standard library, not "testing", so that package
// conformance can use it; the benchmark of a hand-written contender, which
// needs "testing", lives in internal/testkit.
package benchkit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Latencies records durations and reports percentiles. Benchmarks use it
// to report tail latency with testing.B.ReportMetric.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records one duration. It is safe for concurrent use.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// Percentile returns the p-th percentile (0 < p <= 100), or 0 if none was
// recorded.
func (l *Latencies) Percentile(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Prefix returns a random key prefix ("b" and 8 hex digits, then "-"), so
// that the keys of two runs on one store never meet.
func Prefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "b" + hex.EncodeToString(b) + "-"
}

// SameKey releases n goroutines together on call. It returns an error
// unless all of them succeed and exactly one is not a replay (ran the
// effect).
func SameKey(n int, call func() (replayed bool, err error)) error {
	var wg sync.WaitGroup
	var fresh atomic.Int64
	gate := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			<-gate
			replayed, err := call()
			if err != nil {
				errs <- err
				return
			}
			if !replayed {
				fresh.Add(1)
			}
		})
	}
	close(gate)
	wg.Wait()
	close(errs)
	if err, ok := <-errs; ok {
		return err
	}
	if f := fresh.Load(); f != 1 {
		return fmt.Errorf("%d of %d callers on one key ran the effect, want 1", f, n)
	}
	return nil
}
