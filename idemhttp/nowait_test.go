package idemhttp_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestSQLiteNoWaitOtherTenant: on SQLite (one writer at a time) with
// NoWait, tenant B's new key meets the write lock that tenant A's running
// request holds. B used to be told "A request with this Idempotency-Key is
// in progress", which is false: no request with B's key exists. B now gets
// the truth: 503 store unavailable (the database is busy with another
// writer), with Retry-After, its handler not run, nothing stored; its
// retry after A finished runs once.
func TestSQLiteNoWaitOtherTenant(t *testing.T) {
	e := sqliteEnv(t)
	entered, release := make(chan struct{}), testkit.NewGate(t)
	var mu sync.Mutex
	var busy []error
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, &idemhttp.Options{
		Scope:   func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
		OnError: func(_ *http.Request, err error) { mu.Lock(); busy = append(busy, err); mu.Unlock() },
	}, func(n int64, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") == "A" {
			close(entered)
			<-release.Opened()
		}
		created(n, w, r)
	})
	t.Cleanup(release.Open) // runs before the server's Close, which waits for A
	done := make(chan result, 1)
	go func() { done <- s.do(t, "/things", `{}`, "Idempotency-Key", "a-1", "X-Tenant", "A") }()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("tenant A never reached its handler")
	}
	b := s.do(t, "/things", `{}`, "Idempotency-Key", "b-1", "X-Tenant", "B")
	release.Open()
	p := wantProblem(t, b, http.StatusServiceUnavailable, idemhttp.ProblemStoreUnavailable)
	if text := strings.ToLower(p.Title + " " + p.Detail); p.Type == idemhttp.ProblemInProgress || strings.Contains(text, "in progress") ||
		!strings.Contains(text, "busy") || !strings.Contains(text, "retry") {
		t.Errorf("tenant B was told %+v; want the truth: the store is busy, retry later with the same key", p)
	}
	if b.header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	mu.Lock()
	if len(busy) != 1 || !errors.Is(busy[0], idempotency.ErrStore) || errors.Is(busy[0], idempotency.ErrInProgress) {
		t.Errorf("OnError got %v; want one error wrapping idempotency.ErrStore, not ErrInProgress", busy)
	}
	mu.Unlock()
	wantStatus(t, <-done, http.StatusCreated)
	s.wantCalls(t, 1)
	s.wantEffects(t, "B/b-1", 0)
	// B's retry with the same key, once A is done, runs once.
	wantStatus(t, s.do(t, "/things", `{}`, "Idempotency-Key", "b-1", "X-Tenant", "B"), http.StatusCreated)
	s.wantEffects(t, "A/a-1", 1)
	s.wantEffects(t, "B/b-1", 1)
}
