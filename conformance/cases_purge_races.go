package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// expiredKeys completes n new keys on g (tag tag), then moves clk past
// their expiry (TTL an hour). It returns the keys and the clock reading at
// which they were completed.
func (e *env[Tx]) expiredKeys(g *idempotency.Guard[Tx], clk *clock, n int, tag string) ([]idempotency.Key, time.Time) {
	e.t.Helper()
	at := clk.Now()
	keys := make([]idempotency.Key, n)
	for i := range keys {
		keys[i] = idempotency.Key{ID: uniq(tag)}
	}
	// A few callers at once: hundreds of keys one after another take
	// seconds on a server.
	workers := min(n, 8)
	errs := make([]error, n)
	fire(e.t, workers, func(w int) (idempotency.Response, error) {
		for i := w; i < n; i += workers {
			r, err := g.Do(e.ctx, keys[i], "fp", e.effectFn(tag, new(atomic.Int64)))
			if err == nil && r.Replayed {
				err = errors.New("replayed a new key")
			}
			errs[i] = err
		}
		return idempotency.Response{}, nil
	})
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("a key to expire (%d of %d): %v; want fn run", i+1, n, err)
		}
	}
	clk.Add(2 * time.Hour)
	return keys, at
}

// gone reports, for each key, whether its record was deleted. A Guard whose
// clock reads back (before the records' expiry) replays a record still
// there and runs fn for a deleted one. It leaves the clock where it was.
func (e *env[Tx]) gone(clk *clock, back time.Time, keys []idempotency.Key, tag string) []bool {
	e.t.Helper()
	now := clk.Now()
	defer clk.Set(now)
	clk.Set(back)
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	out := make([]bool, len(keys))
	errs := make([]error, len(keys))
	workers := min(len(keys), 8)
	fire(e.t, workers, func(w int) (idempotency.Response, error) {
		for i := w; i < len(keys); i += workers {
			r, err := g.Do(e.ctx, keys[i], "fp", e.effectFn(tag, new(atomic.Int64)))
			out[i], errs[i] = !r.Replayed, err
		}
		return idempotency.Response{}, nil
	})
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("key %d, looked up before its expiry: %v", i, err)
		}
	}
	return out
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		n += btoi(b)
	}
	return n
}

// Sizes of PurgeRecheck: purgeKeys expired keys, purgeAgain of them done
// again by Callers callers while purgers Purges run on other instances. A
// Purge that re-checks only that a record is not held (not that it is the
// one it scanned) deletes a key completed again between its scan and its
// delete: among this many keys and Purges, some always are.
const (
	purgeKeys  = 200
	purgeAgain = 100
	purgers    = 3
)

// purgeRecheck: expired keys are re-reserved and completed by Do on other
// Guards while several Purges run. A record re-reserved or completed after
// Purge chose it is not deleted: every key done again still replays its
// new answer.
func (s *suite[Tx]) purgeRecheck(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	cfg := &idempotency.Config{TTL: time.Hour}
	const n, again = purgeKeys, purgeAgain
	keys, back := e.expiredKeys(e.guard(cfg), clk, n, "old")
	gs := e.guards(Callers, cfg)
	type purged struct {
		n   int
		err error
	}
	out := make(chan purged, purgers)
	for _, pg := range e.guards(purgers, cfg) {
		go func() {
			n, err := pg.Purge(e.ctx)
			out <- purged{n, err}
		}()
	}
	time.Sleep(5 * time.Millisecond) // the Purges have chosen their records
	rs := make([]result, again)
	fire(t, Callers, func(i int) (idempotency.Response, error) {
		for j := i; j < again; j += Callers {
			rs[j].resp, rs[j].err = gs[i].Do(e.ctx, keys[j], "fp", e.effectFn("again", new(atomic.Int64)))
		}
		return idempotency.Response{}, nil
	})
	var p purged
	within(t, 30*time.Second, "Purges while expired keys are done again", func() {
		for range purgers {
			q := <-out
			p.n += q.n
			p.err = cmp.Or(p.err, q.err)
		}
	})
	if p.err != nil {
		t.Fatalf("Purge: %v", p.err)
	}
	for i, r := range rs {
		if r.err != nil || r.resp.Replayed {
			t.Fatalf("expired key %d done again during Purge: got %+v, %v; want fn run", i, r.resp, r.err)
		}
	}
	for i, r := range rs {
		e.replays(gs[i%Callers], keys[i], r.resp, fmt.Sprintf("expired key %d, re-reserved and completed while %d Purges ran "+
			"(a Purge deleted it after it was done again: its delete must re-check the expiry or revision it scanned, not only that the record is not held)", i, purgers))
	}
	e.count("again", again, "keys done again during Purge")
	if s.h.Features.SelfExpiring {
		return
	}
	if p.n < n-again || p.n > n {
		t.Fatalf("%d Purges of %d expired keys, %d of them done again meanwhile: reported %d deleted in all, want %d to %d", purgers, n, again, p.n, n-again, n)
	}
	if g := countTrue(e.gone(clk, back, keys[again:], "old")); g != n-again {
		t.Fatalf("the Purges deleted %d of the %d expired keys nobody touched, want all", g, n-again)
	}
}

