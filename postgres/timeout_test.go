package postgres_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// statementTimeout sets the sessions' statement_timeout, as a DSN's
// options=-c statement_timeout=... or a pool's AfterConnect would.
func statementTimeout(d time.Duration) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["statement_timeout"] = d.String()
	}
}

// TestStatementTimeoutWhileWaiting: a caller waiting in the store for a
// key another caller holds, cut by the server's statement_timeout (57014)
// before its own wait bound, gets ErrInProgress (not a raw driver error,
// not ErrStore) with the server's error in the chain, and fn does not run;
// once the holder completed, the same call replays its answer.
func TestStatementTimeoutWhileWaiting(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	const cut = 300 * time.Millisecond
	pool := newPool(t, 3, statementTimeout(cut))
	f := newFixture(t, pool, postgres.Config{})
	key := idempotency.Key{ID: "k"}
	holder := startHolder(t, ctx, f.guard(t, nil), f, key, 1)
	waiter := f.guard(t, &idempotency.Config{WaitTimeout: 20 * time.Second})
	fn := func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "waiter")
	}
	start := time.Now()
	_, err := waiter.Do(ctx, key, "fp", fn)
	took := time.Since(start)
	var pgErr *pgconn.PgError
	switch {
	case !errors.Is(err, idempotency.ErrInProgress):
		t.Fatalf("waiter cut by statement_timeout: got %v, want ErrInProgress", err)
	case errors.Is(err, idempotency.ErrStore), errors.Is(err, backend.ErrConflict):
		t.Fatalf("waiter cut by statement_timeout: got %v, want ErrInProgress alone", err)
	case !errors.As(err, &pgErr) || pgErr.Code != "57014":
		t.Fatalf("waiter cut by statement_timeout: got %v, want the server's 57014 in the chain", err)
	case took < cut || took > 10*time.Second:
		t.Fatalf("waiter returned after %v, want about the statement_timeout %v", took, cut)
	}
	holder.release.Open()
	if err := <-holder.done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	r, err := waiter.Do(ctx, key, "fp", fn)
	if err != nil || !r.Replayed || string(r.Body) != "holder" {
		t.Fatalf("the waiter's retry: got %+v, %v; want the holder's answer replayed", r, err)
	}
	testkit.MustCount(t, ctx, f.count, "held", 1)
	testkit.MustCount(t, ctx, f.count, "waiter", 0)
}

// TestStatementTimeoutCancelWins: with a statement_timeout longer than
// the caller's context, a cancelled waiter reports context.Canceled, not
// ErrInProgress.
func TestStatementTimeoutCancelWins(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 3, statementTimeout(10*time.Second))
	f := newFixture(t, pool, postgres.Config{})
	key := idempotency.Key{ID: "k"}
	holder := startHolder(t, ctx, f.guard(t, nil), f, key, 1)
	defer func() {
		holder.release.Open()
		if err := <-holder.done; err != nil {
			t.Errorf("holder: %v", err)
		}
	}()
	wctx, cancel := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		_, err := f.guard(t, nil).Do(wctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, f.effect(ctx, tx, "waiter")
		})
		werr <- err
	}()
	waitBlocked(t, ctx, pool)
	cancel()
	if err := <-werr; !errors.Is(err, context.Canceled) || errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("cancelled waiter: got %v, want context.Canceled and not ErrInProgress", err)
	}
}

// TestCutConnection: a connection cut under a call (the server ends the
// session) gives an error with ErrStore and the driver's error in the
// chain, whether it was cut while the call waited for a held key or under
// one of fn's statements; a retry with the same key then runs fn once.
func TestCutConnection(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 3)
	f := newFixture(t, pool, postgres.Config{})
	driverErr := func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) || errors.Is(err, io.ErrUnexpectedEOF)
	}
	fn := func(tag string) func(pgx.Tx) (idempotency.Response, error) {
		return func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte(tag)}, f.effect(ctx, tx, tag)
		}
	}

	t.Run("WhileWaiting", func(t *testing.T) {
		key := idempotency.Key{ID: "waiting"}
		holder := startHolder(t, ctx, f.guard(t, nil), f, key, 1)
		werr := make(chan error, 1)
		go func() {
			_, err := f.guard(t, nil).Do(ctx, key, "fp", fn("waiter"))
			werr <- err
		}()
		pid := waitBlocked(t, ctx, pool)
		if _, err := f.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		err := <-werr
		if !errors.Is(err, idempotency.ErrStore) || errors.Is(err, idempotency.ErrInProgress) || !driverErr(err) {
			t.Fatalf("waiter whose connection was cut: got %v, want ErrStore with the driver's error", err)
		}
		holder.release.Open()
		if err := <-holder.done; err != nil {
			t.Fatalf("holder: %v", err)
		}
		testkit.MustCount(t, ctx, f.count, "waiter", 0)
	})

	t.Run("InFn", func(t *testing.T) {
		key := idempotency.Key{ID: "in-fn"}
		g := f.guard(t, nil)
		_, err := g.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			if err := f.effect(ctx, tx, "in-fn"); err != nil {
				return idempotency.Response{}, err
			}
			// The server ends this very session under fn's statement.
			_, err := tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
			return idempotency.Response{Status: 201}, err
		})
		if !errors.Is(err, idempotency.ErrStore) || !driverErr(err) {
			t.Fatalf("fn's connection cut: got %v, want ErrStore with the driver's error", err)
		}
		testkit.MustCount(t, ctx, f.count, "in-fn", 0)
		r, err := g.Do(ctx, key, "fp", fn("in-fn"))
		if err != nil || r.Replayed {
			t.Fatalf("retry after the cut: got %+v, %v; want executed", r, err)
		}
		testkit.MustCount(t, ctx, f.count, "in-fn", 1)
	})
}
