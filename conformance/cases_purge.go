package conformance

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func (s *suite[Tx]) purge(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	g := e.guard(&idempotency.Config{TTL: time.Hour, PurgeBatch: 7})
	old := make([]idempotency.Key, 25)
	for i := range old {
		old[i] = idempotency.Key{ID: uniq("old")}
		if _, err := g.Do(e.ctx, old[i], "fp", e.effectFn("old", new(atomic.Int64))); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(30 * time.Minute)
	fresh := make([]idempotency.Key, 5)
	for i := range fresh {
		fresh[i] = idempotency.Key{ID: uniq("fresh")}
		if _, err := g.Do(e.ctx, fresh[i], "fp", e.effectFn("fresh", new(atomic.Int64))); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := g.Purge(e.ctx); err != nil || n != 0 {
		t.Fatalf("purge before any expiry: got %d, %v; want 0", n, err)
	}
	clk.Add(31 * time.Minute) // old keys expired, fresh ones not
	n, err := g.Purge(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := len(old)
	if s.h.Features.SelfExpiring {
		want = 0
	}
	if n != want {
		t.Fatalf("purge: got %d, want %d (Features.SelfExpiring %v)", n, want, s.h.Features.SelfExpiring)
	}
	if n2, err := g.Purge(e.ctx); err != nil || n2 != 0 {
		t.Fatalf("second purge: got %d, %v; want 0", n2, err)
	}
	for _, k := range fresh {
		if r, err := g.Do(e.ctx, k, "fp", e.effectFn("fresh", new(atomic.Int64))); err != nil || !r.Replayed {
			t.Fatalf("fresh key after purge: got %+v, %v; want replayed", r, err)
		}
	}
	e.count("fresh", len(fresh), "purge must keep unexpired keys")
	for _, k := range old[:3] {
		if r, err := g.Do(e.ctx, k, "fp", e.effectFn("old", new(atomic.Int64))); err != nil || r.Replayed {
			t.Fatalf("purged key: got %+v, %v; want executed as new", r, err)
		}
	}
	e.count("old", len(old)+3, "purged keys count as new")
}

// purgeSkipsHeld: keys held by open reservations, one of them taking over
// an expired record, whose provisional expiries are past; Purge neither
// deletes them nor (except on SerialWriters stores) waits for them.
func (s *suite[Tx]) purgeSkipsHeld(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	old := idempotency.Key{ID: uniq("old")}
	e.executes(g, old, "old", "first call")
	gone := make([]idempotency.Key, 3) // expired and not held: Purge deletes them
	for i := range gone {
		gone[i] = idempotency.Key{ID: uniq("gone")}
		e.executes(g, gone[i], "gone", "first call")
	}
	clk.Add(2 * time.Hour) // old and gone expired
	// The holders reserve now, with provisional expiries in an hour.
	releaseOld, doneOld := e.hold(g, old, "old-again")
	var releaseNew func()
	var doneNew <-chan result
	fresh := idempotency.Key{ID: uniq("new")}
	if !s.h.Features.SerialWriters {
		releaseNew, doneNew = e.hold(g, fresh, "new")
	}
	clk.Add(2 * time.Hour) // both provisional expiries are past
	type purged struct {
		n   int
		err error
	}
	out := make(chan purged, 1)
	go func() {
		n, err := g.Purge(e.ctx)
		out <- purged{n, err}
	}()
	var p purged
	if s.h.Features.SerialWriters {
		// It may queue for the write lock the holder has.
		time.Sleep(200 * time.Millisecond)
		releaseOld()
		within(t, 20*time.Second, "Purge once the holder completed", func() { p = <-out })
	} else {
		within(t, 10*time.Second, "Purge while keys are held", func() { p = <-out })
		releaseOld()
		releaseNew()
	}
	// Only the expired record under the takeover may count as deleted, on
	// a store that keeps the holder's reservation apart from it. Then the
	// holder's completion must bring it back, as checked below.
	want, allowed := len(gone), btoi(!s.h.Features.SerialWriters)
	if s.h.Features.SelfExpiring {
		want = 0
	}
	if p.err != nil || p.n < want || p.n > want+allowed {
		t.Fatalf("Purge with %d unheld expired keys and held keys past their provisional expiry: got %d, %v; want %d deleted",
			len(gone), p.n, p.err, want)
	}
	for _, d := range []<-chan result{doneOld, doneNew} {
		if d == nil {
			continue
		}
		if h := <-d; h.err != nil || h.resp.Replayed {
			t.Fatalf("holder after Purge: %+v, %v; want executed", h.resp, h.err)
		}
	}
	e.replays(g, old, created("old-again", 1), "the taken-over key held during Purge")
	if !s.h.Features.SerialWriters {
		e.replays(g, fresh, created("new", 1), "the new key held during Purge")
		e.count("new", 1, "held during Purge")
	}
	if !s.h.Features.SelfExpiring {
		for _, k := range gone {
			e.executes(g, k, "gone", "a purged key")
		}
		e.count("gone", 2*len(gone), "purged keys count as new")
	}
	e.count("old", 1, "first call")
	e.count("old-again", 1, "takeover held during Purge")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
