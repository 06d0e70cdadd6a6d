package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// stepsReserveUnfinished: Reserve and Do report an unfinished key held,
// whether its lease lives or was released, and change nothing.
func (s *suite[Tx]) stepsReserveUnfinished(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	st := e.stepper()
	g := e.guard(&idempotency.Config{WaitTimeout: 300 * time.Millisecond})
	for _, released := range []bool{false, true} {
		key, tag := idempotency.Key{ID: uniq("unfinished")}, uniq("unfinished")
		what := "an unfinished key whose lease lives"
		p := e.phase(st, stepAcq(key, "owner-a"), "a new key")
		e.effect(p.Tx(), tag)
		var err error
		if released {
			what = "an unfinished key whose lease was released"
			err = p.Release(e.ctx, []byte("p1"))
		} else {
			err = p.Save(e.ctx, []byte("p1"))
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
			var (
				txn backend.Txn[Tx]
				rec *backend.Record
			)
			r := reservation(key, wait)
			r.Deadline = time.Now().Add(wait + heldBound)
			within(t, wait+10*time.Second, "Reserve of "+what, func() { txn, rec, err = e.f.Store.Reserve(e.ctx, r) })
			if txn != nil {
				_ = txn.Rollback(e.ctx)
			}
			if txn != nil || rec != nil || !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("Reserve (wait %v) of %s: got %v, %+v, %v; want ErrInProgress", wait, what, txn, rec, err)
			}
		}
		var resp idempotency.Response
		within(t, 10*time.Second, "Do of "+what, func() { resp, err = g.Do(e.ctx, key, "fp-start", mustNotRun[Tx]) })
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Do of %s: got %+v, %v; want ErrInProgress and fn not run", what, resp, err)
		}
		e.count(tag, 1, what)
		owner := "owner-a"
		if released {
			owner = "owner-b"
		}
		e.resumes(st, key, owner, []byte("p1"), btoi(released), what+", after Reserve and Do")
	}
}

// stepsPurgeSkipsUnfinished: years later, Purge deletes the expired
// records and no unfinished key, which is still held and resumable.
func (s *suite[Tx]) stepsPurgeSkipsUnfinished(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	st := e.stepper()
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	done := make([]idempotency.Key, 3)
	for i := range done {
		done[i] = idempotency.Key{ID: uniq("done")}
		e.executes(g, done[i], "done", "a new key")
	}
	live, released := idempotency.Key{ID: uniq("live")}, idempotency.Key{ID: uniq("released")}
	p := e.phase(st, stepAcq(live, "owner-a"), "a new key")
	if err := p.Save(e.ctx, []byte("live")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	p = e.phase(st, stepAcq(released, "owner-a"), "a new key")
	if err := p.Release(e.ctx, []byte("released")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	clk.Add(10 * 365 * 24 * time.Hour)
	want := len(done)
	if s.h.Features.SelfExpiring {
		want = 0
	}
	for i, w := range []int{want, 0} {
		var (
			n   int
			err error
		)
		within(t, 20*time.Second, "Purge", func() { n, err = e.f.Store.Purge(e.ctx, 100) })
		if err != nil || n != w {
			t.Fatalf("Purge %d, ten years on, with %d expired records and 2 unfinished keys: got %d, %v; want %d", i+1, len(done), n, err, w)
		}
	}
	ad, _ := e.f.Store.(backend.KeyAdmin)
	for _, k := range []idempotency.Key{live, released} {
		txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(k, 0))
		if txn != nil {
			_ = txn.Rollback(e.ctx)
		}
		if txn != nil || rec != nil || !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Reserve of an unfinished key ten years on: got %v, %+v, %v; want ErrInProgress", txn, rec, err)
		}
		if ad != nil {
			info, err := ad.Inspect(e.ctx, k, false)
			if err != nil || !isMaxExpiry(info.ExpiresAt) {
				t.Fatalf("Inspect of an unfinished key: got %+v, %v; want ExpiresAt MaxExpiry (%v)", info, err, backend.MaxExpiry())
			}
		}
	}
	e.resumes(st, live, "owner-b", []byte("live"), 0, "a saved key ten years on")
	e.resumes(st, released, "owner-b", []byte("released"), 1, "a released key ten years on")
	for _, k := range done {
		e.executes(g, k, "done", "a purged key")
	}
	e.count("done", 2*len(done), "purged keys count as new")
}

// isMaxExpiry reports whether t is MaxExpiry, kept to the millisecond
// (rounding down) or better.
func isMaxExpiry(t time.Time) bool {
	m := backend.MaxExpiry()
	return !t.After(m) && t.After(m.Add(-time.Millisecond))
}

