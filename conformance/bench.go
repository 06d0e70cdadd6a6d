package conformance

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/benchkit"
)

// Benchmark measures a backend against its own bare effect, in the same run
// and on the same pool. Sub-benchmarks:
//
//   - Bare: [Fixture].Bare, one effect in a plain transaction (the baseline).
//   - NewKey: Do with a new key each time: reservation, effect, completion.
//   - Replay: Do with a completed key: the stored response, no effect.
//   - RunLocal1: [idempotency.Guard.Run] with a new key each time, of an
//     Operation of one Local step (the effect) then Finish (the response
//     of NewKey): what an operation costs next to Do. Skipped unless the
//     store implements [backend.Stepper].
//   - RunLocal2: RunLocal1 with a second Local step that only sets step
//     data: what one more Local step costs.
//   - SameKey20: 20 callers released together on one new key; one op is the
//     time until all 20 have their answer (compare with Bare).
//   - SameKey20Bare: the same 20 goroutines without the library: the first
//     runs the bare effect, the 19 others wait for it on a channel and copy
//     its response. What answering 20 callers costs on the machine at the
//     least, next to SameKey20.
//   - SameKey20Lead: SameKey20Bare with Do on a new key as the first
//     caller's effect. Against SameKey20 it shows what the library's 19
//     followers cost beyond channel waiters; against SameKey20Bare, what
//     the library's leader costs among 19 other goroutines. A diagnostic
//     with no target: idembench runs it with -parallel (which runs every
//     case), or by name.
//   - BareParallel8, Mixed8: 8 goroutines; Mixed8 does half new keys and half
//     replays, BareParallel8 the bare effect (its baseline). NewKey8 and
//     Replay8 are Mixed8's halves on their own (only new keys, only
//     replays), against the same baseline.
//
// Each case of Do and Run then checks with [Fixture].Count that every key
// has exactly one effect. SameKey20 checks that exactly one of its callers ran fn. A
// store that duplicates an effect fails the benchmark instead of being
// measured.
//
// Command idembench (`go run ./cmd/idembench`) runs it in interleaved
// rounds, with a hand-written contender where a package has one. It prints
// the ratios to the baseline (median and range over the rounds) with the
// targets.
func Benchmark[Tx any](b *testing.B, h Harness[Tx]) {
	// A pool larger than the 20 callers of SameKey20, so that it measures
	// how fast waiters get their answer, not how they queue for connections.
	f := h.NewFixture(b, Options{MaxConns: 2 * Callers})
	if f.Bare == nil {
		b.Skip("conformance: Fixture.Bare is nil")
	}
	ctx := context.Background()
	g, err := idempotency.New(f.Store, nil)
	if err != nil {
		b.Fatal(err)
	}
	prefix := benchkit.Prefix()
	var seq atomic.Int64
	next := func() idempotency.Key {
		return idempotency.Key{Scope: "bench", ID: prefix + strconv.FormatInt(seq.Add(1), 36)}
	}
	fn := benchFn(ctx, f, "bench")
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
	// checkEffects fails b unless every key so far has exactly one effect:
	// a duplicate fails the benchmark instead of being measured.
	checkEffects := func(b *testing.B) {
		b.StopTimer()
		if f.Count == nil {
			return
		}
		got, err := f.Count(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if want := seq.Load(); int64(got) != want {
			b.Fatalf("%d effects committed for %d keys (a duplicate or a lost effect)", got, want)
		}
	}
	b.Run("NewKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			do(b, next())
		}
		checkEffects(b)
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
		checkEffects(b)
	})
	runLocal := func(b *testing.B, steps int) {
		if _, ok := f.Store.(backend.Stepper[Tx]); !ok {
			b.Skip("conformance: the store does not implement backend.Stepper")
		}
		op := benchOp(f, "bench", steps)
		b.ReportAllocs()
		for b.Loop() {
			r, err := g.Run(ctx, next(), "fp", nil, op)
			if err != nil || r.Replayed {
				b.Fatalf("run: %+v, %v", r, err)
			}
		}
		checkEffects(b)
	}
	b.Run("RunLocal1", func(b *testing.B) { runLocal(b, 1) })
	b.Run("RunLocal2", func(b *testing.B) { runLocal(b, 2) })
	b.Run("SameKey20", func(b *testing.B) {
		call := func(key idempotency.Key) func() (bool, error) {
			return func() (bool, error) {
				r, err := g.Do(ctx, key, "fp", fn)
				return r.Replayed, err
			}
		}
		sameKey(b, call(next())) // untimed: opens the pool's connections
		b.ReportAllocs()
		for b.Loop() {
			sameKey(b, call(next()))
		}
		checkEffects(b)
	})
	b.Run("SameKey20Bare", func(b *testing.B) {
		resp := created("bare", 1)
		b.ReportAllocs()
		for b.Loop() {
			sameKey(b, channelWaiters(func() (idempotency.Response, error) {
				return resp, f.Bare(ctx, "bare")
			}))
		}
	})
	b.Run("SameKey20Lead", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			key := next()
			sameKey(b, channelWaiters(func() (idempotency.Response, error) {
				return g.Do(ctx, key, "fp", fn)
			}))
		}
		checkEffects(b)
	})
	parallel8 := func(b *testing.B, op func(i int64) error) {
		b.ReportAllocs()
		b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
		var n atomic.Int64
		b.ResetTimer() // Mixed8's hot keys are set up before
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
	// hotKeys are 64 keys completed before the timer runs: the replays of
	// Mixed8 and Replay8.
	hotKeys := func(b *testing.B) []idempotency.Key {
		hot := make([]idempotency.Key, 64)
		for i := range hot {
			hot[i] = next()
			do(b, hot[i])
		}
		return hot
	}
	b.Run("Mixed8", func(b *testing.B) {
		hot := hotKeys(b)
		parallel8(b, func(i int64) error {
			key := hot[i%int64(len(hot))]
			if i%2 == 0 {
				key = next()
			}
			_, err := g.Do(ctx, key, "fp", fn)
			return err
		})
		checkEffects(b)
	})
	// Mixed8's two halves on their own, to tell where its time goes.
	b.Run("NewKey8", func(b *testing.B) {
		parallel8(b, func(int64) error {
			_, err := g.Do(ctx, next(), "fp", fn)
			return err
		})
		checkEffects(b)
	})
	b.Run("Replay8", func(b *testing.B) {
		hot := hotKeys(b)
		parallel8(b, func(i int64) error {
			r, err := g.Do(ctx, hot[i%int64(len(hot))], "fp", fn)
			if err == nil && !r.Replayed {
				err = errors.New("conformance: Replay8: not a replay")
			}
			return err
		})
		checkEffects(b)
	})
}

