package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// TestLostRaceOnSameConnection: a caller of another Guard that waited in
// the store for the key and lost reads the record on the connection it
// holds, never asking for another while it holds one.
func TestLostRaceOnSameConnection(t *testing.T) {
	tr := &tracer{}
	pool := newPool(t, 2, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	f := newFixture(t, pool, postgres.Config{})
	ctx := testkit.Context(t, testTimeout)
	key := idempotency.Key{ID: "k"}
	holder := startHolder(t, ctx, f.guard(t, nil), f, key, 1)
	waiter := make(chan error, 1)
	var resp idempotency.Response
	go func() {
		var err error
		resp, err = f.guard(t, nil).Do(context.WithValue(ctx, callerKey{}, 2), key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("fn must not run for the waiter")
		})
		waiter <- err
	}()
	waitBlocked(t, ctx, pool) // the waiter waits for the key's lock
	holder.release.Open()
	if err := <-holder.done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if err := <-waiter; err != nil || !resp.Replayed || string(resp.Body) != "holder" {
		t.Fatalf("waiter: got %+v, %v; want the holder's response", resp, err)
	}
	tr.check(t)
	testkit.MustCount(t, ctx, f.count, "held", 1)
}

// holder is a call of Do that holds a key, inside fn after its effect
// (tagged "held"), until release.
type holder struct {
	release *testkit.Gate
	done    chan error
}

// startHolder starts a holder of key on g and returns once it holds it;
// caller tells it apart for the tracer.
func startHolder(t testing.TB, ctx context.Context, g *idempotency.Guard[pgx.Tx], f *fixture, key idempotency.Key, caller int) holder {
	t.Helper()
	h := holder{release: testkit.NewGate(t), done: make(chan error, 1)}
	held := make(chan struct{})
	go func() {
		_, err := g.Do(context.WithValue(ctx, callerKey{}, caller), key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			if err := f.effect(ctx, tx, "held"); err != nil {
				return idempotency.Response{}, err
			}
			close(held)
			<-h.release.Opened()
			return idempotency.Response{Status: 201, Body: []byte("holder")}, nil
		})
		h.done <- err
	}()
	select {
	case <-held:
	case err := <-h.done:
		t.Fatalf("holder ended before holding the key: %v", err)
	}
	return h
}

// TestCancelWhileWaitingReleasesConnection: a caller (of its own Guard)
// cancelled while it waits in the store for a held key returns promptly
// with context.Canceled, and the pool gets its connection slot back at once
// (a pool of 2: the holder's and the waiter's).
func TestCancelWhileWaitingReleasesConnection(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 2)
	f := newFixture(t, pool, postgres.Config{})
	key := idempotency.Key{ID: "k"}
	holder := startHolder(t, ctx, f.guard(t, nil), f, key, 1)
	wctx, cancel := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		_, err := f.guard(t, nil).Do(wctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, f.effect(ctx, tx, "waiter")
		})
		werr <- err
	}()
	pid := waitBlocked(t, ctx, pool)
	cancel()
	select {
	case err := <-werr:
		if !errors.Is(err, context.Canceled) || errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("cancelled waiter: got %v, want context.Canceled (and not ErrInProgress)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled waiter did not return within 5s")
	}
	// The server session stops waiting too, long before the wait bound
	// (30s): pgx sends a cancel request, and the connection is closed.
	waitSessionGone(t, ctx, pid, 3*time.Second)
	// The pool destroys a closed connection in the background.
	for deadline := time.Now().Add(2 * time.Second); pool.Stat().AcquiredConns() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("acquired connections after the waiter returned: %d, want 1 (the holder's)", pool.Stat().AcquiredConns())
		}
	}
	// The freed slot serves another key while the holder still holds.
	if _, err := f.guard(t, nil).Do(ctx, idempotency.Key{ID: "other"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, f.effect(ctx, tx, "other")
	}); err != nil {
		t.Fatalf("another key after the cancel: %v", err)
	}
	holder.release.Open()
	if err := <-holder.done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	testkit.MustCount(t, ctx, f.count, "held", 1)
	testkit.MustCount(t, ctx, f.count, "waiter", 0)
	testkit.MustCount(t, ctx, f.count, "other", 1)
}

