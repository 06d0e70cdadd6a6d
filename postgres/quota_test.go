package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestQuotaCounter runs the counter cases over two Stores, each with a pool
// of its own, on one table.
func TestQuotaCounter(t *testing.T) {
	f := newFixture(t, newPool(t, 8), postgres.Config{})
	other, err := postgres.New(newPool(t, 8), &postgres.Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	g := f.guard(t, nil)
	testkit.QuotaCounter(t, testkit.QuotaRig{A: f.store, B: other, Complete: func(ctx context.Context, key idempotency.Key) error {
		_, err := g.Do(ctx, key, "fp", func(pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("done")}, nil
		})
		return err
	}})
	ctx := testkit.Context(t, testTimeout)
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("keys table: %d rows, %v; want 1 (the completed key)", n, err)
	}
}

func TestQuotaSchema(t *testing.T) {
	ddl, err := postgres.QuotaSchema("app.my_keys")
	if err != nil || !strings.Contains(ddl, `CREATE TABLE IF NOT EXISTS "app"."my_keys_quota"`) {
		t.Fatalf("QuotaSchema: %q, %v", ddl, err)
	}
	long := strings.Repeat("k", 63)
	ddl, err = postgres.QuotaSchema(long)
	if err != nil || strings.Contains(ddl, long) || !strings.Contains(ddl, "_quota\"") {
		t.Fatalf("QuotaSchema of a 63-byte name: %q, %v; want a name cut to 63 bytes", ddl, err)
	}
	if _, err := postgres.QuotaSchema("bad name"); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("QuotaSchema of a bad name: %v, want ErrInvalidConfig", err)
	}
}

// TestQuotaTestClock: a test clock decides the window and its end.
func TestQuotaTestClock(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	f := newFixture(t, newPool(t, 2), postgres.Config{Clock: func() time.Time { return at }})
	ctx := testkit.Context(t, testTimeout)
	adm, err := f.store.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: "s", ID: "k"}, Quota: backend.Quota{Window: time.Hour, MaxKeys: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC); !adm.Counted || !adm.WindowStart.Equal(want) || adm.RetryAfter != 55*time.Minute+55*time.Second {
		t.Fatalf("%+v: want counted in the window of %v, 55m55s left", adm, want)
	}
}
