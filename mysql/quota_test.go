package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestQuotaCounter runs the counter cases over two Stores, each with a
// pool of its own, on one table.
func TestQuotaCounter(t *testing.T) {
	f := newFixture(t, openDB(t, testConfig(t, nil), 8), nil)
	other, err := New(openDB(t, testConfig(t, nil), 8), &Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	testkit.QuotaCounter(t, testkit.QuotaRig{A: f.store, B: other, Complete: func(ctx context.Context, key idempotency.Key) error {
		_, err := g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("done")}, nil
		})
		return err
	}})
	ctx := testkit.Context(t, 30*time.Second)
	var n int
	if err := f.db.QueryRowContext(ctx, "SELECT count(*) FROM `"+f.table+"`").Scan(&n); err != nil || n != 1 {
		t.Fatalf("keys table: %d rows, %v; want 1 (the completed key)", n, err)
	}
}

func TestQuotaSchema(t *testing.T) {
	ddl, err := QuotaSchema("my_keys")
	if err != nil || !strings.Contains(ddl, "CREATE TABLE IF NOT EXISTS `my_keys_quota`") {
		t.Fatalf("QuotaSchema: %q, %v", ddl, err)
	}
	if n := quotaName(strings.Repeat("k", 63)); len(n) != 64 || !strings.HasSuffix(n, "_quota") {
		t.Fatalf("quota table of a 63-byte name: %q, want 64 bytes", n)
	}
	if _, err := QuotaSchema("bad name"); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("QuotaSchema of a bad name: %v, want ErrInvalidConfig", err)
	}
}

// TestQuotaTestClock: a test clock decides the window and its end.
func TestQuotaTestClock(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	f := newFixture(t, openDB(t, testConfig(t, nil), 2), &Config{Clock: func() time.Time { return at }})
	ctx := testkit.Context(t, 30*time.Second)
	q := backend.Quota{Window: time.Hour, MaxKeys: 1}
	adm, err := f.store.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: "s", ID: "k"}, Quota: q})
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	if !adm.Counted || !adm.WindowStart.Equal(want) || adm.RetryAfter != 55*time.Minute+55*time.Second {
		t.Fatalf("%+v: want counted in the window of %v, 55m55s left", adm, want)
	}
	// The refusal reports the same window through the update path.
	adm, err = f.store.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: "s", ID: "k2"}, Quota: q})
	if err != nil {
		t.Fatal(err)
	}
	if adm.Counted || adm.Over != backend.QuotaKeys || !adm.WindowStart.Equal(want) || adm.RetryAfter != 55*time.Minute+55*time.Second {
		t.Fatalf("%+v: want refused by keys in the window of %v, 55m55s left", adm, want)
	}
}