// purgeLimit: Purge deletes at most limit records and reports exactly the
// records it deleted.
func (s *suite[Tx]) purgeLimit(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	cfg := &idempotency.Config{TTL: time.Hour}
	const n, limit = 10, 3
	keys, back := e.expiredKeys(e.guard(cfg), clk, n, "old")
	got, err := e.f.Store.Purge(e.ctx, limit)
	if err != nil {
		t.Fatalf("Purge(limit %d): %v", limit, err)
	}
	want := limit
	if s.h.Features.SelfExpiring {
		want = 0
	}
	if got != want {
		t.Fatalf("Purge(limit %d) of %d expired keys: reported %d, want %d", limit, n, got, want)
	}
	if s.h.Features.SelfExpiring {
		return
	}
	if g := countTrue(e.gone(clk, back, keys, "old")); g != limit {
		t.Fatalf("Purge(limit %d) of %d expired keys reported %d and deleted %d, want %d", limit, n, got, g, limit)
	}
}

// purgeCountsDeleted: two Purges on separate instances race over the same
// expired keys, then a third runs. Together they report each key once: a
// store counting the records it chose, not the ones it deleted, reports
// more than there were.
func (s *suite[Tx]) purgeCountsDeleted(t *testing.T) {
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	cfg := &idempotency.Config{TTL: time.Hour}
	const n = 30
	keys, back := e.expiredKeys(e.guard(cfg), clk, n, "old")
	gs := e.guards(2, cfg)
	type purged struct {
		n   int
		err error
	}
	out := make(chan purged, 2)
	gate := make(chan struct{})
	for _, g := range gs {
		go func() {
			<-gate
			n, err := g.Purge(e.ctx)
			out <- purged{n, err}
		}()
	}
	close(gate)
	total := 0
	var perr error // reported here, not from within's goroutine
	within(t, 30*time.Second, "two Purges at once", func() {
		for range gs {
			p := <-out
			perr = cmp.Or(perr, p.err)
			total += p.n
		}
	})
	if perr != nil {
		t.Fatalf("Purge racing another: %v", perr)
	}
	third, err := e.guard(cfg).Purge(e.ctx)
	if err != nil {
		t.Fatalf("third Purge: %v", err)
	}
	total += third
	want := n
	if s.h.Features.SelfExpiring {
		want = 0
	}
	if total != want {
		t.Fatalf("two Purges at once and a third over %d expired keys reported %d deletions in all, want %d", n, total, want)
	}
	if s.h.Features.SelfExpiring {
		return
	}
	if g := countTrue(e.gone(clk, back, keys, "old")); g != n {
		t.Fatalf("after the Purges %d of %d expired keys are gone, want all", g, n)
	}
}

