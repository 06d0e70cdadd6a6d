package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlite"
)

// fakeProcessor is a card processor that deduplicates on Idempotency-Key:
// the same key gives the same charge, never a second one.
func fakeProcessor() (*httptest.Server, func() int) {
	var mu sync.Mutex
	charges := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		io.WriteString(w, charges[key])
	}))
	return srv, func() int { mu.Lock(); defer mu.Unlock(); return len(charges) }
}

// An operation writes an order, charges a card processor outside any
// transaction, then records the charge: a retry with the same key resumes
// after the last step that committed, and the processor sees one key.
func ExampleStore_operation() {
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (key TEXT PRIMARY KEY, amount INTEGER, charge TEXT)`); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	processor, charges := fakeProcessor()
	defer processor.Close()
	down := true // the processor's first answer is lost

	// readme:begin operations-checkout
	checkout := &idempotency.Operation[*sql.Tx]{
		Name: "checkout",
		Steps: []idempotency.Step[*sql.Tx]{
			{Name: "order", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO orders (key, amount) VALUES (?, ?)`, s.Key().ID, string(s.Input()))
				return err
			}},
			{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
				req, err := http.NewRequestWithContext(ctx, "POST", processor.URL, strings.NewReader(string(s.Input())))
				if err != nil {
					return err
				}
				req.Header.Set("Idempotency-Key", s.Key().Derive("charge"))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				id, err := io.ReadAll(resp.Body)
				if err == nil && down {
					down, err = false, fmt.Errorf("connection reset")
				}
				s.Set("charge", string(id))
				return err
			}},
			{Name: "receipt", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
				_, err := tx.ExecContext(ctx, `UPDATE orders SET charge = ? WHERE key = ?`, s.Get("charge"), s.Key().ID)
				return err
			}},
		},
		Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte(`{"charge":"` + s.Get("charge") + `"}`)}, nil
		},
	}
	key := idempotency.Key{Scope: "customer-42", ID: "order-7"}
	for range 3 {
		resp, err := guard.Run(ctx, key, "amount=100", []byte("100"), checkout)
		fmt.Println(resp.Status, string(resp.Body), resp.Replayed, err)
	}
	// readme:end operations-checkout

	// readme:begin operations-completer
	completer, err := idempotency.NewCompleter(guard, &idempotency.CompleterConfig{Grace: time.Minute}, checkout)
	if err != nil {
		log.Fatal(err)
	}
	report, err := completer.Once(ctx) // or go completer.Serve(ctx): a pass every Interval
	fmt.Println("abandoned:", report.Listed, err)
	// readme:end operations-completer

	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE charge = 'ch_1'`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders, "charges:", charges())
	// Output:
	// 0  false idempotency: operation unfinished; retrying with the same key resumes it: operation "checkout", step charge: connection reset (key #614047206e664d04)
	// 201 {"charge":"ch_1"} false <nil>
	// 201 {"charge":"ch_1"} true <nil>
	// abandoned: 0 <nil>
	// orders: 1 charges: 1
}
