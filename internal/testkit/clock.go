package testkit

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// ClockArgs collects the statement or command arguments that look like a
// reading of the application's clock: a time.Time, or an
// integer (or a string of digits) within a day of now in Unix seconds,
// milliseconds, microseconds or nanoseconds. It is safe for concurrent use.
type ClockArgs struct {
	mu   sync.Mutex
	n    int64 // statements or commands seen
	seen []string
}

// See records one statement or command, named by what, and its arguments.
func (c *ClockArgs) See(what string, args ...any) {
	now := time.Now()
	near := func(v, unit int64) bool {
		d := v - now.UnixNano()/unit
		return d < int64(24*time.Hour)/unit && d > -int64(24*time.Hour)/unit
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	for _, a := range args {
		var v int64
		switch a := a.(type) {
		case time.Time, *time.Time:
			c.seen = append(c.seen, fmt.Sprintf("%.50q: %v", what, a))
			continue
		case int64:
			v = a
		case int:
			v = int64(a)
		case string:
			n, err := strconv.ParseInt(a, 10, 64)
			if err != nil {
				continue
			}
			v = n
		default:
			continue
		}
		if near(v, 1) || near(v, 1e3) || near(v, 1e6) || near(v, 1e9) {
			c.seen = append(c.seen, fmt.Sprintf("%.50q: %v", what, a))
		}
	}
}

// SeeNamed records one database/sql statement and its arguments.
func (c *ClockArgs) SeeNamed(query string, args []driver.NamedValue) {
	vs := make([]any, len(args))
	for i, a := range args {
		vs[i] = a.Value
	}
	c.See(query, vs...)
}

// Sent returns how many statements or commands were seen, and the
// arguments among them that look like a time of the application.
func (c *ClockArgs) Sent() (int64, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, append([]string(nil), c.seen...)
}

// ClockOnlyCase is what [ClockOnly] needs of a store.
type ClockOnlyCase[Tx any] struct {
	// Store and Other are two instances of the store, with the default
	// Config, on one table or prefix, as two processes would hold them.
	// The holder and the expired key use Store; the waiter uses Other.
	Store, Other idempotency.KeyStore[Tx]
	// Clocked returns another instance on the same table or prefix, with
	// Config.Clock set to time.Now: the control, which must send a time.
	Clocked func() idempotency.KeyStore[Tx]
	// Effect records one effect tagged tag in tx; Count counts them.
	Effect func(ctx context.Context, tx Tx, tag string) error
	Count  func(ctx context.Context, tag string) (int, error)
	// Sent reports what the capture recorded since the test began: the
	// statements or commands seen, and the arguments like a time of the
	// application among them.
	Sent func() (int64, []string)
	// NoPurge skips the Purge checks, for a store whose records expire
	// on their own.
	NoPurge bool
	// Unit names what Sent counts in messages: "statements" when empty.
	Unit string
}

// ClockOnly runs the scenario of two instances whose clocks disagree, on
// the store's clock. A holder and a waiter on another instance (TTL 10min)
// must give one effect, the waiter replaying the holder's answer. A Purge
// right after the completion deletes nothing. An expired key is taken over,
// then purged. No statement carries a time of the application, and the
// clocked control store must be seen sending one (the check can fail).
func ClockOnly[Tx any](t *testing.T, ctx context.Context, c ClockOnlyCase[Tx]) {
	t.Helper()
	unit := c.Unit
	if unit == "" {
		unit = "statements"
	}
	newGuard := func(s idempotency.KeyStore[Tx], cfg *idempotency.Config) *idempotency.Guard[Tx] {
		t.Helper()
		g, err := idempotency.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	cfg := &idempotency.Config{TTL: 10 * time.Minute}
	holder, waiter := newGuard(c.Store, cfg), newGuard(c.Other, cfg)
	key := idempotency.Key{ID: "skew"}
	fn := func(tx Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("paid")}, c.Effect(ctx, tx, "pay")
	}
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := holder.Do(ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			close(held)
			<-release
			return fn(tx)
		})
		done <- err
	}()
	<-held
	type result struct {
		r   idempotency.Response
		err error
	}
	wdone := make(chan result, 1)
	go func() {
		r, err := waiter.Do(ctx, key, "fp", fn)
		wdone <- result{r, err}
	}()
	time.Sleep(300 * time.Millisecond) // the waiter waits for the key
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if w := <-wdone; w.err != nil || !w.r.Replayed || string(w.r.Body) != "paid" {
		t.Fatalf("waiter on another Store: %+v, %v; want the holder's answer replayed", w.r, w.err)
	}
	if !c.NoPurge {
		time.Sleep(100 * time.Millisecond)
		if n, err := waiter.Purge(ctx); err != nil || n != 0 {
			t.Fatalf("Purge 0.1s after the completion (TTL 10min): deleted %d, %v; want 0", n, err)
		}
	}
	if r, err := holder.Do(ctx, key, "fp", fn); err != nil || !r.Replayed {
		t.Fatalf("retry: %+v, %v; want replayed", r, err)
	}
	MustCount(t, ctx, c.Count, "pay", 1)

	// An expired key, on the store's clock: taken over, then purged.
	short := newGuard(c.Store, &idempotency.Config{TTL: time.Millisecond})
	exp := idempotency.Key{ID: "short"}
	for i := range 2 {
		if r, err := short.Do(ctx, exp, "fp", fn); err != nil || r.Replayed {
			t.Fatalf("TTL 1ms, call %d 20ms apart: %+v, %v; want executed", i, r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !c.NoPurge {
		if n, err := short.Purge(ctx); err != nil || n != 1 {
			t.Fatalf("Purge of the expired key: %d, %v; want 1", n, err)
		}
	}
	if n, sent := c.Sent(); len(sent) != 0 || n == 0 {
		t.Fatalf("%d %s, %d arguments like a time of the application, want none: %q", n, unit, len(sent), sent)
	}

	// The control: a test clock is sent.
	if _, err := newGuard(c.Clocked(), nil).Do(ctx, idempotency.Key{ID: "clocked"}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if _, sent := c.Sent(); len(sent) == 0 {
		t.Fatal("a Store with Config.Clock sent no time: the check sees nothing")
	}
}
