package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/benchkit"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// BenchmarkWake measures how soon waiters get the holder's response: each
// op reserves a key, lets 19 callers of Do wait on it, then completes it.
// It reports percentiles of the time from Complete's return to each
// waiter's return (wake-*) and from Complete's start (done-*). In Local the
// waiters use the holder's Store (they wait on the holder itself); in
// Remote they use a Store of their own on another client, as another
// process would (they wait on the key's pub/sub channel).
func BenchmarkWake(b *testing.B) {
	b.Run("Local", func(b *testing.B) {
		f := newFixture(b, singleClient(b), 2*conformance.Callers, nil)
		benchWake(b, f, f.store, func(holder *txn, n int) {
			spin(b, "the waiters", func() bool { return holder.hold.waiters.Load() >= int32(n) })
		})
	})
	b.Run("Remote", func(b *testing.B) {
		f := newFixture(b, singleClient(b), 2*conformance.Callers, nil)
		other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(b), PoolSize: 2 * conformance.Callers})
		b.Cleanup(func() { _ = other.Close() })
		s, err := New(other, &Config{Prefix: f.prefix})
		if err != nil {
			b.Fatal(err)
		}
		benchWake(b, f, s, func(holder *txn, n int) {
			ch := holder.k.wake()
			spin(b, "the waiters to subscribe", func() bool {
				m, err := f.client.PubSubNumSub(context.Background(), ch).Result()
				return err == nil && m[ch] >= int64(n)
			})
		})
	})
}

func benchWake(b *testing.B, f *fixture, waitersStore *Store, waiting func(holder *txn, n int)) {
	const waiters = conformance.Callers - 1
	ctx := context.Background()
	g, err := idempotency.New(waitersStore, &idempotency.Config{WaitTimeout: 20 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	var wake, done benchkit.Latencies
	fn := func(*Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errNotWaiter
	}
	b.ReportAllocs()
	for b.Loop() {
		key := idempotency.Key{ID: testkit.Name("wake-")}
		holder, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
		if err != nil || holder == nil {
			b.Fatalf("holder: %v, %v", holder, err)
		}
		returned := make([]time.Time, waiters)
		errs := make([]error, waiters)
		var wg sync.WaitGroup
		for i := range waiters {
			wg.Go(func() {
				var r idempotency.Response
				r, errs[i] = g.Do(ctx, key, "fp", fn)
				returned[i] = time.Now()
				if errs[i] == nil && (!r.Replayed || string(r.Body) != "done") {
					errs[i] = errNotWaiter
				}
			})
		}
		waiting(holder.(*txn), waiters)
		_ = f.effect(ctx, holder.Tx(), "wake")
		start := time.Now()
		if err := holder.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("done")}); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		wg.Wait()
		for i := range waiters {
			if errs[i] != nil {
				b.Fatalf("waiter %d: %v", i, errs[i])
			}
			wake.Add(returned[i].Sub(end))
			done.Add(returned[i].Sub(start))
		}
	}
	b.ReportMetric(float64(wake.Percentile(50).Microseconds()), "wake-p50-us")
	b.ReportMetric(float64(wake.Percentile(99).Microseconds()), "wake-p99-us")
	b.ReportMetric(float64(wake.Percentile(100).Microseconds()), "wake-max-us")
	b.ReportMetric(float64(done.Percentile(50).Microseconds()), "done-p50-us")
	b.ReportMetric(float64(done.Percentile(99).Microseconds()), "done-p99-us")
}

// errNotWaiter fails a benchmark waiter that ran fn or got no replay.
var errNotWaiter = errors.New("a waiter must get the replay, not run fn")

// spin waits until ok, checking every 200µs, for at most 10s.
func spin(b *testing.B, what string, ok func() bool) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// BenchmarkInterleaved runs the bare effect, a new key and a replay in turn
// in every op and reports the median of each and their ratios: on a shared,
// busy machine the load then drifts over all three alike, which the
// separate runs of BenchmarkStore cannot promise. newkey3 is a new key on a
// Store that does not arm WATCH in the reservation (three round trips, as
// on Cluster), on the same client. replay0 is a replay's own round trip
// without the library: the HMGET of the record's fields and TIME that
// lookup sends, in one pipeline, decoding nothing: the least a replay can
// cost against the bare pipeline.
func BenchmarkInterleaved(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b, singleClient(b), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		b.Fatal(err)
	}
	plain, err := New(f.client, &Config{Prefix: f.prefix})
	if err != nil {
		b.Fatal(err)
	}
	plain.single = nil
	g3, err := idempotency.New(plain, nil)
	if err != nil {
		b.Fatal(err)
	}
	fn := func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "bench")
		return idempotency.Response{Status: 201, Body: []byte("bench")}, nil
	}
	replayKey := idempotency.Key{ID: testkit.Name("replay-")}
	if _, err := g.Do(ctx, replayKey, "fp", fn); err != nil {
		b.Fatal(err)
	}
	replayRec := f.store.keysFor(replayKey).rec
	var bare, newKey, newKey3, replay, replay0 benchkit.Latencies
	timed := func(l *benchkit.Latencies, op func() error) {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		l.Add(time.Since(start))
	}
	prefix := testkit.Name("new-")
	i := 0
	for b.Loop() {
		i++
		timed(&bare, func() error { return f.bare(ctx, "bare") })
		timed(&newKey, func() error {
			_, err := g.Do(ctx, idempotency.Key{ID: prefix + strconv.Itoa(i)}, "fp", fn)
			return err
		})
		timed(&newKey3, func() error {
			_, err := g3.Do(ctx, idempotency.Key{ID: prefix + "-3-" + strconv.Itoa(i)}, "fp", fn)
			return err
		})
		timed(&replay, func() error {
			r, err := g.Do(ctx, replayKey, "fp", fn)
			if err == nil && !r.Replayed {
				err = errors.New("not replayed")
			}
			return err
		})
		timed(&replay0, func() error {
			_, err := f.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				p.HMGet(ctx, replayRec, lookupFields...)
				p.Time(ctx)
				return nil
			})
			return err
		})
	}
	p50 := func(l *benchkit.Latencies) float64 { return float64(l.Percentile(50).Nanoseconds()) }
	b.ReportMetric(p50(&bare), "bare-p50-ns")
	b.ReportMetric(p50(&newKey), "newkey-p50-ns")
	b.ReportMetric(p50(&replay), "replay-p50-ns")
	b.ReportMetric(p50(&newKey)/p50(&bare), "newkey/bare")
	b.ReportMetric(p50(&newKey3)/p50(&bare), "newkey3/bare")
	b.ReportMetric(p50(&replay)/p50(&bare), "replay/bare")
	b.ReportMetric(p50(&replay0)/p50(&bare), "replay0/bare")
}
