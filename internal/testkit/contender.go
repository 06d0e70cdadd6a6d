package testkit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency/internal/benchkit"
)

// Contender is an idempotent operation written without this module, such
// as plain SQL in one transaction: INSERT the key ON CONFLICT DO NOTHING,
// the effect, UPDATE the key with the response. [BenchmarkContender]
// measures it with the cases of conformance.Benchmark. A table can then
// show the library next to it, both as ratios to the same bare effect
// transaction.
type Contender struct {
	// Do performs the operation for key. When key is new, that is one
	// effect (the same one-row effect as Fixture.Effect) and the stored
	// answer, in one transaction. Otherwise it is the stored answer,
	// without the effect. It
	// reports whether the answer was a replay. It is called from many
	// goroutines at once.
	Do func(ctx context.Context, key string) (replayed bool, err error)
	// Effects reports how many effects Do has committed so far, read
	// through a connection of its own.
	Effects func(ctx context.Context) (int, error)
}

// ContenderBody is the response body a plain-SQL contender stores (the
// body the library's benchmark stores), and ContenderFingerprint the
// request hash it stores with the key (the library's benchmark passes a
// constant fingerprint too). The contenders of every backend share them.
const (
	ContenderBody        = `{"tag":"plain","execution":1}`
	ContenderFingerprint = "fp"
)

// BenchmarkContender measures c with the single-caller cases of
// conformance.Benchmark and the same names, so that cmd/idembench can pair
// them:
//
//   - NewKey: Do with a new key each time.
//   - Replay: Do with a completed key.
//   - SameKey20: 20 callers released together on one new key; one op
//     is the time until all of them have their answer.
//
// Each case then checks that c committed exactly one effect per key and
// answered every other call as a replay. A contender that duplicates an
// effect fails instead of being measured.
func BenchmarkContender(b *testing.B, c Contender) {
	if c.Do == nil || c.Effects == nil {
		b.Fatal("testkit: Contender.Do and Contender.Effects are required")
	}
	ctx := context.Background()
	prefix := benchkit.Prefix()
	var seq atomic.Int64
	next := func() string { return prefix + strconv.FormatInt(seq.Add(1), 36) }
	do := func(b *testing.B, key string, wantReplay bool) {
		replayed, err := c.Do(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if replayed != wantReplay {
			b.Fatalf("contender: key %s replayed=%v, want %v", key, replayed, wantReplay)
		}
	}
	checkEffects := func(b *testing.B) {
		b.StopTimer()
		got, err := c.Effects(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if want := seq.Load(); int64(got) != want { // one effect per key
			b.Fatalf("contender: %d effects committed for %d keys (a duplicate or a lost effect)", got, want)
		}
	}

	b.Run("NewKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			do(b, next(), false)
		}
		checkEffects(b)
	})
	b.Run("Replay", func(b *testing.B) {
		key := next()
		do(b, key, false)
		b.ReportAllocs()
		for b.Loop() {
			do(b, key, true)
		}
		checkEffects(b)
	})
	b.Run("SameKey20", func(b *testing.B) {
		call := func() func() (bool, error) {
			key := next()
			return func() (bool, error) { return c.Do(ctx, key) }
		}
		sameKey := func() {
			if err := benchkit.SameKey(20, call()); err != nil {
				b.Fatal(err)
			}
		}
		sameKey() // untimed: opens the pool's connections
		b.ReportAllocs()
		for b.Loop() {
			sameKey()
		}
		checkEffects(b)
	})
}
