package idemhttp_test

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// readme:begin readme-http-middleware
import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/postgres"
)

func newMux(ctx context.Context, pool *pgxpool.Pool) (*http.ServeMux, error) {
	store, err := postgres.New(pool, nil) // or sqlite.New(db, nil): any KeyStore[Tx]
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		return nil, err
	}
	mw := idemhttp.Middleware(guard, &idemhttp.Options{
		// Multi-tenant services MUST scope keys, typically by the authenticated account.
		Scope: func(r *http.Request) (string, error) { return accountID(r), nil },
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(http.HandlerFunc(createPayment)))
	return mux, nil
}

func createPayment(w http.ResponseWriter, r *http.Request) {
	tx, ok := idempotency.TxFrom[pgx.Tx](r.Context()) // *sql.Tx with the sqlite store
	if !ok {
		// not a guarded request: never act without the transaction
		http.Error(w, "not guarded", http.StatusInternalServerError)
		return
	}
	var p struct {
		OrderID int64 `json:"orderId"`
		Amount  int64 `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, "invalid payment", http.StatusBadRequest) // 400: sent, not stored (Options.KeepStatus)
		return
	}
	// Do every write of the operation through tx: it commits with the key and the response.
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id`,
		p.OrderID, p.Amount).Scan(&id); err != nil {
		http.Error(w, "payment failed", http.StatusInternalServerError) // 5xx: rolled back, not stored
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"%d","status":"approved"}`, id)
}

// readme:end readme-http-middleware

// accountID stands for the service's authentication.
func accountID(r *http.Request) string { return r.Header.Get("X-Account") }

// readmePay is the README's client snippet: one POST with a key that every
// attempt carries.
func readmePay(ctx context.Context, url string, body []byte) (*http.Response, string, error) {
	// readme:begin readme-http-client
	client := &http.Client{Transport: &idemhttp.Transport{}} // its zero value sends through http.DefaultTransport
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	key := resp.Request.Header.Get("Idempotency-Key") // the key every attempt carried
	// readme:end readme-http-client
	return resp, key, nil
}

// The README's client against a service whose first answer is a 503: the
// client retries with the same key, and the second attempt is served.
func ExampleClient_readme() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemhttp-readme")
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
	var attempts atomic.Int32
	keys := make(chan string, 10)
	one := &idemhttp.Options{Scope: idemhttp.SharedScope} // the example's one client
	srv := httptest.NewServer(idemhttp.Middleware(guard, one)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if attempts.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable) // 5xx: not stored, retried
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"status":"approved"}`)
	})))
	defer srv.Close()

	resp, key, err := readmePay(ctx, srv.URL+"/payments", []byte(`{"orderId":42,"amount":1999}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	close(keys)
	same := true
	for k := range keys {
		same = same && k == key
	}
	fmt.Println(resp.StatusCode, string(body), "attempts:", attempts.Load(), "same key on every attempt:", same && key != "")
	// Output: 201 {"status":"approved"} attempts: 2 same key on every attempt: true
}

// TestReadmeMiddleware serves the README's middleware on PostgreSQL, in a
// schema of its own, and calls it with the README's client: one payment,
// a replay of the same bytes, and 422 for the key with another body.
func TestReadmeMiddleware(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := testkit.Name("readme_")
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	pgkit.DropAtCleanup(t, dsn, "SCHEMA", schema)
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s; CREATE TABLE %s.payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, amount BIGINT NOT NULL)`, schema, schema)); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	mux, err := newMux(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, key, err := readmePay(ctx, srv.URL+"/payments", []byte(`{"orderId":42,"amount":1999}`))
	if err != nil {
		t.Fatal(err)
	}
	first, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || !strings.HasPrefix(string(first), `{"id":"`) || key == "" {
		t.Fatalf("first call: %d %q, key %q; want 201 with a payment id and a key", resp.StatusCode, first, key)
	}
	post := func(body string) (*http.Response, []byte) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	replay, b := post(`{"amount": 1999, "orderId": 42}`)
	if replay.StatusCode != http.StatusCreated || !bytes.Equal(b, first) || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %q replayed %q; want 201 %q replayed", replay.StatusCode, b, replay.Header.Get("Idempotent-Replayed"), first)
	}
	other, b := post(`{"orderId":42,"amount":2000}`)
	if other.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("same key, other amount: %d %q, want 422", other.StatusCode, b)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}
