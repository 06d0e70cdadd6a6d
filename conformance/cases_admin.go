package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// The Admin cases check key administration ([backend.KeyAdmin],
// [backend.KeyLister]) on a store that implements it; on any other
// store they are skipped, naming the interface. The parts about
// unfinished keys run only on a store that is also an
// [backend.Stepper].

// admin returns the fixture's store as a KeyAdmin, or skips the case.
func (e *env[Tx]) admin() backend.KeyAdmin {
	e.t.Helper()
	ad, ok := e.f.Store.(backend.KeyAdmin)
	if !ok {
		e.lacking("KeyAdmin")
	}
	return ad
}

// inspect calls Inspect, failing the case if it takes longer than
// heldBound: it takes no lock and waits for none.
func (e *env[Tx]) inspect(ad backend.KeyAdmin, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	e.t.Helper()
	var (
		info *backend.KeyInfo
		err  error
	)
	within(e.t, heldBound, "Inspect (it waits for nothing)", func() { info, err = ad.Inspect(e.ctx, key, body) })
	return info, err
}

// forget calls Forget, failing the case if it takes longer than heldBound:
// it never waits.
func (e *env[Tx]) forget(ad backend.KeyAdmin, key idempotency.Key) (*backend.KeyInfo, error) {
	e.t.Helper()
	var (
		info *backend.KeyInfo
		err  error
	)
	within(e.t, heldBound, "Forget (it never waits)", func() { info, err = ad.Forget(e.ctx, key) })
	return info, err
}

// adminResp is the answer the Admin cases store: binary body, header
// values in order.
func adminResp(body int) idempotency.Response {
	b := bytes.Repeat(binProgress, body/len(binProgress)+1)[:body]
	return idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/octet-stream"}, "X-Admin": {"\xff\x00one", "two"}},
		Body:   b,
	}
}

// complete runs Do on key with an effect tagged tag answering resp.
func (e *env[Tx]) complete(g *idempotency.Guard[Tx], key idempotency.Key, tag string, resp idempotency.Response) {
	e.t.Helper()
	r, err := g.Do(e.ctx, key, "fp-admin", func(tx Tx) (idempotency.Response, error) {
		if err := e.f.Effect(e.ctx, tx, tag); err != nil {
			return idempotency.Response{}, err
		}
		return resp, nil
	})
	if err != nil || r.Replayed {
		e.t.Fatalf("Do of a new key: got %+v, %v; want fn run", r, err)
	}
}

// checkAnswer fails the case unless info describes key completed (or
// expired) with resp at created, expiring at expires; with its body only
// if body.
func (e *env[Tx]) checkAnswer(info *backend.KeyInfo, key idempotency.Key, state backend.KeyState, resp idempotency.Response, body bool, created, expires time.Time, what string) {
	e.t.Helper()
	switch {
	case info == nil:
		e.t.Fatalf("%s: nil KeyInfo", what)
	case info.Key != key || info.State != state || info.Fingerprint != "fp-admin":
		e.t.Fatalf("%s: key %v, state %v, fingerprint %q; want %v, %v, %q", what, info.Key, info.State, info.Fingerprint, key, state, "fp-admin")
	case info.Status != resp.Status || !headerEqual(info.Header, resp.Header) || info.BodyLen != len(resp.Body):
		e.t.Fatalf("%s: status %d, header %v, BodyLen %d; want %d, %v, %d", what, info.Status, info.Header, info.BodyLen, resp.Status, resp.Header, len(resp.Body))
	case body && !bytes.Equal(info.Body, resp.Body):
		e.t.Fatalf("%s, asked for its body: Body %s, want %s byte-exact", what, showBytes(info.Body), showBytes(resp.Body))
	case !body && len(info.Body) != 0:
		e.t.Fatalf("%s, not asked for its body: Body %s, want none", what, showBytes(info.Body))
	case !info.CreatedAt.Equal(created) || !info.ExpiresAt.Equal(expires):
		e.t.Fatalf("%s: CreatedAt %v, ExpiresAt %v; want %v, %v (the store's clock)", what, info.CreatedAt, info.ExpiresAt, created, expires)
	case info.Progress != nil || info.Tries != 0:
		e.t.Fatalf("%s: Progress %s, Tries %d; want none", what, showBytes(info.Progress), info.Tries)
	}
}

