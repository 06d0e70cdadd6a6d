package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlite"
)

// The start-up check on a SQLite database: before Migrate it names the
// missing table and what to run; after, it passes.
func ExampleGuard_CheckSchema() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idempotency-schema")
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
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Not migrated yet: every call would fail with ErrSchema (500 over
	// HTTP), a retry would not help.
	err = guard.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true})
	fmt.Println(errors.Is(err, idempotency.ErrSchema), errors.Is(err, idempotency.ErrStore))
	fmt.Println(err)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// readme:begin schema-check
	// Before serving: the keys table (and the quota table, with quotas)
	// exists with every column this version needs.
	if err := guard.CheckSchema(ctx, idempotency.SchemaCheck{Quota: true}); err != nil {
		log.Fatal(err) // it names the table and says to run Migrate or apply Schema
	}
	// readme:end schema-check
	fmt.Println("schema ready")
	// Output:
	// true false
	// idempotency: the store's schema is missing or out of date: sqlite: table idempotency_keys does not exist in this database file: run Store.Migrate, or apply sqlite.Schema("idempotency_keys") in your migrations
	// schema ready
}
