package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlite"
)

// Two equal requests written differently get the same fingerprint; another
// amount gets another one.
func ExampleFingerprintJSON() {
	a, _ := idempotency.FingerprintJSON([]byte(`{"orderId": 42, "amount": 100}`))
	b, _ := idempotency.FingerprintJSON([]byte(`{"amount":100,"orderId":42}`))
	c, _ := idempotency.FingerprintJSON([]byte(`{"orderId": 42, "amount": 999}`))
	_, err := idempotency.FingerprintJSON([]byte(`{"orderId": 42,`))
	fmt.Println(a == b, a == c, errors.Is(err, idempotency.ErrInvalidBody))
	// Output: true false true
}

// The 20-request experiment on the embedded store: 20 simultaneous requests with
// one key create one payment and get 20 identical responses; the same key
// with another amount is refused.
func ExampleGuard_Do() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idempotency-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "shop.db"))
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id INTEGER PRIMARY KEY, order_id INTEGER, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	key := idempotency.Key{Scope: "customer-7", ID: "9b2f6c1e-order-42"}
	pay := func(amount int) (idempotency.Response, error) {
		fp, err := idempotency.FingerprintJSON(fmt.Appendf(nil, `{"orderId":42,"amount":%d}`, amount))
		if err != nil {
			return idempotency.Response{}, err
		}
		return guard.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount) VALUES (42, ?)`, amount)
			if err != nil {
				return idempotency.Response{}, err
			}
			id, _ := res.LastInsertId()
			return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"id":"%d","status":"approved"}`, id)}, nil
		})
	}

	var wg sync.WaitGroup
	bodies := make([]string, 20)
	for i := range bodies {
		wg.Go(func() {
			resp, err := pay(100)
			if err != nil {
				log.Fatal(err)
			}
			bodies[i] = fmt.Sprint(resp.Status, " ", string(resp.Body))
		})
	}
	wg.Wait()
	same := 0
	for _, b := range bodies {
		if b == bodies[0] {
			same++
		}
	}
	var payments int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", payments)
	fmt.Printf("responses: %d x %s\n", same, bodies[0])

	_, err = pay(999)
	fmt.Println("other amount:", errors.Is(err, idempotency.ErrMismatch))
	// Output:
	// payments: 1
	// responses: 20 x 201 {"id":"1","status":"approved"}
	// other amount: true
}
