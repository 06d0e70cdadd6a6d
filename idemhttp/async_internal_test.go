package idemhttp

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// TestAsyncStoredExpired: an expired record of another request counts as
// absent (a run of the new request replaces it), so Async does not answer
// 422 for a key whose old answer expired.
func TestAsyncStoredExpired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	s := memstore.New()
	s.Clock = func() time.Time { return time.Unix(0, now.Load()) }
	g, err := idempotency.New[*memstore.Tx](s, &idempotency.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	op := &idempotency.Operation[*memstore.Tx]{Name: "ship",
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: http.StatusCreated}, nil
		}}
	key := idempotency.Key{Scope: "acct", ID: "k1"}
	if _, err := g.Run(ctx, key, "fp-old", nil, op); err != nil {
		t.Fatal(err)
	}
	a := &asyncHandler[*memstore.Tx]{h: &handler[*memstore.Tx]{g: g}}
	if got := a.stored(ctx, key, "fp-new"); got != storedOther {
		t.Fatalf("a live record of another request: %v; want storedOther", got)
	}
	now.Add(int64(2 * time.Hour))
	if got := a.stored(ctx, key, "fp-new"); got != storedNone {
		t.Fatalf("an expired record of another request: %v; want storedNone", got)
	}
}
