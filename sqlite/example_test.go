package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

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

// readmeQuickStart is the README's SQLite quick start: it opens the store
// on the file at path and pays amount once for the request r.
func readmeQuickStart(ctx context.Context, path string, r *http.Request, customerID string, requestBody []byte, amount int) (idempotency.Response, error) {
	// readme:begin readme-quickstart-sqlite
	db, err := sqlite.Open(ctx, path) // path: "app.db"; WAL, busy timeout, immediate transactions
	if err != nil {
		return idempotency.Response{}, err
	}
	defer db.Close()
	store, err := sqlite.New(db, nil) // table "idempotency_keys"; sqlite.Config{Table: ...}
	if err != nil {
		return idempotency.Response{}, err
	}
	defer store.Close() // releases its prepared statements

	if err := store.Migrate(ctx); err != nil { // or put store.Schema() in your migrations
		return idempotency.Response{}, err
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		return idempotency.Response{}, err
	}

	fp, err := idempotency.FingerprintJSON(requestBody) // key order and whitespace do not matter
	if err != nil {
		return idempotency.Response{}, err
	}
	key := idempotency.Key{Scope: customerID, ID: r.Header.Get("Idempotency-Key")}
	// resp.Replayed tells a replay from a first execution.
	return guard.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
		res, err := tx.ExecContext(ctx, "INSERT INTO payments (amount) VALUES (?)", amount)
		if err != nil {
			return idempotency.Response{}, err // rolls back; the key stays free
		}
		id, err := res.LastInsertId()
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
	})
	// readme:end readme-quickstart-sqlite
}

// The README's SQLite quick start, twice with one key: one payment, and the
// second call replays the first one's response.
func Example_readmeQuickStart() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idempotency-readme")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.db")
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	for _, body := range []string{`{"amount": 1999}`, `{ "amount":1999 }`} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "order-42")
		resp, err := readmeQuickStart(ctx, path, r, "customer-7", []byte(body), 1999)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Replayed)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// payments: 1
}