// stepsAbandoned: Abandoned lists the unfinished keys whose lease ended at
// least Grace ago with fewer tries than MaxTries, longest ended first, up
// to Limit, with their fields exact; it takes no lease and waits for no
// open phase.
func (s *suite[Tx]) stepsAbandoned(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	st := e.stepper()
	t0 := clk.Now()
	type made struct {
		key   idempotency.Key
		fp    string
		prog  []byte
		tries int
		ended time.Time
	}
	released := func(id string, tries int) made {
		m := made{key: idempotency.Key{Scope: "abandoned/" + id, ID: uniq(id)}, fp: "fp-" + id, prog: append([]byte(id+":"), binProgress...), tries: tries}
		for i := range tries {
			a := stepAcq(m.key, fmt.Sprint("owner-", i))
			a.Fingerprint = m.fp
			p := e.phase(st, a, id)
			if err := p.Release(e.ctx, m.prog); err != nil {
				t.Fatalf("%s: Release: %v", id, err)
			}
		}
		m.ended = clk.Now()
		return m
	}
	k1 := released("k1", 1)
	clk.Add(time.Minute)
	k2 := released("k2", 1)
	clk.Add(time.Minute)
	k3 := released("k3", 2)
	k4 := made{key: idempotency.Key{ID: uniq("k4")}, fp: "fp-start", prog: []byte("k4"), ended: clk.Now().Add(10 * time.Minute)}
	a4 := stepAcq(k4.key, "owner-a")
	a4.Lease = 10 * time.Minute
	p := e.phase(st, a4, "k4")
	if err := p.Save(e.ctx, k4.prog); err != nil {
		t.Fatalf("k4: Save: %v", err)
	}
	e.executes(e.guard(nil), idempotency.Key{ID: uniq("k5")}, "k5", "a completed key")
	clk.Add(time.Minute)
	k6 := released("k6", 1)
	clk.Set(t0.Add(5 * time.Minute))

	list := func(q backend.AbandonedQuery, want []made, what string) {
		t.Helper()
		var (
			got []backend.AbandonedKey
			err error
		)
		within(t, heldBound+10*time.Second, "Abandoned", func() { got, err = st.Abandoned(e.ctx, q) })
		if err != nil {
			t.Fatalf("Abandoned(%+v), %s: %v", q, what, err)
		}
		ids := func() string {
			var b strings.Builder
			for _, k := range got {
				fmt.Fprintf(&b, "%v ", k.Key)
			}
			return b.String()
		}
		if len(got) != len(want) {
			t.Fatalf("Abandoned(%+v), %s: got %d keys (%s), want %d", q, what, len(got), ids(), len(want))
		}
		for i, w := range want {
			g := got[i]
			if g.Key != w.key || g.Fingerprint != w.fp || !bytes.Equal(g.Progress, w.prog) || g.Tries != w.tries || !g.LeaseEnded.Equal(w.ended) {
				t.Fatalf("Abandoned(%+v), %s: key %d is {%+q %q %s tries %d ended %v}, want {%+q %q %s tries %d ended %v} (longest ended first)",
					q, what, i, g.Key, g.Fingerprint, showBytes(g.Progress), g.Tries, g.LeaseEnded, w.key, w.fp, showBytes(w.prog), w.tries, w.ended)
			}
		}
	}
	all := backend.AbandonedQuery{MaxTries: 10, Limit: 1000}
	list(all, []made{k1, k2, k3, k6}, "at t0+5m")
	list(backend.AbandonedQuery{Grace: 3 * time.Minute, MaxTries: 10, Limit: 1000}, []made{k1, k2, k3}, "Grace 3m (k3 ended exactly 3m ago)")
	list(backend.AbandonedQuery{Grace: 3*time.Minute + time.Millisecond, MaxTries: 10, Limit: 1000}, []made{k1, k2}, "Grace 3m1ms")
	list(backend.AbandonedQuery{MaxTries: 2, Limit: 1000}, []made{k1, k2, k6}, "MaxTries 2 (k3 has 2)")
	list(backend.AbandonedQuery{MaxTries: 1, Limit: 1000}, nil, "MaxTries 1")
	list(backend.AbandonedQuery{MaxTries: 10, Limit: 2}, []made{k1, k2}, "Limit 2")
	list(backend.AbandonedQuery{MaxTries: 10, Limit: 1}, []made{k1}, "Limit 1")
	clk.Set(k4.ended)
	list(all, []made{k1, k2, k3, k6, k4}, "when k4's lease ran out, unreleased")

	// It took no lease: another owner takes k1 at once. While that phase is
	// open, Abandoned does not wait for it.
	p = e.phase(st, stepAcq(k1.key, "owner-z"), "k1 right after Abandoned listed it")
	var err error
	within(t, heldBound, "Abandoned while a phase is open", func() { _, err = st.Abandoned(e.ctx, all) })
	if err != nil {
		t.Fatalf("Abandoned while a phase is open: %v", err)
	}
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	list(all, []made{k1, k2, k3, k6, k4}, "after a phase of k1 rolled back")
}
