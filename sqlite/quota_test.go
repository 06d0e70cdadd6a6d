package sqlite_test

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
	"github.com/go-idempotency/idempotency/sqlite"
)

// TestQuotaCounter runs the counter cases over two Stores, each with a
// *sql.DB of its own, on one file.
func TestQuotaCounter(t *testing.T) {
	f := openFixture(t, 0)
	ctx := testkit.Context(t, testTimeout)
	other, err := f.reopen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g := guard(t, f.store, nil)
	testkit.QuotaCounter(t, testkit.QuotaRig{A: f.store, B: other.(*sqlite.Store), Complete: func(ctx context.Context, key idempotency.Key) error {
		_, err := g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("done")}, nil
		})
		return err
	}})
	// Nothing of the keys table was written but the one completed key.
	var n int
	if err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM "`+f.table+`"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("keys table: %d rows, %v; want 1 (the completed key)", n, err)
	}
}

func TestQuotaSchema(t *testing.T) {
	ddl, err := sqlite.QuotaSchema("my_keys")
	if err != nil || !strings.Contains(ddl, `CREATE TABLE IF NOT EXISTS "my_keys_quota"`) {
		t.Fatalf("QuotaSchema: %q, %v", ddl, err)
	}
	if _, err := sqlite.QuotaSchema("bad name"); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("QuotaSchema of a bad name: %v, want ErrInvalidConfig", err)
	}
}

// TestQuotaTestClock: a test clock decides the window and its end.
func TestQuotaTestClock(t *testing.T) {
	f := openFixture(t, 0)
	ctx := testkit.Context(t, testTimeout)
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s, err := sqlite.New(f.db, &sqlite.Config{Table: f.table, Clock: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	adm, err := s.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: "s", ID: "k"}, Quota: backend.Quota{Window: time.Hour, MaxKeys: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC); !adm.Counted || !adm.WindowStart.Equal(want) || adm.RetryAfter != 55*time.Minute+55*time.Second {
		t.Fatalf("%+v: want counted in the window of %v, 55m55s left", adm, want)
	}
}
