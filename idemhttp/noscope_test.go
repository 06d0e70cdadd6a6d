package idemhttp_test

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/observe"
)

// testNoScope: client B sends client A's key and body. Mounted without a
// Scope, the middleware must never answer B with A's stored response: it
// refuses both with 500 before the handler runs. With SharedScope, the
// single-tenant choice made in code, B gets A's answer, on purpose.
func testNoScope[Tx any](t *testing.T, e env[Tx]) {
	const body = `{"amount":100,"to":"acct-of-a"}`
	type mounting struct {
		name string
		opts func(*idemhttp.Options) *idemhttp.Options // the observer and OnError to add
	}
	for _, m := range []mounting{
		{"nil", func(*idemhttp.Options) *idemhttp.Options { return nil }},
		{"empty", func(*idemhttp.Options) *idemhttp.Options { return &idemhttp.Options{} }},
		{"observed", func(o *idemhttp.Options) *idemhttp.Options { return o }},
		{"KeyOptional", func(o *idemhttp.Options) *idemhttp.Options { o.KeyOptional = true; return o }},
	} {
		t.Run(m.name, func(t *testing.T) {
			rc := &recorded{}
			var mu sync.Mutex
			var reported []error
			o := &idemhttp.Options{Observer: rc.observe, OnError: func(_ *http.Request, err error) {
				mu.Lock()
				reported = append(reported, err)
				mu.Unlock()
			}}
			opts := m.opts(o)
			if err := opts.Validate(); !errors.Is(err, idemhttp.ErrNoScope) {
				t.Errorf("Validate() = %v, want ErrNoScope", err)
			}
			s := mount(t, e, nil, opts, created)
			key := "shared-" + m.name
			a := s.do(t, "/things", body, idemhttp.DefaultKeyHeader, key, "X-Account", "alice")
			b := s.do(t, "/things", body, idemhttp.DefaultKeyHeader, key, "X-Account", "bob")
			for _, r := range []struct {
				who string
				res result
			}{{"A", a}, {"B", b}} {
				who, res := r.who, r.res
				if res.status == http.StatusCreated || res.header.Get(idemhttp.HeaderReplayed) != "" {
					t.Errorf("%s got %d %s (%s=%q): a mounting without Scope answered from the shared key space",
						who, res.status, res.body, idemhttp.HeaderReplayed, res.header.Get(idemhttp.HeaderReplayed))
				}
				wantProblem(t, res, http.StatusInternalServerError, idemhttp.ProblemInternal)
			}
			if bytes.Equal(a.body, b.body) && a.status == http.StatusCreated {
				t.Error("B got A's answer")
			}
			// No key at all is refused too (KeyOptional included): the
			// misconfiguration shows on the first request.
			wantProblem(t, s.post(t, body), http.StatusInternalServerError, idemhttp.ProblemInternal)
			// An unguarded method passes, as with a nil guard.
			if res := s.send(t, http.MethodGet, "/things", "", ""); res.status != http.StatusTeapot {
				t.Errorf("GET: %d, want the handler's 418", res.status)
			}
			s.wantCalls(t, 1) // the GET
			s.wantEffects(t, "/"+key, 0)
			s.wantEffects(t, "alice/"+key, 0)
			s.wantEffects(t, "bob/"+key, 0)
			if opts == nil || opts.Observer == nil {
				return
			}
			ev := rc.last(t)
			if ev.Outcome != observe.Internal || ev.Status != http.StatusInternalServerError || !errors.Is(ev.Err, idemhttp.ErrNoScope) {
				t.Errorf("event %+v; want internal, 500, ErrNoScope", ev)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) != 1 || !errors.Is(reported[0], idemhttp.ErrNoScope) {
				t.Errorf("OnError got %v; want ErrNoScope once for the three refusals", reported)
			}
		})
	}

	t.Run("SharedScope", func(t *testing.T) {
		opts := &idemhttp.Options{Scope: idemhttp.SharedScope}
		if err := opts.Validate(); err != nil {
			t.Errorf("Validate() = %v, want nil", err)
		}
		s := mount(t, e, nil, opts, created)
		a := s.do(t, "/things", body, idemhttp.DefaultKeyHeader, "one-tenant", "X-Account", "alice")
		wantStatus(t, a, http.StatusCreated)
		b := s.do(t, "/things", body, idemhttp.DefaultKeyHeader, "one-tenant", "X-Account", "bob")
		wantReplay(t, a, b) // one key space, chosen in code
		s.wantCalls(t, 1)
		s.wantEffects(t, "/one-tenant", 1)
	})
}
