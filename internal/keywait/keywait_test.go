package keywait_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/keywait"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestOneHolderPerKey: many callers of a few keys, concurrently; at most one
// holds each key at any time, every caller gets its turn, and nothing is
// left held.
func TestOneHolderPerKey(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	var q keywait.Queue[string, int]
	keys := []string{"a", "b", "c"}
	var inside [3]atomic.Int32
	var turns atomic.Int32
	var wg sync.WaitGroup
	const callers = 60
	for i := range callers {
		wg.Go(func() {
			k := i % len(keys)
			for {
				turn, mine := q.Take(keys[k])
				if mine {
					break
				}
				if _, _, err := turn.Wait(ctx, time.Time{}); err != nil {
					t.Error(err)
					return
				}
			}
			if n := inside[k].Add(1); n != 1 {
				t.Errorf("key %s: %d holders at once", keys[k], n)
			}
			time.Sleep(time.Millisecond)
			inside[k].Add(-1)
			turns.Add(1)
			q.Leave(keys[k], nil)
		})
	}
	wg.Wait()
	if n := turns.Load(); n != callers {
		t.Fatalf("turns: %d, want %d", n, callers)
	}
	if n := q.Held(); n != 0 {
		t.Fatalf("held after all left: %d, want 0", n)
	}
}

// TestHandOver: the waiters of a turn get the value its holder hands over,
// computed once and only because there are waiters.
func TestHandOver(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	var q keywait.Queue[string, string]
	if _, mine := q.Take("k"); !mine {
		t.Fatal("first Take: not mine")
	}
	const n = 10
	got := make(chan string, n)
	var joined sync.WaitGroup
	for range n {
		joined.Add(1)
		go func() {
			turn, mine := q.Take("k")
			joined.Done()
			if mine {
				got <- "took the held key"
				return
			}
			v, handed, err := turn.Wait(ctx, time.Now().Add(20*time.Second))
			if err != nil || !handed {
				got <- "no value: " + errString(err)
				return
			}
			got <- v
		}()
	}
	joined.Wait()
	calls := 0
	q.Leave("k", func() (string, bool) { calls++; return "rec", true })
	for range n {
		if v := <-got; v != "rec" {
			t.Fatalf("waiter got %q, want the handed value", v)
		}
	}
	if calls != 1 {
		t.Fatalf("hand called %d times, want 1", calls)
	}
	// No waiters: hand is not called.
	q.Take("k")
	q.Leave("k", func() (string, bool) { t.Fatal("hand called without waiters"); return "", false })
	// Leave without hand: the waiter wakes with nothing handed.
	q.Take("k")
	turn, _ := q.Take("k")
	q.Leave("k", nil)
	if _, handed, err := turn.Wait(ctx, time.Time{}); err != nil || handed {
		t.Fatalf("after Leave(nil): handed %v, %v; want nothing, nil", handed, err)
	}
}

// TestWaitBounds: a passed deadline does not wait; a deadline and a
// cancelled ctx end the wait with their errors; an ended turn wins over a
// done ctx.
func TestWaitBounds(t *testing.T) {
	var q keywait.Queue[int, int]
	q.Take(1)
	turn, mine := q.Take(1)
	if mine {
		t.Fatal("second Take of a held key: mine")
	}
	if _, _, err := turn.Wait(testkit.Context(t, 30*time.Second), time.Now().Add(-time.Second)); !errors.Is(err, keywait.ErrDeadline) {
		t.Fatalf("passed deadline: %v, want ErrDeadline", err)
	}
	start := time.Now()
	if _, _, err := turn.Wait(testkit.Context(t, 30*time.Second), time.Now().Add(50*time.Millisecond)); !errors.Is(err, keywait.ErrDeadline) {
		t.Fatalf("deadline: %v, want ErrDeadline", err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Fatal("returned before the deadline")
	}
	ctx, cancel := context.WithCancel(testkit.Context(t, 30*time.Second))
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, _, err := turn.Wait(ctx, time.Time{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v, want context.Canceled", err)
	}
	q.Leave(1, func() (int, bool) { return 7, true })
	if v, handed, err := turn.Wait(ctx, time.Now().Add(-time.Second)); err != nil || !handed || v != 7 {
		t.Fatalf("ended turn, done ctx, passed deadline: %d %v %v; want 7 handed", v, handed, err)
	}
	q.Leave(1, nil) // not held: nothing happens
	if _, mine := q.Take(1); !mine {
		t.Fatal("Take after the turn ended: not mine")
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestJoined counts the callers that joined the current turn of a key, and
// starts again at zero with the next turn.
func TestJoined(t *testing.T) {
	var q keywait.Queue[string, int]
	if n := q.Joined("k"); n != 0 {
		t.Fatalf("no turn: Joined %d, want 0", n)
	}
	if _, mine := q.Take("k"); !mine {
		t.Fatal("first Take did not get the turn")
	}
	for want := 1; want <= 3; want++ {
		if _, mine := q.Take("k"); mine {
			t.Fatal("a Take got a held turn")
		}
		if n := q.Joined("k"); n != want {
			t.Fatalf("Joined %d, want %d", n, want)
		}
	}
	if n := q.Joined("other"); n != 0 {
		t.Fatalf("another key: Joined %d, want 0", n)
	}
	q.Leave("k", nil)
	if _, mine := q.Take("k"); !mine || q.Joined("k") != 0 {
		t.Fatalf("next turn: mine %v, Joined %d; want true, 0", mine, q.Joined("k"))
	}
}
