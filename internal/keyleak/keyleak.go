// Package keyleak checks that the errors of [idempotency.Guard.Do] on a
// store name the key by its hash only, never by its raw scope or id. They
// give the raw key to code through [backend.KeyError]. Each store's
// tests run [Check] on a real store.
package keyleak

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// Distinctive parts of the keys checked: no error text may contain them.
const (
	// Scope is the scope of the keys checked.
	Scope = "tenant-secret-7"
	// IDPrefix starts the id of every key checked.
	IDPrefix = "order-42-secret"
)

// Key returns a key of scope [Scope] whose id starts with [IDPrefix],
// made unique by tag and the time.
func Key(tag string) idempotency.Key {
	return idempotency.Key{Scope: Scope, ID: IDPrefix + "-" + tag + "-" + time.Now().Format("150405.000000000")}
}

// Err fails t unless all of these hold: err wraps want; its text contains
// neither the key's scope nor its id (nor [Scope] nor [IDPrefix]) but
// contains its hash; errors.As finds an [backend.KeyError] carrying
// key.
func Err(t testing.TB, what string, err error, want error, key idempotency.Key) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: err %v; want one wrapping %v", what, err, want)
		return
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	for _, raw := range []string{key.ID, key.Scope, Scope, IDPrefix} {
		if strings.Contains(msg, raw) {
			t.Errorf("%s: the error text carries the raw key (%q): %s", what, raw, msg)
		}
	}
	if !strings.Contains(msg, key.Hash()) {
		t.Errorf("%s: the error text lacks the key's hash %s: %s", what, key.Hash(), msg)
	}
	var ke *backend.KeyError
	if !errors.As(err, &ke) {
		t.Errorf("%s: no *backend.KeyError in the chain of %v", what, err)
	} else if ke.Key != key {
		t.Errorf("%s: KeyError.Key is %#v, want %#v", what, ke.Key, key)
	}
}

// Check runs, on store, a mismatch against a stored record and a key held
// by a reservation (refused at once without a wait, and past a short wait
// bound). On broken (a store of the same kind on a closed pool or client)
// it runs a store failure. Each error Do returns must pass [Err].
func Check[Tx any](t *testing.T, store, broken idempotency.KeyStore[Tx]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	newGuard := func(cfg *idempotency.Config) *idempotency.Guard[Tx] {
		t.Helper()
		return guardOn(t, store, cfg)
	}
	fn := func(Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("ok")}, nil
	}

	// A mismatch against the stored record (another Guard: no answer in
	// memory).
	key := Key("mismatch")
	if _, err := newGuard(nil).Do(ctx, key, "fp-a", fn); err != nil {
		t.Fatal(err)
	}
	_, err := newGuard(nil).Do(ctx, key, "fp-b", fn)
	Err(t, "mismatch", err, idempotency.ErrMismatch, key)

	// A key held by a reservation of the store.
	key = Key("held")
	txn, rec, err := store.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Minute})
	if err != nil || txn == nil || rec != nil {
		t.Fatalf("Reserve: %v, %v, %v; want a reservation", txn, rec, err)
	}
	_, err = newGuard(&idempotency.Config{WaitTimeout: -1}).Do(ctx, key, "fp", fn)
	Err(t, "held, NoWait", err, idempotency.ErrInProgress, key)
	_, err = newGuard(&idempotency.Config{WaitTimeout: 300 * time.Millisecond}).Do(ctx, key, "fp", fn)
	Err(t, "held past the wait bound", err, idempotency.ErrInProgress, key)
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A store that fails.
	g := guardOn(t, broken, &idempotency.Config{MaxRetries: -1, WaitTimeout: 2 * time.Second})
	key = Key("broken")
	_, err = g.Do(ctx, key, "fp", fn)
	Err(t, "store failure", err, idempotency.ErrStore, key)
}

func guardOn[Tx any](t *testing.T, store idempotency.KeyStore[Tx], cfg *idempotency.Config) *idempotency.Guard[Tx] {
	t.Helper()
	g, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}