// channelWaiters returns the call of one op of SameKey20Bare and
// SameKey20Lead: the first caller runs lead, the others wait for it on a
// channel and copy its response, as a hand-written single flight would.
func channelWaiters(lead func() (idempotency.Response, error)) func() (bool, error) {
	var first atomic.Bool
	done := make(chan struct{})
	var answer idempotency.Response
	var leadErr error
	return func() (bool, error) {
		if first.CompareAndSwap(false, true) {
			answer, leadErr = lead()
			close(done)
			return false, leadErr
		}
		<-done
		if leadErr != nil {
			return true, nil // reported once, by the first caller
		}
		r := answer
		r.Header, r.Body = r.Header.Clone(), bytes.Clone(r.Body)
		if len(r.Body) == 0 {
			return true, errors.New("conformance: SameKey20: empty answer")
		}
		return true, nil
	}
}

// sameKey releases [Callers] goroutines together on call and fails b unless
// all of them succeed and exactly one is not a replay (ran the effect).
func sameKey(b *testing.B, call func() (replayed bool, err error)) {
	if err := benchkit.SameKey(Callers, call); err != nil {
		b.Fatal(err)
	}
}

// benchFn returns the fn every benchmark runs: one effect tagged tag, then
// a 201 response built once, so that the benchmark measures Do and the
// store rather than building responses.
func benchFn[Tx any](ctx context.Context, f Fixture[Tx], tag string) func(Tx) (idempotency.Response, error) {
	resp := created(tag, 1)
	return func(tx Tx) (idempotency.Response, error) {
		if err := f.Effect(ctx, tx, tag); err != nil {
			return idempotency.Response{}, err
		}
		return resp, nil
	}
}

