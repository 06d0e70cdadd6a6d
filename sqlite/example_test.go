package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlite"
)

// A payment runs once per idempotency key: the second call with the same key
// and request replays the stored response without running the effect again.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idempotency-example")
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
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	request := []byte(`{"amount": 100}`)
	fingerprint, err := idempotency.FingerprintJSON(request)
	if err != nil {
		log.Fatal(err)
	}
	key := idempotency.Key{Scope: "customer-42", ID: "3f9c2a"}
	pay := func(tx *sql.Tx) (idempotency.Response, error) {
		res, err := tx.ExecContext(ctx, "INSERT INTO payments (amount) VALUES (100)")
		if err != nil {
			return idempotency.Response{}, err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   fmt.Appendf(nil, `{"payment":%d}`, id),
		}, nil
	}

	for range 2 {
		resp, err := guard.Do(ctx, key, fingerprint, pay)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Replayed)
	}
	var payments int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM payments").Scan(&payments); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", payments)
	// Output:
	// 201 {"payment":1} replayed: false
	// 201 {"payment":1} replayed: true
	// payments: 1
}