// checkOp fails the case unless info describes an unfinished operation's
// key in state, with progress, tries and the lease's end.
func (e *env[Tx]) checkOp(info *backend.KeyInfo, key idempotency.Key, state backend.KeyState, progress []byte, tries int, created, leaseEnds time.Time, what string) {
	e.t.Helper()
	switch {
	case info == nil:
		e.t.Fatalf("%s: nil KeyInfo", what)
	case info.Key != key || info.State != state || info.Fingerprint != "fp-start":
		e.t.Fatalf("%s: key %v, state %v, fingerprint %q; want %v, %v, %q", what, info.Key, info.State, info.Fingerprint, key, state, "fp-start")
	case !bytes.Equal(info.Progress, progress) || info.Tries != tries:
		e.t.Fatalf("%s: Progress %s, Tries %d; want %s, %d", what, showBytes(info.Progress), info.Tries, showBytes(progress), tries)
	case !info.CreatedAt.Equal(created) || !isMaxExpiry(info.ExpiresAt) || !info.LeaseEnds.Equal(leaseEnds):
		e.t.Fatalf("%s: CreatedAt %v, ExpiresAt %v, LeaseEnds %v; want %v, MaxExpiry, %v", what, info.CreatedAt, info.ExpiresAt, info.LeaseEnds, created, leaseEnds)
	case info.Status != 0 || info.BodyLen != 0 || len(info.Body) != 0:
		e.t.Fatalf("%s: status %d, BodyLen %d: an unfinished key has no answer", what, info.Status, info.BodyLen)
	}
}

// adminInspect: Inspect of a completed key (its body only when asked),
// an expired one, a held one, an unfinished one and an absent one.
func (s *suite[Tx]) adminInspect(t *testing.T) {
	s.need(t, "KeyAdmin")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	ad := e.admin()
	t0 := clk.Now()
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	key, resp := idempotency.Key{Scope: "inspect", ID: uniq("done")}, adminResp(1000)
	e.complete(g, key, "done", resp)
	for _, body := range []bool{false, true} {
		info, err := e.inspect(ad, key, body)
		if err != nil {
			t.Fatalf("Inspect(body %v) of a completed key: %v", body, err)
		}
		e.checkAnswer(info, key, backend.KeyCompleted, resp, body, t0, t0.Add(time.Hour), fmt.Sprintf("Inspect(body %v) of a completed key", body))
	}
	for _, k := range []idempotency.Key{{Scope: "inspect", ID: uniq("absent")}, {Scope: "Inspect", ID: key.ID}, {ID: key.ID}} {
		if info, err := e.inspect(ad, k, true); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Inspect of a key with no record (%+q): got %+v, %v; want ErrNotFound", k, info, err)
		}
	}

	// A new key held by an open Reserve: held, or not found on a store
	// that cannot tell without waiting.
	held := idempotency.Key{ID: uniq("held")}
	txn, _, err := e.f.Store.Reserve(e.ctx, reservation(held, 0))
	if err != nil || txn == nil {
		t.Fatalf("Reserve of a new key: %v, %v", txn, err)
	}
	info, err := e.inspect(ad, held, false)
	if err == nil && (info == nil || info.State != backend.KeyInProgress || info.Key != held) {
		t.Fatalf("Inspect of a new key held by an open Reserve: got %+v; want KeyInProgress (or ErrNotFound)", info)
	} else if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Inspect of a new key held by an open Reserve: got %v; want KeyInProgress (or ErrNotFound)", err)
	}
	if err := txn.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}

	if st, ok := e.f.Store.(backend.Stepper[Tx]); ok {
		op := idempotency.Key{ID: uniq("op")}
		p := e.phase(st, stepAcq(op, "owner-a"), "a new key")
		if err := p.Save(e.ctx, binProgress); err != nil {
			t.Fatalf("Save: %v", err)
		}
		info, err := e.inspect(ad, op, true)
		if err != nil {
			t.Fatalf("Inspect of a key whose lease lives: %v", err)
		}
		e.checkOp(info, op, backend.KeyInProgress, binProgress, 0, t0, t0.Add(stepLease), "Inspect of a key whose lease lives")
		clk.Add(stepLease)
		info, err = e.inspect(ad, op, false)
		if err != nil {
			t.Fatalf("Inspect of a key whose lease ran out: %v", err)
		}
		e.checkOp(info, op, backend.KeyUnfinished, binProgress, 0, t0, t0.Add(stepLease), "Inspect of a key whose lease ran out")
		p = e.phase(st, stepAcq(op, "owner-b"), "another owner")
		if err := p.Release(e.ctx, []byte("p2")); err != nil {
			t.Fatalf("Release: %v", err)
		}
		info, err = e.inspect(ad, op, false)
		if err != nil {
			t.Fatalf("Inspect of a released key: %v", err)
		}
		e.checkOp(info, op, backend.KeyUnfinished, []byte("p2"), 1, t0, clk.Now(), "Inspect of a released key")
	}

	clk.Set(t0.Add(time.Hour))
	info, err = e.inspect(ad, key, true)
	switch {
	case errors.Is(err, idempotency.ErrNotFound) && s.h.Features.SelfExpiring:
		// Already gone by itself.
	case err != nil:
		t.Fatalf("Inspect of an expired key: %v", err)
	default:
		e.checkAnswer(info, key, backend.KeyExpired, resp, true, t0, t0.Add(time.Hour), "Inspect of a key expired by the store's clock")
	}
}

