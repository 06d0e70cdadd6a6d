package idempotency_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestSealedMarkFailsClosed: a Guard without a Codec, reading a record a
// Guard with one stored, fails with ErrCodec and never runs fn; an answer
// of fn that carries the reserved mark itself is refused, its writes
// rolled back.
func TestSealedMarkFailsClosed(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	s := memstore.New()
	sealedG := newGuard(t, s, &idempotency.Config{Codec: &reverser{}})
	plainG := newGuard(t, s, nil)
	fn := func(tx *memstore.Tx) (idempotency.Response, error) {
		tx.Effect("pay")
		return idempotency.Response{Status: 201, Body: []byte("paid")}, nil
	}
	key := idempotency.Key{Scope: "t", ID: "k"}
	if _, err := sealedG.Do(ctx, key, "fp", fn); err != nil {
		t.Fatal(err)
	}
	resp, err := plainG.Do(ctx, key, "fp", fn)
	if !errors.Is(err, idempotency.ErrCodec) || errors.Is(err, idempotency.ErrStore) || resp.Body != nil {
		t.Fatalf("Do without the Codec: %q, %v; want ErrCodec", resp.Body, err)
	}
	if info, err := plainG.Inspect(ctx, key, true); err != nil || !info.Sealed || info.Body != nil {
		t.Errorf("Inspect without the Codec: %+v, %v; want it sealed, without the sealed bytes", info, err)
	}
	if n := s.Count("pay"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}

	forged := idempotency.Key{Scope: "t", ID: "forged"}
	_, err = plainG.Do(ctx, forged, "fp", func(tx *memstore.Tx) (idempotency.Response, error) {
		tx.Effect("forged")
		return idempotency.Response{Status: 200, Header: http.Header{":sealed": {"1"}}}, nil
	})
	if !errors.Is(err, idempotency.ErrInvalidResponse) {
		t.Errorf("an answer with the reserved header: %v, want ErrInvalidResponse", err)
	}
	if n := s.Count("forged"); n != 0 {
		t.Errorf("the refused answer's writes committed (%d)", n)
	}
	if _, err := plainG.Inspect(ctx, forged, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("the refused answer left a record: %v", err)
	}
}
