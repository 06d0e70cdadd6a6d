package lookup

import (
	"sync"
	"testing"
	"time"
)

// first is the Wait of a first try; waited, of a caller that waited.
const first, waited = time.Duration(0), time.Second

func TestTallyFollowsTheLoad(t *testing.T) {
	var tl Tally
	if tl.Replays() {
		t.Fatal("zero Tally: Replays true, want false")
	}
	steps := []struct {
		replayed, want bool
	}{
		{true, true},                                   // +1
		{false, false},                                 // 0
		{false, false}, {false, false}, {false, false}, // -3
		{false, false}, {false, false}, {false, false}, // saturated at -Bias
		{true, false}, {true, false}, {true, false}, {true, false}, // back to 0
		{true, true}, // +1
	}
	for i, s := range steps {
		tl.Add(first, s.replayed)
		if got := tl.Replays(); got != s.want {
			t.Fatalf("step %d: Replays %v, want %v (count %d)", i, got, s.want, tl.n.Load())
		}
	}
}

func TestTallySaturatesUnderConcurrency(t *testing.T) {
	var tl Tally
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				tl.Add(first, true)
			}
		})
	}
	wg.Wait()
	if n := tl.n.Load(); n != Bias {
		t.Fatalf("after 8000 replays: count %d, want %d", n, Bias)
	}
}

func TestTallyIgnoresWaiters(t *testing.T) {
	var tl Tally
	for range 2 * Bias {
		tl.Add(waited, true)
	}
	if tl.Replays() || tl.n.Load() != 0 {
		t.Fatalf("after waiters' replays only: Replays %v, count %d; want false, 0", tl.Replays(), tl.n.Load())
	}
}
