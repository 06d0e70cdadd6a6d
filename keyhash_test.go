package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/keyleak"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/observe"
)

// TestKeyHash pins Key.Hash: the first 16 hex digits of the SHA-256 of the
// scope's length (8 bytes, big-endian), the scope and the id (values
// computed with Python's hashlib), and checks that the length prefix keeps
// apart keys whose scope and id concatenate alike.
func TestKeyHash(t *testing.T) {
	for _, c := range []struct {
		key  idempotency.Key
		want string
	}{
		{idempotency.Key{ID: "order-42"}, "4f1c61bc99649c1c"},
		{idempotency.Key{Scope: "tenant-secret-7", ID: "order-42-secret"}, "d114b59251934927"},
		{idempotency.Key{Scope: "a", ID: "b/c"}, "b9baf28a362626b8"},
		{idempotency.Key{Scope: "a/b", ID: "c"}, "0eee58a014b043b3"},
	} {
		if got := c.key.Hash(); got != c.want || len(got) != backend.HashLen {
			t.Errorf("%#v.Hash() = %q, want %q", c.key, got, c.want)
		}
	}
	seen := map[string]idempotency.Key{}
	for _, k := range []idempotency.Key{{ID: "ab"}, {Scope: "a", ID: "b"}, {Scope: "ab", ID: "x"}, {Scope: "a", ID: "bx"}, {Scope: "\x01", ID: "x"}, {ID: "\x01x"}} {
		if prev, ok := seen[k.Hash()]; ok {
			t.Errorf("%#v and %#v share the hash %s", prev, k, k.Hash())
		}
		seen[k.Hash()] = k
	}
}

// TestKeyPrintsItsHash: a Key or an Event printed with fmt or logged with
// slog (text and JSON) shows the key's hash, never its scope or id.
func TestKeyPrintsItsHash(t *testing.T) {
	key := keyleak.Key("print")
	ev := observe.Event{Key: key, Outcome: observe.Executed}
	if ev.KeyHash() != key.Hash() {
		t.Fatalf("Event.KeyHash() = %q, want %q", ev.KeyHash(), key.Hash())
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("call", "key", key, "event", ev)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("call", "key", key, "event", ev)
	outputs := map[string]string{
		"%v":  fmt.Sprintf("%v", key),
		"%s":  fmt.Sprintf("%s", key),
		"%+v": fmt.Sprintf("%+v", key),
		"ev":  fmt.Sprintf("%+v", ev),
		"log": logs.String(),
	}
	for name, out := range outputs {
		if strings.Contains(out, key.ID) || strings.Contains(out, key.Scope) || !strings.Contains(out, "#"+key.Hash()) {
			t.Errorf("%s: %s; want #%s and neither %q nor %q", name, out, key.Hash(), key.ID, key.Scope)
		}
	}
}

// TestDoErrorsNameKeyHash: every error Do returns about a key (a mismatch
// against the store or the call ahead in memory, a key held in the store or
// by the call ahead, a failing store, conflicts past the retries) names the
// key by its hash only and carries the raw key in a KeyError; the
// observer's Event has the same error and the hash; fn's own error comes
// back as fn returned it.
func TestDoErrorsNameKeyHash(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	var events []observe.Event
	record := func(_ context.Context, ev observe.Event) { events = append(events, ev) }
	g := newGuard(t, s, &idempotency.Config{Observer: record})

	// Against the stored record (another Guard: nothing in memory).
	key := keyleak.Key("stored")
	if _, err := g.Do(ctx, key, "fp-a", ok("a")); err != nil {
		t.Fatal(err)
	}
	_, err := newGuard(t, s, nil).Do(ctx, key, "fp-b", ok("b"))
	keyleak.Err(t, "stored mismatch", err, idempotency.ErrMismatch, key)
	_, err = g.Do(ctx, key, "fp-b", ok("b"))
	keyleak.Err(t, "stored mismatch, observed", err, idempotency.ErrMismatch, key)
	if ev := events[len(events)-1]; ev.KeyHash() != key.Hash() || ev.Err != err || ev.Outcome != observe.Mismatch {
		t.Errorf("event %+v; want hash %s, outcome mismatch and Do's error", ev, key.Hash())
	}

	// A key held: in the store (another Guard, NoWait), by the call ahead
	// in this Guard past the wait bound, then the call ahead's mismatch.
	key = keyleak.Key("memory")
	gw := newGuard(t, s, &idempotency.Config{WaitTimeout: time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := gw.Do(ctx, key, "fp-a", func(tx *memstore.Tx) (idempotency.Response, error) {
			close(entered)
			<-release
			return ok("held")(tx)
		})
		done <- err
	}()
	<-entered
	_, err = newGuard(t, s, &idempotency.Config{WaitTimeout: -1}).Do(ctx, key, "fp-a", ok("x"))
	keyleak.Err(t, "held in the store, NoWait", err, idempotency.ErrInProgress, key)
	_, err = gw.Do(ctx, key, "fp-a", ok("x"))
	keyleak.Err(t, "held by the call ahead past the wait bound", err, idempotency.ErrInProgress, key)
	go func() {
		time.Sleep(200 * time.Millisecond) // the follower below waits in memory meanwhile
		close(release)
	}()
	_, err = gw.Do(ctx, key, "fp-b", ok("x"))
	keyleak.Err(t, "mismatch with the call ahead", err, idempotency.ErrMismatch, key)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A store that fails, and conflicts past the retries.
	s.ReserveErr = func() error { return errors.New("connection reset") }
	key = keyleak.Key("fail")
	_, err = g.Do(ctx, key, "fp", ok("x"))
	keyleak.Err(t, "store failure", err, idempotency.ErrStore, key)
	s.ReserveErr = func() error { return fmt.Errorf("%w: deadlock", backend.ErrConflict) }
	_, err = newGuard(t, s, &idempotency.Config{MaxRetries: 1, RetryBackoff: time.Microsecond}).Do(ctx, key, "fp", ok("x"))
	keyleak.Err(t, "conflicts past the retries", err, backend.ErrConflict, key)
	s.ReserveErr = nil

	// fn's own error is returned as fn returned it.
	errFn := errors.New("card declined")
	_, err = g.Do(ctx, keyleak.Key("fn"), "fp", func(*memstore.Tx) (idempotency.Response, error) { return idempotency.Response{}, errFn })
	if err != errFn {
		t.Errorf("fn's error came back as %#v, want fn's own", err)
	}
}
