package idemhttp_test

import (
	"bytes"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

func testStoreDown[Tx any](t *testing.T, e env[Tx]) {
	var causes atomic.Int64
	s := startServer(t, e, nil, &idemhttp.Options{OnError: func(*http.Request, error) { causes.Add(1) }}, created)
	e.breakStore()
	res := s.post(t, `{}`, "down")
	wantProblem(t, res, http.StatusServiceUnavailable, idemhttp.ProblemStoreUnavailable)
	if res.header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	s.wantCalls(t, 0)
	if causes.Load() != 1 {
		t.Errorf("OnError called %d times, want 1", causes.Load())
	}
}

func testConcurrentSameKey[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	const n = 20
	results := make([]result, n)
	testkit.Together(n, func(i int) {
		results[i] = s.post(t, `{"amount":5}`, "together")
	})
	replayed := 0
	for i, r := range results {
		wantStatus(t, r, http.StatusCreated)
		if !bytes.Equal(r.body, results[0].body) {
			t.Errorf("response %d %q differs from %q", i, r.body, results[0].body)
		}
		if r.header.Get(idemhttp.HeaderReplayed) == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replays, want %d", replayed, n-1)
	}
	s.wantCalls(t, 1)
	s.wantEffects(t, "/together", 1)
}