// adminForget: Forget refuses a held key at once and changes nothing,
// deletes a completed one (returning it without its body) and an
// unfinished one whose lease ended, and reports an absent one.
func (s *suite[Tx]) adminForget(t *testing.T) {
	s.need(t, "KeyAdmin")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	ad := e.admin()
	t0 := clk.Now()
	g := e.guard(&idempotency.Config{TTL: time.Hour})
	if info, err := e.forget(ad, idempotency.Key{ID: uniq("absent")}); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Forget of a key with no record: got %+v, %v; want ErrNotFound", info, err)
	}

	key, tag, resp := idempotency.Key{Scope: "forget", ID: uniq("done")}, uniq("done"), adminResp(300)
	e.complete(g, key, tag, resp)
	info, err := e.forget(ad, key)
	if err != nil {
		t.Fatalf("Forget of a completed key: %v", err)
	}
	e.checkAnswer(info, key, backend.KeyCompleted, resp, false, t0, t0.Add(time.Hour), "what Forget of a completed key returned")
	if info, err := e.inspect(ad, key, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Inspect of a forgotten key: got %+v, %v; want ErrNotFound", info, err)
	}
	if info, err := e.forget(ad, key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Forget of a forgotten key: got %+v, %v; want ErrNotFound", info, err)
	}
	e.complete(g, key, tag, resp)
	e.count(tag, 2, "Do runs fn again on a forgotten key")

	// Held by an open Reserve: a new key, and an expired one taken over.
	expired, tagExp := idempotency.Key{ID: uniq("expired")}, uniq("expired")
	e.complete(g, expired, tagExp, resp)
	clk.Add(time.Hour)
	for _, k := range []idempotency.Key{{ID: uniq("new")}, expired} {
		tagK := uniq("held")
		txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(k, 0))
		if err != nil || txn == nil {
			t.Fatalf("Reserve of a free key: %v, %+v, %v", txn, rec, err)
		}
		e.effect(txn.Tx(), tagK)
		info, err := e.forget(ad, k)
		if !errors.Is(err, idempotency.ErrInProgress) {
			_ = txn.Rollback(e.ctx)
			t.Fatalf("Forget of a key held by an open Reserve: got %+v, %v; want ErrInProgress at once", info, err)
		}
		want := created(tagK, 1)
		if err := txn.Complete(e.ctx, want); err != nil {
			t.Fatalf("Complete of a Reserve that Forget refused to touch: %v", err)
		}
		e.count(tagK, 1, "the holder's effect")
		e.replays(g, k, want, "a key Forget refused while it was held")
	}

	st, ok := e.f.Store.(backend.Stepper[Tx])
	if !ok {
		return
	}
	op := idempotency.Key{ID: uniq("op")}
	p := e.phase(st, stepAcq(op, "owner-a"), "a new key")
	began := clk.Now()
	if err := p.Save(e.ctx, []byte("p1")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if info, err := e.forget(ad, op); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("Forget of a key whose lease lives: got %+v, %v; want ErrInProgress at once", info, err)
	}
	e.resumes(st, op, "owner-a", []byte("p1"), 0, "a key Forget refused while its lease lived")
	clk.Add(stepLease) // the lease ended
	p = e.phase(st, stepAcq(op, "owner-b"), "another owner")
	if info, err := e.forget(ad, op); !errors.Is(err, idempotency.ErrInProgress) {
		_ = p.Rollback(e.ctx)
		t.Fatalf("Forget of a key held by an open phase: got %+v, %v; want ErrInProgress at once", info, err)
	}
	if err := p.Release(e.ctx, []byte("p2")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	info, err = e.forget(ad, op)
	if err != nil {
		t.Fatalf("Forget of an unfinished key whose lease ended: %v", err)
	}
	e.checkOp(info, op, backend.KeyUnfinished, []byte("p2"), 1, began, clk.Now(), "what Forget of an unfinished key returned")
	p = e.phase(st, stepAcq(op, "owner-c"), "a forgotten unfinished key")
	e.checkPhase(p, nil, "fp-start", 0, "a forgotten unfinished key: its operation is not resumed")
	if err := p.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	txn, rec, err := e.f.Store.Reserve(e.ctx, reservation(op, 0))
	if err != nil || txn == nil {
		t.Fatalf("Reserve of a forgotten unfinished key: %v, %+v, %v; want the key", txn, rec, err)
	}
	if err := txn.Rollback(e.ctx); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
}
