package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/observe"
)

func TestWithTTLValidates(t *testing.T) {
	g := newGuard(t, memstore.New(), &idempotency.Config{TTL: time.Hour})
	for _, bad := range []time.Duration{-1, -time.Hour, time.Microsecond, time.Millisecond - 1} {
		if v, err := g.WithTTL(bad); !errors.Is(err, idempotency.ErrInvalidConfig) || v != nil {
			t.Errorf("WithTTL(%v) = %v, %v; want nil and ErrInvalidConfig", bad, v, err)
		}
	}
	v, err := g.WithTTL(0)
	if err != nil || v.TTL() != 24*time.Hour {
		t.Fatalf("WithTTL(0): %v, %v; want the default %v", v, err, 24*time.Hour)
	}
	v, err = g.WithTTL(72 * time.Hour)
	if err != nil || v.TTL() != 72*time.Hour || g.TTL() != time.Hour {
		t.Fatalf("WithTTL(72h): view %v, guard %v, %v; want 72h and the guard's 1h untouched", v.TTL(), g.TTL(), err)
	}
}

// offsetClock is a store clock that runs ahead of the application's by a
// settable offset.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) advance(d time.Duration) { c.off.Add(int64(d)) }
func ctxT(t *testing.T) context.Context        { return ctxTimeout(t, 10*time.Second) }
func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// A view stores its records with its own TTL; replays report the record's
// exact expiry; the executed call's estimate is no later than it.
func TestWithTTLRecordsAndExpiry(t *testing.T) {
	ctx := ctxT(t)
	clock := &offsetClock{}
	s := memstore.New()
	s.Clock = clock.now
	var events []observe.Event
	var mu sync.Mutex
	g := newGuard(t, s, &idempotency.Config{TTL: time.Hour, Observer: func(_ context.Context, ev observe.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}})
	long, err := g.WithTTL(72 * time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kLong, kShort := idempotency.Key{Scope: "ttl", ID: "long"}, idempotency.Key{Scope: "ttl", ID: "short"}

	before := time.Now()
	first, err := long.Do(ctx, kLong, "fp", ok("long"))
	after := time.Now()
	if err != nil || first.Replayed || first.TTL != 72*time.Hour {
		t.Fatalf("first through the view: %+v, %v; want executed with TTL 72h", first, err)
	}
	lo, hi := before.Add(72*time.Hour).Truncate(time.Millisecond), after.Add(72*time.Hour)
	if first.ExpiresAt.Before(lo) || first.ExpiresAt.After(hi) || !first.ExpiresAt.Equal(first.ExpiresAt.Truncate(time.Millisecond)) {
		t.Fatalf("estimate %v outside [%v, %v] or not whole milliseconds", first.ExpiresAt, lo, hi)
	}
	info, err := g.Inspect(ctx, kLong, false)
	if err != nil {
		t.Fatal(err)
	}
	if first.ExpiresAt.After(info.ExpiresAt) {
		t.Fatalf("the estimate %v is later than the store's expiry %v", first.ExpiresAt, info.ExpiresAt)
	}

	// A replay through the guard (TTL 1h) answers the record as completed
	// by the view: its exact expiry, 72h out.
	replay, err := g.Do(ctx, kLong, "fp", ok("again"))
	if err != nil || !replay.Replayed || !bytes.Equal(replay.Body, []byte("long")) {
		t.Fatalf("replay: %+v, %v", replay, err)
	}
	if !replay.ExpiresAt.Equal(info.ExpiresAt) || replay.TTL != time.Hour {
		t.Fatalf("replay ExpiresAt %v TTL %v; want the record's %v and the reading guard's 1h", replay.ExpiresAt, replay.TTL, info.ExpiresAt)
	}

	if _, err := g.Do(ctx, kShort, "fp", ok("short")); err != nil {
		t.Fatal(err)
	}
	// Past 1h by the store's clock: the guard's key expired, the view's
	// did not.
	clock.advance(time.Hour + time.Second)
	again, err := g.Do(ctx, kShort, "fp", ok("short"))
	if err != nil || again.Replayed || s.Count("short") != 2 {
		t.Fatalf("the 1h key after 1h: %+v, %v, %d effects; want a second run", again, err, s.Count("short"))
	}
	stillLong, err := long.Do(ctx, kLong, "fp", ok("long"))
	if err != nil || !stillLong.Replayed || s.Count("long") != 1 {
		t.Fatalf("the 72h key after 1h: %+v, %v, %d effects; want a replay", stillLong, err, s.Count("long"))
	}
	clock.advance(71 * time.Hour)
	if r, err := long.Do(ctx, kLong, "fp", ok("long")); err != nil || r.Replayed || s.Count("long") != 2 {
		t.Fatalf("the 72h key after 72h: %+v, %v, %d effects; want a second run", r, err, s.Count("long"))
	}

	mu.Lock()
	defer mu.Unlock()
	want := []time.Duration{72 * time.Hour, time.Hour, time.Hour, time.Hour, 72 * time.Hour, 72 * time.Hour}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d", len(events), len(want))
	}
	for i, ev := range events {
		if ev.TTL != want[i] {
			t.Errorf("event %d (%v): TTL %v, want %v", i, ev.Outcome, ev.TTL, want[i])
		}
	}
}