// benchOp returns the Operation of RunLocal1 (steps 1) and RunLocal2
// (steps 2): a Local step with the effect of benchFn, then, for steps 2, a
// Local step that only sets step data, and a Finish that returns benchFn's
// response.
func benchOp[Tx any](f Fixture[Tx], tag string, steps int) *idempotency.Operation[Tx] {
	resp := created(tag, 1)
	op := &idempotency.Operation[Tx]{
		Name: "bench",
		Steps: []idempotency.Step[Tx]{{Name: "effect", Local: func(ctx context.Context, tx Tx, _ *idempotency.State) error {
			return f.Effect(ctx, tx, tag)
		}}},
		Finish: func(context.Context, Tx, *idempotency.State) (idempotency.Response, error) {
			return resp, nil
		},
	}
	if steps > 1 {
		op.Steps = append(op.Steps, idempotency.Step[Tx]{Name: "data", Local: func(_ context.Context, _ Tx, s *idempotency.State) error {
			s.Set("order", "o-1")
			return nil
		}})
	}
	return op
}

// ScaleKeys is how many existing keys [BenchmarkScale] works against.
const ScaleKeys = 1_000_000

// BenchmarkScale measures a backend with a large table ([ScaleKeys] rows,
// written by [Fixture].Fill). Sub-benchmarks:
//
//   - NewKeyFull: Do with a new key, alternately on a store with [ScaleKeys]
//     live keys and on an empty one (another fixture), op by op, so that
//     both sides meet the same machine; ns/op is the full store's. It
//     reports the ratio of the full store's time to the empty one's
//     (full-ratio: the median over chunks of 100 pairs of ops, with
//     full-ratio-min and full-ratio-max) and the empty store's time
//     (empty-ns/op).
//   - PurgeUnderLoad: ScaleKeys expired keys; 8 goroutines call Do with new
//     keys while Guard.Purge deletes them all in batches. It reports the
//     p99 latency of Do before (p99-idle-ns) and during (p99-purge-ns) the
//     purge, their ratio (p99-ratio), the purge's duration (purge-s) and
//     how many keys it deleted (purged).
//
// It takes minutes on a server store; run it on its own:
//
//	go test -run '^$' -bench BenchmarkScale -benchtime 2000x ./postgres
func BenchmarkScale[Tx any](b *testing.B, h Harness[Tx]) {
	ctx := context.Background()
	guard := func(b *testing.B, f Fixture[Tx], cfg *idempotency.Config) *idempotency.Guard[Tx] {
		g, err := idempotency.New(f.Store, cfg)
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	fixture := func(b *testing.B) Fixture[Tx] {
		f := h.NewFixture(b, Options{})
		if f.Fill == nil {
			b.Skip("conformance: Fixture.Fill is nil")
		}
		return f
	}

	b.Run("NewKeyFull", func(b *testing.B) {
		empty, full := fixture(b), fixture(b)
		if err := full.Fill(ctx, ScaleKeys, time.Now().Add(time.Hour)); err != nil {
			b.Fatal(err)
		}
		ge, gf := guard(b, empty, nil), guard(b, full, nil)
		fe, ff := benchFn(ctx, empty, "scale"), benchFn(ctx, full, "scale")
		prefix := benchkit.Prefix()
		do := func(g *idempotency.Guard[Tx], fn func(Tx) (idempotency.Response, error), id string) time.Duration {
			start := time.Now()
			if _, err := g.Do(ctx, idempotency.Key{Scope: "scale", ID: id}, "fp", fn); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		const chunk = 100
		var ratios []float64
		var onFull, onEmpty, chunkFull, chunkEmpty time.Duration
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			i++
			id := prefix + strconv.Itoa(i)
			// Alternate which side goes first, so that neither always
			// follows the other.
			if i%2 == 0 {
				chunkEmpty += do(ge, fe, id)
				chunkFull += do(gf, ff, id)
			} else {
				chunkFull += do(gf, ff, id)
				chunkEmpty += do(ge, fe, id)
			}
			if i%chunk == 0 {
				ratios = append(ratios, float64(chunkFull)/float64(chunkEmpty))
				onFull, onEmpty = onFull+chunkFull, onEmpty+chunkEmpty
				chunkFull, chunkEmpty = 0, 0
			}
		}
		b.StopTimer()
		if len(ratios) == 0 {
			b.Fatalf("NewKeyFull needs at least %d ops (-benchtime %dx) for one chunk", chunk, chunk)
		}
		slices.Sort(ratios)
		b.ReportMetric(ratios[len(ratios)/2], "full-ratio")
		b.ReportMetric(ratios[0], "full-ratio-min")
		b.ReportMetric(ratios[len(ratios)-1], "full-ratio-max")
		n := float64(chunk * len(ratios))
		b.ReportMetric(float64(onEmpty.Nanoseconds())/n, "empty-ns/op")
		b.ReportMetric(float64(onFull.Nanoseconds())/n, "full-ns/op")
	})
	b.Run("PurgeUnderLoad", func(b *testing.B) {
		if h.Features.SelfExpiring {
			b.Skip("Features.SelfExpiring: the store deletes expired keys by itself; Purge deletes nothing")
		}
		f := fixture(b)
		if err := f.Fill(ctx, ScaleKeys, time.Now().Add(-time.Hour)); err != nil {
			b.Fatal(err)
		}
		g := guard(b, f, nil)
		prefix := benchkit.Prefix()
		var seq atomic.Int64
		load := func(stop <-chan struct{}, lat *benchkit.Latencies) {
			fn := benchFn(ctx, f, "scale")
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						key := idempotency.Key{Scope: "scale", ID: prefix + strconv.FormatInt(seq.Add(1), 36)}
						if _, err := g.Do(ctx, key, "fp", fn); err != nil {
							b.Error(err)
							return
						}
						lat.Add(time.Since(start))
					}
				})
			}
			wg.Wait()
		}
		measured := false
		for b.Loop() {
			if measured {
				continue // one purge of ScaleKeys keys is the measurement
			}
			measured = true
			// Idle: the load alone, for a fixed 3 s window.
			var idle, busy benchkit.Latencies
			stop := make(chan struct{})
			go func() { time.Sleep(3 * time.Second); close(stop) }()
			load(stop, &idle)

			stop = make(chan struct{})
			done := make(chan struct{})
			go func() { defer close(done); load(stop, &busy) }()
			start := time.Now()
			n, err := g.Purge(ctx)
			purge := time.Since(start)
			close(stop)
			<-done
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(idle.Percentile(99).Nanoseconds()), "p99-idle-ns")
			b.ReportMetric(float64(busy.Percentile(99).Nanoseconds()), "p99-purge-ns")
			b.ReportMetric(float64(busy.Percentile(99))/float64(idle.Percentile(99)), "p99-ratio")
			b.ReportMetric(purge.Seconds(), "purge-s")
			b.ReportMetric(float64(n), "purged")
			if n < ScaleKeys {
				b.Fatalf("purge deleted %d keys, want at least %d", n, ScaleKeys)
			}
		}
	})
}