// TestLockTimeoutScopedToReservation: the wait bound is a lock_timeout for
// the reservation statement only; fn and later users of the connection see
// the session's own setting.
func TestLockTimeoutScopedToReservation(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	sessionTimeout := func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET lock_timeout = '7s'")
			return err
		}
	}
	cases := []struct {
		name      string
		configure []func(*pgxpool.Config)
		cfg       *idempotency.Config
		want      string
	}{
		{"ServerDefault", nil, nil, "0"},
		{"SessionSetting", []func(*pgxpool.Config){sessionTimeout}, &idempotency.Config{WaitTimeout: 300 * time.Millisecond}, "7s"},
		{"SessionSettingNoWait", []func(*pgxpool.Config){sessionTimeout}, &idempotency.Config{WaitTimeout: -1}, "7s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := newPool(t, 1, c.configure...)
			now := time.Now()
			f := newFixture(t, pool, postgres.Config{Clock: func() time.Time { return now }})
			cfg := idempotency.Config{TTL: time.Hour}
			if c.cfg != nil {
				cfg = *c.cfg
			}
			cfg.TTL = time.Hour
			g := f.guard(t, &cfg)
			// A new key (the INSERT), then the same key once expired (the
			// takeover UPDATE): each sets and restores the bound.
			for _, step := range []string{"new key", "expired key taken over"} {
				var inFn string
				r, err := g.Do(ctx, idempotency.Key{ID: "k"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
					return idempotency.Response{Status: 200}, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&inFn)
				})
				if err != nil || r.Replayed || inFn != c.want {
					t.Fatalf("%s: lock_timeout inside fn: got %q, %+v, %v; want %q", step, inFn, r, err, c.want)
				}
				var after string
				if err := pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&after); err != nil || after != c.want {
					t.Fatalf("%s: lock_timeout of the connection after Do: got %q, %v; want %q", step, after, err, c.want)
				}
				now = now.Add(2 * time.Hour)
			}
		})
	}
}

// TestReplayLocksNothing: a replay neither takes nor waits for a lock on
// the completed row (ON CONFLICT DO NOTHING; DO UPDATE would lock the row,
// and the waiters of a key would then wake up one after another): with the
// row locked by another transaction, a replay with NoWait still succeeds.
func TestReplayLocksNothing(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	pool := newPool(t, 2)
	f := newFixture(t, pool, postgres.Config{})
	for _, noWait := range []bool{false, true} {
		g := f.guard(t, &idempotency.Config{WaitTimeout: map[bool]time.Duration{false: 0, true: -1}[noWait]})
		key := idempotency.Key{ID: fmt.Sprintf("k-%v", noWait)}
		fn := func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("once")}, f.effect(ctx, tx, "locks")
		}
		if _, err := g.Do(ctx, key, "fp", fn); err != nil {
			t.Fatal(err)
		}
		locker, err := pgx.Connect(ctx, testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		ltx, err := locker.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ltx.Exec(ctx, `SELECT 1 FROM "`+f.table+`" WHERE id = $1 FOR UPDATE`, key.ID); err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := g.Do(dctx, key, "fp", fn)
		cancel()
		_ = ltx.Rollback(ctx)
		_ = locker.Close(ctx)
		if err != nil || !r.Replayed || string(r.Body) != "once" {
			t.Fatalf("NoWait %v: replay while another transaction locks the row: got %+v, %v; want the stored response", noWait, r, err)
		}
	}
	testkit.MustCount(t, ctx, f.count, "locks", 2)
}

// TestKeysDoNotShareLock: keys whose scope and id concatenate to the same
// bytes, or that differ only in case, hold distinct locks: with one of
// them held, the others run at once with NoWait.
func TestKeysDoNotShareLock(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newFixture(t, newPool(t, 3), postgres.Config{})
	holder := startHolder(t, ctx, f.guard(t, nil), f, idempotency.Key{Scope: "a", ID: "bc"}, 1)
	g := f.guard(t, &idempotency.Config{WaitTimeout: -1})
	for _, k := range []idempotency.Key{{Scope: "ab", ID: "c"}, {Scope: "", ID: "abc"}, {Scope: "a", ID: "BC"}, {Scope: "A", ID: "bc"}} {
		r, err := g.Do(ctx, k, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, f.effect(ctx, tx, "other")
		})
		if err != nil || r.Replayed {
			t.Fatalf("key %+v while {a bc} is held: got %+v, %v; want executed at once", k, r, err)
		}
	}
	if _, err := g.Do(ctx, idempotency.Key{Scope: "a", ID: "bc"}, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, nil
	}); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("the held key itself with NoWait: got %v, want ErrInProgress", err)
	}
	holder.release.Open()
	if err := <-holder.done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	testkit.MustCount(t, ctx, f.count, "other", 4)
}
