package conformance

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// faultRig is one scenario's fixtures: a clean one on the server, a
// faulted one through the proxy, on one namespace.
type faultRig[Tx any] struct {
	ns     string
	clean  Fixture[Tx]
	faulty Fixture[Tx]
	proxy  *faultproxy.Proxy
	lab    *faultLabeler
	guard  *idempotency.Guard[Tx]
	key    idempotency.Key
}

func (s *faultSuite[Tx]) rig(t *testing.T) *faultRig[Tx] {
	t.Helper()
	ns := fmt.Sprintf("f%d%s", s.ns.Add(1), faultRand())
	r := &faultRig[Tx]{ns: ns, lab: newFaultLabeler(), key: idempotency.Key{Scope: "faults", ID: ns}}
	r.clean = s.h.NewFixture(t, s.h.Upstream, ns)
	p, err := faultproxy.New(s.h.Upstream, &faultproxy.Config{OnStep: r.lab.onStep})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r.proxy = p
	r.faulty = s.h.NewFixture(t, p.Addr(), ns)
	// Before the fixture's own clean-up: a driver closing a connection
	// that a fault left hanging may wait for the server's goodbye (pgx:
	// 15s); cut such connections first.
	t.Cleanup(p.CutAll)
	if r.clean.Store == nil || r.clean.Effect == nil || r.clean.Count == nil || r.faulty.Store == nil || r.faulty.Effect == nil {
		t.Fatal("conformance: fixture must set Store, Effect and Count")
	}
	g, err := idempotency.New[Tx](&phasedStore[Tx]{inner: r.faulty.Store, lab: r.lab}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.guard = g
	if !s.h.Cold {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var n atomic.Int64
		warm := idempotency.Key{Scope: "faults", ID: ns + "-warm"}
		if _, err := g.Do(ctx, warm, "fp", r.fn(ctx, r.faulty, &n, false, warm.ID)); err != nil {
			t.Fatalf("warm-up call: %v", err)
		}
	}
	return r
}

// fn returns a call's fn: one effect tagged tag, and an answer naming this
// execution (n counts executions of the key).
func (r *faultRig[Tx]) fn(ctx context.Context, f Fixture[Tx], n *atomic.Int64, phased bool, tag string) func(Tx) (idempotency.Response, error) {
	return func(tx Tx) (idempotency.Response, error) {
		if phased {
			r.lab.set(phaseFn)
			defer r.lab.set("")
		}
		exec := n.Add(1)
		if err := f.Effect(ctx, tx, tag); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Location": {"/faults/" + r.ns}},
			Body:   []byte(`{"key":"` + tag + `","execution":` + strconv.FormatInt(exec, 10) + `}`),
		}, nil
	}
}

// trace runs one call through the proxy without a fault and returns its
// steps.
func (s *faultSuite[Tx]) trace(t *testing.T) []faultStep {
	r := s.rig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.lab.reset()
	var n atomic.Int64
	resp, err := r.guard.Do(ctx, r.key, "fp", r.fn(ctx, r.faulty, &n, true, r.ns))
	if err != nil {
		t.Fatalf("the traced call failed: %v", err)
	}
	if resp.Replayed {
		t.Fatal("the traced call replayed a new key")
	}
	if got, err := r.clean.Count(ctx, r.ns); err != nil || got != 1 {
		t.Fatalf("the traced call: %d effects (%v), want 1", got, err)
	}
	plan := r.lab.steps()
	for i, st := range plan {
		t.Logf("step %d: %-12s %q", i+1, st.label, st.head)
	}
	return plan
}
