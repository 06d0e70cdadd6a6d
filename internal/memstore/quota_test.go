package memstore_test

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

func TestQuotaCounter(t *testing.T) {
	s := memstore.New()
	g, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	testkit.QuotaCounter(t, testkit.QuotaRig{A: s, B: s, Complete: func(ctx context.Context, key idempotency.Key) error {
		_, err := g.Do(ctx, key, "fp", func(*memstore.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		})
		return err
	}})
}
