package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/cardstub"
)

// The cases of this file run [idempotency.Guard.Run] (multi-step
// operations) on a store that implements [backend.Stepper]: the
// guarantees users rely on, end to end, over the primitives the cases of
// cases_steps.go check one by one.

// checkoutOp is an operation of a Local step, a Foreign call to p and
// another Local step, then Finish; each local phase commits an effect
// tagged tag plus the phase's name.
func (e *env[Tx]) checkoutOp(p *cardstub.Processor, tag string) *idempotency.Operation[Tx] {
	return &idempotency.Operation[Tx]{
		Name: "checkout",
		Steps: []idempotency.Step[Tx]{
			{Name: "order", Local: func(ctx context.Context, tx Tx, s *idempotency.State) error {
				return e.f.Effect(ctx, tx, tag+"-order")
			}},
			{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
				id, err := p.Charge(s.Key().Derive("charge"))
				s.Set("charge", id)
				return err
			}},
			{Name: "receipt", Local: func(ctx context.Context, tx Tx, s *idempotency.State) error {
				return e.f.Effect(ctx, tx, tag+"-receipt-"+s.Get("charge"))
			}},
		},
		Finish: func(ctx context.Context, tx Tx, s *idempotency.State) (idempotency.Response, error) {
			if err := e.f.Effect(ctx, tx, tag+"-email"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/" + s.Get("charge")}},
				Body: []byte(`{"charge":"` + s.Get("charge") + `","input":"` + string(s.Input()) + `"}`)}, nil
		},
		Lease: 5 * time.Second,
	}
}

// oneCheckout fails the case unless tag's operation committed exactly one
// set of rows for charge.
func (e *env[Tx]) oneCheckout(tag, charge, contract string) {
	e.t.Helper()
	e.count(tag+"-order", 1, contract)
	e.count(tag+"-receipt-"+charge, 1, contract)
	e.count(tag+"-email", 1, contract)
}

// operationConcurrentSameKey: 20 callers of one operation's key over
// several Guards and store instances: one charge, one set of rows, 20
// identical answers; another fingerprint is refused.
func (s *suite[Tx]) operationConcurrentSameKey(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	e.stepper()
	gs := e.guards(4, nil)
	p := cardstub.New()
	tag := uniq("op")
	op := e.checkoutOp(p, tag)
	key := idempotency.Key{Scope: "client-1", ID: uniq("k")}
	rs := fire(t, Callers, func(i int) (idempotency.Response, error) {
		return gs[i%len(gs)].Run(e.ctx, key, "fp", []byte("100"), op)
	})
	var first idempotency.Response
	for i, r := range rs {
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if i == 0 {
			first = r.resp
		}
		if !sameResponse(r.resp, first) {
			t.Fatalf("caller %d got %+v, caller 0 %+v: 20 callers must get one answer", i, r.resp, first)
		}
	}
	if string(first.Body) != `{"charge":"ch_1","input":"100"}` {
		t.Fatalf("answer %q", first.Body)
	}
	if p.Charges() != 1 {
		t.Fatalf("the processor charged %d times; want 1", p.Charges())
	}
	e.oneCheckout(tag, "ch_1", "20 concurrent runs of one operation")
	if _, err := gs[0].Run(e.ctx, key, "other", nil, op); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another fingerprint: %v; want ErrMismatch", err)
	}
}

// operationResumes: a Foreign step's failure leaves the key unfinished at
// that step; a retry on another instance of the store resumes there: the
// committed step does not run again, the call is repeated with the same
// derived key, and the answer is stored once.
func (s *suite[Tx]) operationResumes(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	e.stepper()
	stores := e.instances(2)
	g1, g2 := e.guardOn(stores[0], nil), e.guardOn(stores[len(stores)-1], nil)
	p := cardstub.New()
	p.Fail.Store(1)
	tag := uniq("op")
	op := e.checkoutOp(p, tag)
	key := idempotency.Key{ID: uniq("k")}
	if _, err := g1.Run(e.ctx, key, "fp", []byte("7"), op); !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(err, cardstub.ErrDown) {
		t.Fatalf("first run: %v; want ErrUnfinished wrapping the step's error", err)
	}
	e.count(tag+"-order", 1, "a committed step stays committed after a later step fails")
	if _, err := g1.Do(e.ctx, key, "fp", e.effectFn(tag+"-do", new(atomic.Int64))); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("Do on an unfinished key: %v; want ErrInProgress", err)
	}
	resp, err := g2.Run(e.ctx, key, "fp", []byte("ignored"), op)
	if err != nil || string(resp.Body) != `{"charge":"ch_1","input":"7"}` {
		t.Fatalf("retry: %+v, %v", resp, err)
	}
	again, err := g1.Run(e.ctx, key, "fp", nil, op)
	if err != nil || !again.Replayed || !sameResponse(again, resp) {
		t.Fatalf("replay: %+v, %v", again, err)
	}
	e.oneCheckout(tag, "ch_1", "a resumed operation")
	e.count(tag+"-do", 0, "Do on an unfinished key runs nothing")
	if p.Charges() != 1 || p.Calls.Load() != 2 {
		t.Fatalf("charges %d, calls %d; want 1 and 2", p.Charges(), p.Calls.Load())
	}
}