// failedCompleteFreesKey: a Complete that returns an error and committed
// nothing (its ctx ended before or while it ran) frees the key at once.
// Another caller takes it within leaseWake, not when a lease runs out.
func (s *suite[Tx]) failedCompleteFreesKey(t *testing.T) {
	opts := Options{}
	if s.h.Features.Leases {
		opts.Lease = s.h.Features.leaseOf(30 * time.Second) // far longer than the bound
	}
	e := s.setup(t, opts)
	stores := e.instances(2)
	other := stores[len(stores)-1]
	for i, d := range []time.Duration{-1, 0, time.Millisecond, 3 * time.Millisecond} {
		key, tag := idempotency.Key{ID: uniq("fc")}, uniq("fc")
		r := reservation(key, 0)
		txn, rec, err := e.f.Store.Reserve(e.ctx, r)
		if err != nil || txn == nil {
			t.Fatalf("round %d: Reserve of a free key: %v, %+v, %v", i, txn, rec, err)
		}
		if err := e.f.Effect(e.ctx, txn.Tx(), tag); err != nil {
			t.Fatalf("round %d: effect: %v", i, err)
		}
		ctx, cancel := context.WithCancel(e.ctx)
		if d < 0 {
			cancel()
		} else {
			time.AfterFunc(d, cancel)
		}
		var cerr error
		within(t, 10*time.Second, "Complete with an ending ctx", func() { cerr = txn.Complete(ctx, created(tag, 1)) })
		cancel()
		if cerr == nil {
			continue // it committed: CompleteInterrupted checks that case
		}
		start := time.Now()
		next, rec, err := e.reserveRetrying(other, key, leaseWake+time.Second)
		took := time.Since(start)
		switch {
		case errors.Is(err, idempotency.ErrInProgress) || (err == nil && next != nil && took > leaseWake):
			if next != nil {
				_ = next.Rollback(e.ctx)
			}
			t.Fatalf("round %d (ctx ended after %v): Complete failed (%v) and the key was still held %v later, want it free within %v",
				i, d, cerr, took, leaseWake)
		case err != nil:
			t.Fatalf("round %d: Reserve after a failed Complete: %v", i, err)
		case rec != nil:
			// The commit landed although Complete reported an error (a
			// lost reply): the answer must come with its effect.
			e.count(tag, 1, "a Complete whose reply was lost committed its answer")
		default:
			e.count(tag, 0, "a Complete that failed must commit nothing")
			if err := next.Rollback(e.ctx); err != nil {
				t.Fatalf("round %d: Rollback: %v", i, err)
			}
		}
	}
}

// retryingConflicts calls try as the core would: again, 5ms apart, for up
// to bound in all and while the case's context lives, while it reports a
// conflict to retry ([backend.ErrConflict], a serialization failure, which
// did nothing). try gets the deadline. It returns try's last error and how
// many conflicts were retried.
func (e *env[Tx]) retryingConflicts(bound time.Duration, try func(deadline time.Time) error) (retried int, err error) {
	deadline := time.Now().Add(bound)
	for {
		err = try(deadline)
		if !errors.Is(err, backend.ErrConflict) || !time.Now().Before(deadline) {
			return retried, err
		}
		select {
		case <-e.ctx.Done():
			return retried, err
		case <-time.After(5 * time.Millisecond):
		}
		retried++
	}
}

// reserveRetrying calls store.Reserve for key with wait as the core
// would: again, for up to wait in all, while it reports a conflict to retry
// ([backend.ErrConflict], a serialization failure).
func (e *env[Tx]) reserveRetrying(store idempotency.KeyStore[Tx], key idempotency.Key, wait time.Duration) (txn backend.Txn[Tx], rec *backend.Record, err error) {
	_, err = e.retryingConflicts(wait, func(deadline time.Time) (err error) {
		txn, rec, err = store.Reserve(e.ctx, reservation(key, max(time.Until(deadline), 0)))
		return err
	})
	return txn, rec, err
}
