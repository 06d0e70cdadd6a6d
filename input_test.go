package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestRunValidateStoresNothing: an input the operation's Validate refuses
// returns ErrInvalidInput (an *inputError holding Validate's error) with
// nothing stored and no step run, so the corrected input with the same
// key runs. Refused in the first step with a Stop(400), the key stored
// the 400 and the corrected retry got ErrMismatch.
func TestRunValidateStoresNothing(t *testing.T) {
	ctx := testkit.Context(t, 5*time.Second)
	s := memstore.New()
	g, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	errAmount := errors.New("amount must be positive")
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "pay",
		Validate: func(_ context.Context, input []byte) error {
			if string(input) == `{"amount":0}` {
				return errAmount
			}
			return nil
		},
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "charge", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error {
			tx.Effect("charge")
			return nil
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"paid":true}`)}, nil
		},
		Durable: true, // would commit the key before the first step
	}
	key := idempotency.Key{Scope: "acct", ID: "k1"}
	_, err = g.Run(ctx, key, "fp-bad", []byte(`{"amount":0}`), op)
	if !errors.Is(err, idempotency.ErrInvalidInput) || !errors.Is(err, errAmount) {
		t.Fatalf("Run with a bad input: %v; want ErrInvalidInput wrapping Validate's error", err)
	}
	if err.Error() != `idempotency: operation "pay": invalid input: amount must be positive` {
		t.Fatalf("text %q", err)
	}
	if _, err := g.Inspect(ctx, key, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the key after the refusal: %v; want ErrNotFound (nothing stored)", err)
	}
	resp, err := g.Run(ctx, key, "fp-good", []byte(`{"amount":5}`), op)
	if err != nil || resp.Status != http.StatusCreated || s.Count("charge") != 1 {
		t.Fatalf("the corrected input with the same key: %+v, %v, %d charges; want 201 and 1", resp, err, s.Count("charge"))
	}
}
