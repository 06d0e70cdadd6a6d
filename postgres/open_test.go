package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestOpen: Open refuses a DSN the driver cannot parse with
// ErrInvalidConfig, reaches the test server, and reports a server that
// does not answer as an error that is not ErrInvalidConfig.
func TestOpen(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	for _, dsn := range []string{"postgres://user@host:notaport/db", "host=h port=x", "postgres://h/db?pool_max_conns=0"} {
		if pool, err := postgres.Open(ctx, dsn); !errors.Is(err, idempotency.ErrInvalidConfig) {
			if pool != nil {
				pool.Close()
			}
			t.Errorf("Open(%q): got %v, want ErrInvalidConfig", dsn, err)
		}
	}
	pool, err := postgres.Open(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("Open(test DSN): %v", err)
	}
	if _, err := postgres.New(pool, nil); err != nil {
		t.Errorf("New on a pool of Open: %v", err)
	}
	pool.Close()
	if _, err := postgres.Open(ctx, "postgres://u@127.0.0.1:1/db?connect_timeout=1"); err == nil || errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Open(closed port): got %v, want a connection error", err)
	}
}
