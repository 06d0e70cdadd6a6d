package sealed_test

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/sealed"
	"github.com/go-idempotency/idempotency/sqlite"
)

// exampleStore opens a SQLite store in a temporary directory.
func exampleStore(ctx context.Context) (*sqlite.Store, *sql.DB, func()) {
	dir, err := os.MkdirTemp("", "sealed-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sqlite.Open(ctx, filepath.Join(dir, "keys.db"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	return store, db, func() { db.Close(); os.RemoveAll(dir) }
}

// Answers sealed with AES-256-GCM under a keyring that rotated: the key
// "2026-02" seals, "2026-01" still opens what it sealed.
func ExampleNew() {
	ctx := context.Background()
	store, db, done := exampleStore(ctx)
	defer done()
	// In production the keys come from a secret manager, never from code.
	oldKey, _ := hex.DecodeString(strings.Repeat("11", 32))
	newKey, _ := hex.DecodeString(strings.Repeat("22", 32))

	// readme:begin http-sealed
	codec, err := sealed.New(sealed.Keyring{
		Keys:    map[string][]byte{"2026-01": oldKey, "2026-02": newKey},
		Current: "2026-02", // seals; 2026-01 still opens the records it sealed
	})
	if err != nil {
		log.Fatal(err) // wraps idempotency.ErrInvalidConfig
	}
	guard, err := idempotency.New(store, &idempotency.Config{Codec: codec})
	if err != nil {
		log.Fatal(err)
	}
	mw := idemhttp.Middleware(guard, &idemhttp.Options{Scope: idemhttp.SharedScope})
	// readme:end http-sealed
	_ = mw

	key := idempotency.Key{ID: "create-api-key-1"}
	answer := func(*sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte(`{"apiKey":"sk_live_123"}`)}, nil
	}
	first, _ := guard.Do(ctx, key, "fp", answer)
	again, _ := guard.Do(ctx, key, "fp", answer)
	var stored []byte
	if err := db.QueryRowContext(ctx, `SELECT body FROM idempotency_keys`).Scan(&stored); err != nil {
		log.Fatal(err)
	}
	id, _ := sealed.KeyID(stored)
	fmt.Println(string(first.Body), again.Replayed, string(again.Body))
	fmt.Println(strings.Contains(string(stored), "sk_live"), id)
	// Output:
	// {"apiKey":"sk_live_123"} true {"apiKey":"sk_live_123"}
	// false 2026-02
}

// The no-body mode: the store keeps the status, Location and the order's
// id; a replay renders the order as it is now.
func ExampleNewReference() {
	ctx := context.Background()
	store, _, done := exampleStore(ctx)
	defer done()
	orders := map[string]string{} // stands for the service's orders table
	loadOrder := func(_ context.Context, scope, id string) (string, bool) {
		status, ok := orders[scope+"/"+id]
		return status, ok
	}

	// readme:begin http-reference
	ref, err := sealed.NewReference(sealed.Reference{
		Headers: []string{"Location"}, // stored with the status; no other header, no body
		ResourceID: func(r idempotency.Response) (string, error) {
			id, ok := strings.CutPrefix(r.Header.Get("Location"), "/orders/")
			if !ok {
				return "", fmt.Errorf("answer without an order Location")
			}
			return id, nil
		},
		Render: func(ctx context.Context, key idempotency.Key, id string) (idempotency.Response, error) {
			status, ok := loadOrder(ctx, key.Scope, id) // the order's current state, in the key's scope
			if !ok {
				return idempotency.Response{Status: http.StatusGone}, nil
			}
			return idempotency.Response{
				Header: http.Header{"Content-Type": {"application/json"}},
				Body:   fmt.Appendf(nil, `{"id":%q,"status":%q}`, id, status),
			}, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, &idempotency.Config{Codec: ref})
	// readme:end http-reference
	if err != nil {
		log.Fatal(err)
	}

	key := idempotency.Key{Scope: "acct_1", ID: "order-42"}
	create := func(*sql.Tx) (idempotency.Response, error) {
		orders["acct_1/7"] = "pending"
		return idempotency.Response{Status: 201, Header: http.Header{"Location": {"/orders/7"}},
			Body: []byte(`{"id":"7","status":"pending"}`)}, nil
	}
	first, _ := guard.Do(ctx, key, "fp", create)
	orders["acct_1/7"] = "shipped"
	again, _ := guard.Do(ctx, key, "fp", create)
	fmt.Println(first.Status, string(first.Body))
	fmt.Println(again.Status, again.Header.Get("Location"), string(again.Body))
	// Output:
	// 201 {"id":"7","status":"pending"}
	// 201 /orders/7 {"id":"7","status":"shipped"}
}
