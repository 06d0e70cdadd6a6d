package conformance

import (
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

func (s *suite[Tx]) ttlExpiry(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	key := idempotency.Key{ID: uniq("k")}
	var calls atomic.Int64
	fn := e.effectFn("payment", &calls)
	if r, err := g.Do(e.ctx, key, "fp", fn); err != nil || r.Replayed {
		t.Fatalf("first: %+v, %v", r, err)
	}
	clk.Add(time.Hour - time.Millisecond)
	if r, err := g.Do(e.ctx, key, "fp", fn); err != nil || !r.Replayed {
		t.Fatalf("1ms before expiry: got %+v, %v; want replayed", r, err)
	}
	clk.Add(time.Millisecond)
	// Expired: it counts as new, even with another fingerprint.
	r, err := g.Do(e.ctx, key, "fp-new", fn)
	if err != nil || r.Replayed {
		t.Fatalf("at expiry: got %+v, %v; want executed as a new key", r, err)
	}
	e.count("payment", 2, "an expired key counts as new")
	again, err := g.Do(e.ctx, key, "fp-new", fn)
	if err != nil || !again.Replayed || !sameResponse(again, r) {
		t.Fatalf("after takeover: got %+v, %v; want the new response replayed", again, err)
	}
	if _, err := g.Do(e.ctx, key, "fp", fn); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("old fingerprint after takeover: got %v, want ErrMismatch", err)
	}
}

// slowHolder runs, on g, a caller of key whose fn performs an effect
// tagged tag, signals held, and returns only when release is closed.
func (e *env[Tx]) slowHolder(g *idempotency.Guard[Tx], key idempotency.Key, tag string, release <-chan struct{}) (held <-chan struct{}, done <-chan result) {
	h := make(chan struct{})
	signal := closer(h) // fn may run again after a retried conflict: the count catches it
	out := make(chan result, 1)
	go func() {
		r, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, tag); err != nil {
				return idempotency.Response{}, err
			}
			signal()
			select {
			case <-release:
			case <-e.ctx.Done():
			}
			return created(tag, 1), nil
		})
		out <- result{r, err}
	}()
	return h, out
}

