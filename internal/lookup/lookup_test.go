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

func TestTallyWeighted(t *testing.T) {
	tl := Tally{ReplayWeight: 2}
	for range 20 {
		tl.Add(first, false)
	}
	if n := tl.n.Load(); n != -2*Bias {
		t.Fatalf("after 20 new keys: count %d, want %d", n, -2*Bias)
	}
	// From the bottom, Bias replays bring it back to even, one more
	// switches to the look-up.
	for i := range Bias {
		tl.Add(first, true)
		if tl.Replays() {
			t.Fatalf("replay %d from the bottom: Replays true, want false (count %d)", i+1, tl.n.Load())
		}
	}
	tl.Add(first, true)
	if !tl.Replays() {
		t.Fatalf("replay %d from the bottom: Replays false, want true", Bias+1)
	}
	// Half replays, half new keys: the look-up stays the way.
	for i := range 100 {
		tl.Add(first, i%2 == 0)
		if i%2 == 1 && !tl.Replays() {
			t.Fatalf("half replays, call %d: Replays false (count %d), want true", i, tl.n.Load())
		}
	}
	// One replay in four: reserving straight away becomes the way and stays.
	for i := range 100 {
		tl.Add(first, i%4 == 0)
		if i >= 2*Bias && i%4 == 3 && tl.Replays() {
			t.Fatalf("a quarter replays, call %d: Replays true (count %d), want false", i, tl.n.Load())
		}
	}
	// From the top, Bias new keys switch back.
	for range 10 {
		tl.Add(first, true)
	}
	for i := range Bias {
		if !tl.Replays() {
			t.Fatalf("new key %d from the top: Replays false too early", i)
		}
		tl.Add(first, false)
	}
	if tl.Replays() {
		t.Fatalf("after %d new keys from the top: Replays true, want false", Bias)
	}
}
