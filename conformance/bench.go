package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Benchmark measures a backend against its own bare effect, in the same run
// and on the same pool. Sub-benchmarks:
//
//   - Bare: Fixture.Bare, one effect in a plain transaction (the baseline).
//   - NewKey: Do with a new key each time: reservation, effect, completion.
//   - Replay: Do with a completed key: the stored response, no effect.
//   - SameKey20: 20 callers released together on one new key; one op is the
//     time until all 20 have their answer (compare with Bare).
//   - BareParallel8, Mixed8: 8 goroutines; Mixed8 does half new keys and half
//     replays, BareParallel8 the bare effect (its baseline).
//
// Run `go run ./cmd/benchtable` to get the ratios to the baseline as a table.
func Benchmark[Tx any](b *testing.B, h Harness[Tx]) {
	f := h.NewFixture(b, Options{})
	if f.Bare == nil {
		b.Skip("conformance: Fixture.Bare is nil")
	}
	ctx := context.Background()
	g, err := idempotency.New(f.Store, nil)
	if err != nil {
		b.Fatal(err)
	}
	prefix := benchPrefix()
	var seq atomic.Int64
	next := func() idempotency.Key {
		return idempotency.Key{Scope: "bench", ID: prefix + strconv.FormatInt(seq.Add(1), 36)}
	}
	resp := created("bench", 1)
	fn := func(tx Tx) (idempotency.Response, error) {
		if err := f.Effect(ctx, tx, "bench"); err != nil {
			return idempotency.Response{}, err
		}
		return resp, nil
	}
	do := func(b *testing.B, key idempotency.Key) {
		if _, err := g.Do(ctx, key, "fp", fn); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("Bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := f.Bare(ctx, "bare"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NewKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			do(b, next())
		}
	})
	b.Run("Replay", func(b *testing.B) {
		key := next()
		do(b, key)
		b.ReportAllocs()
		for b.Loop() {
			r, err := g.Do(ctx, key, "fp", fn)
			if err != nil || !r.Replayed {
				b.Fatalf("replay: %+v, %v", r, err)
			}
		}
	})
	b.Run("SameKey20", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			key := next()
			var wg sync.WaitGroup
			gate := make(chan struct{})
			errs := make(chan error, Callers)
			for range Callers {
				wg.Go(func() {
					<-gate
					if _, err := g.Do(ctx, key, "fp", fn); err != nil {
						errs <- err
					}
				})
			}
			close(gate)
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		}
	})
	parallel8 := func(b *testing.B, op func(i int64) error) {
		b.ReportAllocs()
		b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(n.Add(1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("BareParallel8", func(b *testing.B) {
		parallel8(b, func(int64) error { return f.Bare(ctx, "bare") })
	})
	b.Run("Mixed8", func(b *testing.B) {
		hot := make([]idempotency.Key, 64)
		for i := range hot {
			hot[i] = next()
			do(b, hot[i])
		}
		parallel8(b, func(i int64) error {
			key := hot[i%int64(len(hot))]
			if i%2 == 0 {
				key = next()
			}
			_, err := g.Do(ctx, key, "fp", fn)
			return err
		})
	})
}

// Latencies records durations and reports percentiles; benchmarks use it to
// report tail latency with testing.B.ReportMetric.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records one duration; safe for concurrent use.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// Percentile returns the p-th percentile (0 < p <= 100), 0 if empty.
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

func benchPrefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "b" + hex.EncodeToString(b) + "-"
}