// waiters starts a caller of key on g (the holder's Guard: it waits in
// memory) and one on a Guard of its own on spy (it waits in the store). It
// returns once the latter waits in the store.
//
// otherFn is what the caller on the other Guard runs if it wins the key
// (nil: mustNotRun).
func (e *env[Tx]) waiters(g *idempotency.Guard[Tx], cfg *idempotency.Config, key idempotency.Key, otherFn func(Tx) (idempotency.Response, error)) (same, other <-chan result) {
	e.t.Helper()
	spy := newSpy(e.f.Store)
	spy.waitStarted = make(chan struct{}, 1)
	gb := e.guardOn(spy, cfg)
	sc, oc := make(chan result, 1), make(chan result, 1)
	go func() {
		r, err := g.Do(e.ctx, key, "fp", mustNotRun[Tx])
		sc <- result{r, err}
	}()
	if otherFn == nil {
		otherFn = mustNotRun[Tx]
	}
	go func() {
		r, err := gb.Do(e.ctx, key, "fp", otherFn)
		oc <- result{r, err}
	}()
	select {
	case <-spy.waitStarted:
		time.Sleep(100 * time.Millisecond) // let it block on the key
	case r := <-oc:
		e.t.Fatalf("a caller on another Guard, while the key is held past its reservation's provisional expiry: got %+v, %v; want it to wait", r.resp, r.err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("a caller on another Guard did not wait in the store within 10s")
	}
	return sc, oc
}

// checkTTLFromCompletion: the holder executed, both waiters replay its
// answer, one effect.
func (e *env[Tx]) checkTTLFromCompletion(holder, same, other <-chan result, tag string) idempotency.Response {
	e.t.Helper()
	var h, a, b result
	within(e.t, 20*time.Second, "the holder and its waiters", func() { h, a, b = <-holder, <-same, <-other })
	if h.err != nil || h.resp.Replayed {
		e.t.Fatalf("holder: %+v, %v; want executed", h.resp, h.err)
	}
	for _, w := range []struct {
		name string
		r    result
	}{{"the waiter on the holder's Guard", a}, {"the waiter on another Guard", b}} {
		if w.r.err != nil || !w.r.resp.Replayed || !sameResponse(w.r.resp, h.resp) {
			e.t.Fatalf("%s, which came after the TTL counted from the reservation: got %+v, %v; want the holder's answer %q replayed",
				w.name, w.r.resp, w.r.err, h.resp.Body)
		}
	}
	e.count(tag, 1, "a slow holder and its waiters must give one effect")
	return h.resp
}

// ttlFromCompletion checks on the wall clock that the TTL counts from
// completion: TTL 1s, the holder's fn takes 2s, callers arrive at 1.3s and
// wait.
func (s *suite[Tx]) ttlFromCompletion(t *testing.T) {
	e := s.setup(t, Options{})
	const ttl = time.Second
	cfg := &idempotency.Config{TTL: ttl}
	g := e.guard(cfg)
	key, tag := idempotency.Key{ID: uniq("k")}, uniq("slow")
	release := make(chan struct{})
	start := time.Now()
	held, slow := e.slowHolder(g, key, tag, release)
	// When the holder's call returned, and when the other Guard's caller
	// ran fn, if it did. On a loaded machine that caller may reach the
	// store more than the TTL after the holder's commit, when the record
	// has rightly expired. The clock variant below checks the rule
	// exactly, with no machine in the way.
	var holderEnd, otherRan atomic.Int64
	holder := make(chan result, 1)
	go func() {
		r := <-slow
		holderEnd.Store(time.Now().UnixNano())
		holder <- r
	}()
	otherFn := func(tx Tx) (idempotency.Response, error) {
		otherRan.Store(time.Now().UnixNano())
		return mustNotRun(tx)
	}
	<-held
	time.Sleep(time.Until(start.Add(1300 * time.Millisecond)))
	same, other := e.waiters(g, cfg, key, otherFn)
	time.Sleep(time.Until(start.Add(2 * time.Second)))
	close(release)
	var h, a, b result
	within(t, 20*time.Second, "the holder and its waiters", func() { h, a, b = <-holder, <-same, <-other })
	if ran, end := otherRan.Load(), holderEnd.Load(); b.err != nil && h.err == nil && ran != 0 && end != 0 && time.Duration(ran-end) >= ttl {
		t.Logf("the waiter on another Guard reached the store %v after the holder's answer, past the TTL (%v): the record had expired, and it ran fn (a loaded machine; TTLFromCompletionClock checks the rule exactly)",
			time.Duration(ran-end), ttl)
		b = result{resp: h.resp}
		b.resp.Replayed = true
	}
	resp := e.checkTTLFromCompletion(sent(h), sent(a), sent(b), tag)
	if since := time.Since(start); since < 2*time.Second+ttl/2 {
		again, err := e.guard(cfg).Do(e.ctx, key, "fp", mustNotRun[Tx])
		if err != nil || !again.Replayed || !sameResponse(again, resp) {
			t.Fatalf("%v after the start, well within the TTL counted from completion: got %+v, %v; want the answer replayed", since, again, err)
		}
	}
}

// sent is a channel that holds r.
func sent(r result) <-chan result {
	c := make(chan result, 1)
	c <- r
	return c
}

// ttlFromCompletionClock is the same on the store's test clock.
func (s *suite[Tx]) ttlFromCompletionClock(t *testing.T) {
	const ttl = time.Second
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	start := clk.Now()
	cfg := &idempotency.Config{TTL: ttl}
	g := e.guard(cfg)
	key, tag := idempotency.Key{ID: uniq("k")}, uniq("slow")
	release := make(chan struct{})
	held, holder := e.slowHolder(g, key, tag, release)
	<-held
	clk.Set(start.Add(1300 * time.Millisecond))
	same, other := e.waiters(g, cfg, key, nil)
	clk.Set(start.Add(2 * time.Second))
	close(release)
	resp := e.checkTTLFromCompletion(holder, same, other, tag)
	clk.Set(start.Add(2*time.Second + ttl - time.Millisecond))
	again, err := e.guard(cfg).Do(e.ctx, key, "fp", mustNotRun[Tx])
	if err != nil || !again.Replayed || !sameResponse(again, resp) {
		t.Fatalf("1ms before the TTL counted from completion: got %+v, %v; want the answer replayed", again, err)
	}
	clk.Set(start.Add(2*time.Second + ttl))
	r, err := e.guard(cfg).Do(e.ctx, key, "fp", e.effectFn(tag, new(atomic.Int64)))
	if err != nil || r.Replayed {
		t.Fatalf("at the TTL counted from completion: got %+v, %v; want executed as a new key", r, err)
	}
	e.count(tag, 2, "the key counts as new once its TTL from completion ran out")
}

// replays fails the case unless key replays on g (at its clock's time).
func (e *env[Tx]) replays(g *idempotency.Guard[Tx], key idempotency.Key, want idempotency.Response, when string) {
	e.t.Helper()
	r, err := g.Do(e.ctx, key, "fp", mustNotRun[Tx])
	if err != nil || !r.Replayed || !sameResponse(r, want) {
		e.t.Fatalf("%s: got %+v, %v; want the answer %q replayed", when, r, err, want.Body)
	}
}

// executes fails the case unless key runs fn on g (a new or expired key).
func (e *env[Tx]) executes(g *idempotency.Guard[Tx], key idempotency.Key, tag, when string) idempotency.Response {
	e.t.Helper()
	r, err := g.Do(e.ctx, key, "fp", e.effectFn(tag, new(atomic.Int64)))
	if err != nil || r.Replayed {
		e.t.Fatalf("%s: got %+v, %v; want fn run", when, r, err)
	}
	return r
}

func (s *suite[Tx]) ttlExtremes(t *testing.T) {
	e := s.setup(t, Options{})
	if _, err := idempotency.New(e.f.Store, &idempotency.Config{TTL: time.Nanosecond}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("TTL 1ns: got %v, want ErrInvalidConfig", err)
	}
	t.Run("Never", func(t *testing.T) {
		clk := newClock()
		e := s.setupClock(t, Options{}, clk)
		g := e.guard(&idempotency.Config{TTL: math.MaxInt64})
		key, tag := idempotency.Key{ID: uniq("never")}, uniq("never")
		resp := e.executes(g, key, tag, "TTL math.MaxInt64, first call")
		e.replays(g, key, resp, "TTL math.MaxInt64, at once")
		clk.Add(200 * 365 * 24 * time.Hour)
		e.replays(g, key, resp, "TTL math.MaxInt64, 200 years later")
		clk.Set(backend.MaxExpiry().Add(-time.Millisecond))
		e.replays(g, key, resp, "TTL math.MaxInt64, 1ms before MaxExpiry")
		e.count(tag, 1, "a key that never expires runs once")
	})
	t.Run("OneMillisecond", func(t *testing.T) {
		clk := newClock()
		e := s.setupClock(t, Options{}, clk)
		g := e.guard(&idempotency.Config{TTL: time.Millisecond})
		key, tag := idempotency.Key{ID: uniq("ms")}, uniq("ms")
		resp := e.executes(g, key, tag, "TTL 1ms, first call")
		e.replays(g, key, resp, "TTL 1ms, same instant")
		clk.Add(time.Millisecond)
		e.executes(g, key, tag, "TTL 1ms, 1ms later")
		e.count(tag, 2, "a key older than its TTL counts as new")
	})
}

func (s *suite[Tx]) clockExtremes(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	out := idempotency.Key{ID: uniq("out")}
	for _, c := range []struct {
		name string
		now  time.Time
	}{
		{"MaxExpiry", backend.MaxExpiry()},
		{"AfterMaxExpiry", backend.MaxExpiry().Add(time.Hour)},
		{"BeforeMinClock", backend.MinClock().Add(-time.Nanosecond)},
	} {
		clk.Set(c.now)
		g := e.guard(nil)
		if _, err := g.Do(e.ctx, out, "fp", e.effectFn("out", new(atomic.Int64))); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("store's clock at %s (%v): got %v, want ErrInvalidConfig", c.name, c.now, err)
		}
	}
	e.count("out", 0, "a clock out of range writes nothing")
	// Nor did it leave the key held or completed: it runs as a new key.
	clk.Set(time.Now().Truncate(time.Millisecond))
	within(t, 20*time.Second, "the key a clock out of range was refused for", func() {
		e.executes(e.guard(&idempotency.Config{WaitTimeout: -1}), out, "out", "after the clock came back in range")
	})

	// The latest readings: the expiry is clamped to MaxExpiry.
	hi := clk
	hi.Set(backend.MaxExpiry().Truncate(time.Second).Add(-time.Second))
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	key, tag := idempotency.Key{ID: uniq("hi")}, uniq("hi")
	resp := e.executes(g, key, tag, "clock 1s before MaxExpiry")
	e.replays(g, key, resp, "clock 1s before MaxExpiry, again")
	hi.Set(backend.MaxExpiry().Add(-time.Millisecond))
	e.replays(g, key, resp, "clock 1ms before MaxExpiry")
	e.count(tag, 1, "near MaxExpiry")

	// The earliest readings.
	lo := clk
	lo.Set(backend.MinClock().Truncate(time.Second).Add(time.Second))
	g = e.guard(&idempotency.Config{TTL: time.Hour})
	key, tag = idempotency.Key{ID: uniq("lo")}, uniq("lo")
	resp = e.executes(g, key, tag, "clock 1s after MinClock")
	lo.Add(time.Hour - time.Millisecond)
	e.replays(g, key, resp, "clock 1s after MinClock, 1ms before expiry")
	lo.Add(time.Millisecond)
	e.executes(g, key, tag, "clock 1s after MinClock, at expiry")
	e.count(tag, 2, "near MinClock")
}

// subMillisecond: a clock off the millisecond grid; a record is live 1ms
// before its expiry and absent at it, whatever the store's precision.
func (s *suite[Tx]) subMillisecond(t *testing.T) {
	clk := &clock{now: time.Now().Truncate(time.Millisecond).Add(700*time.Microsecond + 300)}
	e := s.setupClock(t, Options{}, clk)
	start := clk.Now()
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	key, tag := idempotency.Key{ID: uniq("k")}, uniq("sub")
	resp := e.executes(g, key, tag, "first call")
	clk.Set(start.Add(time.Hour - time.Millisecond))
	e.replays(g, key, resp, "1ms before the expiry")
	clk.Set(start.Add(time.Hour))
	e.executes(g, key, tag, "exactly at the expiry (ExpiresAt <= Now: absent)")
	e.count(tag, 2, "expiry off the millisecond grid")
}
