package chiexample_test

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

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/sqlite"
)

// exampleGuard returns a guard on a temporary SQLite file with a payments
// table, its database, and a function that removes them.
func exampleGuard() (*idempotency.Guard[*sql.Tx], *sql.DB, func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sqlite.Open(ctx, filepath.Join(dir, "payments.db"))
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	return guard, db, func() { db.Close(); os.RemoveAll(dir) }
}

// accountScope is the example's Config.Scope: the account of the
// request's credential, as the service's authentication verified it (here,
// standing for it, the bearer token), and 401 without one. Never a value
// the client may set to anything: that would let it pick another
// account's key space.
func accountScope(r *http.Request) (string, error) {
	if acct := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); acct != "" {
		return acct, nil
	}
	return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized}
}

// pay posts the same payment twice with one key and prints the answers and
// the number of payment rows.
func pay(url string, db *sql.DB) {
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1999}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", "pay-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(body)))
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
}

func Example() {
	guard, db, cleanup := exampleGuard()
	defer cleanup()

	// readme:begin http-chi
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Route("/payments", func(r chi.Router) {
		r.Use(idemhttp.Middleware(guard, &idemhttp.Options{Scope: accountScope})) // guards POST and PATCH; GET passes through
		r.Post("/", func(w http.ResponseWriter, r *http.Request) {
			tx, ok := idempotency.TxFrom[*sql.Tx](r.Context())
			if !ok { // not a guarded request: never act without the transaction
				http.Error(w, "not guarded", http.StatusInternalServerError)
				return
			}
			var id int64
			if err := tx.QueryRowContext(r.Context(), `INSERT INTO payments (amount) VALUES (1999) RETURNING id`).Scan(&id); err != nil {
				http.Error(w, "payment failed", http.StatusInternalServerError) // rolled back
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%d}`, id)
		})
	})
	// readme:end http-chi

	srv := httptest.NewServer(r)
	defer srv.Close()
	pay(srv.URL+"/payments/", db)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// payments: 1
}