// What fn puts in TTL, ExpiresAt and Replayed is neither stored nor
// returned: the store sees status, header and body only.
func TestResponseLifetimeFieldsAreNotStored(t *testing.T) {
	ctx := ctxT(t)
	s := memstore.New()
	g := newGuard(t, s, &idempotency.Config{TTL: time.Minute})
	k := idempotency.Key{ID: "fields"}
	bogus := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	resp, err := g.Do(ctx, k, "fp", func(*memstore.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Header: http.Header{"X-A": {"1"}}, Body: []byte{0, 1, 2},
			Replayed: true, TTL: time.Nanosecond, ExpiresAt: bogus}, nil
	})
	if err != nil || resp.Replayed || resp.TTL != time.Minute || resp.ExpiresAt.Equal(bogus) ||
		time.Until(resp.ExpiresAt) < 50*time.Second {
		t.Fatalf("executed: %+v, %v; want fn's lifetime fields replaced by the guard's", resp, err)
	}
	info, err := g.Inspect(ctx, k, true)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != 201 || !bytes.Equal(info.Body, []byte{0, 1, 2}) || info.Header.Get("X-A") != "1" || len(info.Header) != 1 ||
		info.ExpiresAt.Sub(info.CreatedAt) > time.Minute+time.Second {
		t.Fatalf("stored %+v; want 201, X-A only, the three bytes, expiry a minute out", info)
	}
	for range 2 {
		r, err := g.Do(ctx, k, "fp", ok("never"))
		if err != nil || !r.Replayed || r.Status != 201 || !bytes.Equal(r.Body, []byte{0, 1, 2}) || r.Header.Get("X-A") != "1" ||
			!r.ExpiresAt.Equal(info.ExpiresAt) {
			t.Fatalf("replay %+v, %v; want the stored bytes and the record's expiry %v", r, err, info.ExpiresAt)
		}
	}
}

// Callers of one key through a guard and through its view meet in memory:
// one reservation in the store, the others handed the leader's answer
// (with its TTL and estimate) without asking the store.
func TestWithTTLSharesTheQueue(t *testing.T) {
	ctx := ctxT(t)
	clock := &offsetClock{}
	clock.advance(time.Hour) // store replays and in-memory hands differ by an hour
	s := memstore.New()
	s.Clock = clock.now
	var reserves atomic.Int64
	s.ReserveErr = func() error { reserves.Add(1); return nil }
	g := newGuard(t, s, &idempotency.Config{TTL: time.Hour})
	view, err := g.WithTTL(5 * time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	k := idempotency.Key{Scope: "shared", ID: "k"}
	release := make(chan struct{})
	entered := make(chan struct{})
	type res struct {
		resp idempotency.Response
		err  error
	}
	leader := make(chan res, 1)
	go func() {
		r, err := view.Do(ctx, k, "fp", func(tx *memstore.Tx) (idempotency.Response, error) {
			close(entered)
			<-release
			tx.Effect("shared")
			return idempotency.Response{Status: 200, Body: []byte("once")}, nil
		})
		leader <- res{r, err}
	}()
	<-entered
	const followers = 8
	out := make(chan res, followers)
	for i := range followers {
		go func() {
			guard := g
			if i%2 == 1 {
				guard = view
			}
			r, err := guard.Do(ctx, k, "fp", ok("twice"))
			out <- res{r, err}
		}()
	}
	time.Sleep(100 * time.Millisecond) // let the followers join the leader's call
	if n := reserves.Load(); n != 1 {
		t.Fatalf("%d reservations while the leader ran; want 1 (the followers wait in memory)", n)
	}
	close(release)
	l := <-leader
	if l.err != nil || l.resp.Replayed || l.resp.TTL != 5*time.Hour {
		t.Fatalf("leader: %+v, %v", l.resp, l.err)
	}
	for range followers {
		f := <-out
		if f.err != nil || !f.resp.Replayed || string(f.resp.Body) != "once" || f.resp.TTL != 5*time.Hour ||
			!f.resp.ExpiresAt.Equal(l.resp.ExpiresAt) {
			t.Errorf("follower: %+v, %v; want the leader's answer, TTL 5h and its estimate %v", f.resp, f.err, l.resp.ExpiresAt)
		}
	}
	if n := reserves.Load(); n != 1 || s.Count("shared") != 1 || s.Count("twice") != 0 {
		t.Fatalf("%d reservations, effects %d/%d; want 1 reservation and one effect", n, s.Count("shared"), s.Count("twice"))
	}
}
