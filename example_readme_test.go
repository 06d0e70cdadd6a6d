package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlite"
)

// The README's first snippet, run twice with one key on a temporary SQLite
// database: the first call runs fn, the second replays its response.
func ExampleGuard_Do_readme() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idempotency-readme")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlite.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	account, idemKey := "account-7", "8e03978e-5f2b-4f4e-9a0c-2f1d3e4b5a6c"
	fingerprint, err := idempotency.FingerprintJSON([]byte(`{"amount":1999,"currency":"EUR"}`))
	if err != nil {
		log.Fatal(err)
	}
	body := []byte(`{"charge":"ch_1","status":"succeeded"}`)

	for range 2 {
		// readme:begin readme-intro
		resp, err := guard.Do(ctx, idempotency.Key{Scope: account, ID: idemKey}, fingerprint,
			func(tx *sql.Tx) (idempotency.Response, error) {
				// charge the card: every write goes through tx
				return idempotency.Response{Status: 201, Body: body}, nil
			})
		// readme:end readme-intro
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Replayed)
	}
	// Output:
	// 201 {"charge":"ch_1","status":"succeeded"} replayed: false
	// 201 {"charge":"ch_1","status":"succeeded"} replayed: true
}
