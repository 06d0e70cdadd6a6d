package historycheck

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency/conformance"
)

// Summary is what a run of histories found.
type Summary struct {
	// Histories recorded and checked; Calls in them; Unknown, the calls
	// whose outcome was unknown.
	Histories, Calls, Unknown int
	// Faulted: histories with a network fault armed.
	Faulted int
	// Violations are the histories that broke a rule, described.
	Violations []string
	// Record and Check are the time spent recording (wall clock) and
	// checking (summed over histories).
	Record, Check time.Duration
	// Slowest is the longest check of one history.
	Slowest time.Duration
}

// String is the summary's one-line report.
func (s Summary) String() string {
	return fmt.Sprintf("%d histories (%d calls, %d unknown outcomes, %d with a network fault): %d violations; recorded in %v, checked in %v (slowest %v)",
		s.Histories, s.Calls, s.Unknown, s.Faulted, len(s.Violations), s.Record.Round(time.Millisecond),
		s.Check.Round(time.Millisecond), s.Slowest.Round(time.Microsecond))
}

// Run records histories from, from+1, ... from+n-1 on the recorders (one
// history at a time on each) and checks each with porcupine, within
// timeout per history. It returns at the first error of a recorder, with
// what it found so far; progress, if not nil, is told each history.
func Run(ctx context.Context, recs []Recorder, from, n uint64, timeout time.Duration, progress func(conformance.History, Result)) (Summary, error) {
	var (
		mu   sync.Mutex
		sum  Summary
		errs []error
		next = from
		wg   sync.WaitGroup
	)
	start := time.Now()
	for _, rec := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= from+n || len(errs) > 0 || ctx.Err() != nil {
					mu.Unlock()
					return
				}
				num := next
				next++
				mu.Unlock()
				h, err := rec.Record(ctx, num)
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("history %d: %w", num, err))
					mu.Unlock()
					return
				}
				res := Check(h, timeout)
				mu.Lock()
				sum.Histories++
				sum.Calls += len(h.Calls)
				for _, c := range h.Calls {
					if c.Outcome == conformance.OutcomeUnknown {
						sum.Unknown++
					}
				}
				if h.Fault != "" {
					sum.Faulted++
				}
				sum.Check += res.Took
				sum.Slowest = max(sum.Slowest, res.Took)
				if !res.OK {
					v := fmt.Sprintf("history %d on %s: timed out %v, keys %v\n", h.Number, h.Store, res.TimedOut, res.Keys)
					for _, k := range res.Keys {
						v += Describe(h, k)
					}
					sum.Violations = append(sum.Violations, v)
				}
				if progress != nil {
					progress(h, res)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sum.Record = time.Since(start)
	if len(errs) > 0 {
		return sum, errs[0]
	}
	return sum, ctx.Err()
}