// operationDurable: a Durable operation's new key is committed before its
// first step: when that step fails, the key is unfinished at it, with the
// input saved and nothing of the step written, and a retry on another
// instance of the store resumes it with the saved input.
func (s *suite[Tx]) operationDurable(t *testing.T) {
	s.need(t, "Stepper")
	e := s.setup(t, Options{})
	e.stepper()
	stores := e.instances(2)
	g1, g2 := e.guardOn(stores[0], nil), e.guardOn(stores[len(stores)-1], nil)
	p := cardstub.New()
	tag := uniq("op")
	op := e.checkoutOp(p, tag)
	op.Durable = true
	failing := *op
	failing.Steps = append([]idempotency.Step[Tx](nil), op.Steps...)
	errFirst := errors.New("the first step failed")
	failing.Steps[0].Local = func(ctx context.Context, tx Tx, _ *idempotency.State) error {
		if err := e.f.Effect(ctx, tx, tag+"-order"); err != nil {
			return err
		}
		return errFirst // rolls the effect back
	}
	key := idempotency.Key{ID: uniq("k")}
	if _, err := g1.Run(e.ctx, key, "fp", []byte("7"), &failing); !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(err, errFirst) {
		t.Fatalf("first run: %v; want ErrUnfinished wrapping the step's error", err)
	}
	e.count(tag+"-order", 0, "a failed first step commits none of its writes")
	if info, err := g1.Inspect(e.ctx, key, false); err == nil {
		if info.State != idempotency.KeyUnfinished || info.Step != "order" || info.Tries != 1 {
			t.Fatalf("the key after a Durable run's first step failed: %+v; want unfinished at order, 1 try", info)
		}
	} else if !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Inspect: %v", err)
	}
	resp, err := g2.Run(e.ctx, key, "fp", []byte("ignored"), op)
	if err != nil || string(resp.Body) != `{"charge":"ch_1","input":"7"}` {
		t.Fatalf("retry: %+v, %v; want the saved input 7", resp, err)
	}
	e.oneCheckout(tag, "ch_1", "a Durable operation resumed at its first step")
}

// operationLease: a run that died inside a Foreign call holds the key
// until its lease ends by the store's clock; then a retry takes it over
// and finishes it; Purge meanwhile never deletes it.
func (s *suite[Tx]) operationLease(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	e.stepper()
	g := e.guard(&idempotency.Config{WaitTimeout: -1})
	p := cardstub.New()
	tag := uniq("op")
	op := e.checkoutOp(p, tag)
	dying := *op
	dying.Steps = append([]idempotency.Step[Tx](nil), op.Steps...)
	died := errors.New("killed")
	dying.Steps[1].Foreign = func(ctx context.Context, s *idempotency.State) error {
		if _, err := p.Charge(s.Key().Derive("charge")); err != nil {
			return err
		}
		panic(died)
	}
	key := idempotency.Key{ID: uniq("k")}
	func() {
		defer func() {
			if r := recover(); r != died {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = g.Run(e.ctx, key, "fp", []byte("5"), &dying)
	}()
	if _, err := g.Run(e.ctx, key, "fp", nil, op); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("retry within the lease: %v; want ErrInProgress", err)
	}
	clk.Add(100 * 365 * 24 * time.Hour)
	if _, err := g.Purge(e.ctx); err != nil {
		t.Fatalf("Purge: %v", err)
	}
	resp, err := g.Run(e.ctx, key, "fp", nil, op)
	if err != nil || string(resp.Body) != `{"charge":"ch_1","input":"5"}` {
		t.Fatalf("retry after the lease: %+v, %v", resp, err)
	}
	e.oneCheckout(tag, "ch_1", "an operation taken over after its lease ended")
	if p.Charges() != 1 || p.Calls.Load() != 2 {
		t.Fatalf("charges %d, calls %d; want 1 and 2", p.Charges(), p.Calls.Load())
	}
}

// operationCompleter: keys left unfinished are finished by a Completer
// once their grace has passed, each once, and a Completer of another
// instance finds nothing left.
func (s *suite[Tx]) operationCompleter(t *testing.T) {
	s.need(t, "Stepper")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	e.stepper()
	g := e.guard(nil)
	p := cardstub.New()
	tag := uniq("op")
	op := e.checkoutOp(p, tag)
	const n = 5
	p.Fail.Store(n)
	for i := range n {
		if _, err := g.Run(e.ctx, idempotency.Key{ID: fmt.Sprintf("%s-%d", tag, i)}, "fp", []byte(fmt.Sprint(i)), op); !errors.Is(err, idempotency.ErrUnfinished) {
			t.Fatalf("run %d: %v; want ErrUnfinished", i, err)
		}
	}
	c, err := idempotency.NewCompleter(g, &idempotency.CompleterConfig{Grace: time.Minute, Batch: 3}, op)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := c.Once(e.ctx); err != nil || rep.Listed != 0 {
		t.Fatalf("within the grace: %+v, %v; want nothing listed", rep, err)
	}
	clk.Add(time.Minute)
	for pass, want := range []int{3, 2, 0} {
		rep, err := c.Once(e.ctx)
		if err != nil || rep.Listed != want || rep.Finished != want {
			t.Fatalf("pass %d: %+v, %v; want %d listed and finished", pass, rep, err, want)
		}
	}
	if p.Charges() != n {
		t.Fatalf("charges %d; want %d", p.Charges(), n)
	}
	e.count(tag+"-order", n, "every abandoned operation's first step ran once")
	e.count(tag+"-email", n, "every abandoned operation finished once")
	for i := range n {
		e.count(fmt.Sprintf("%s-receipt-ch_%d", tag, i+1), 1, "one receipt per charge")
	}
}
