package idemhttp_test

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
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/sqlite"
)

// exampleGuard returns a guard on a temporary SQLite file with a payments
// table, and a function that removes it all.
func exampleGuard() (*idempotency.Guard[*sql.Tx], *sql.DB, func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemhttp-example")
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

func accountOf(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// accountScope is the examples' Config.Scope: the account of the request's
// credential, as the service's authentication verified it (here, standing
// for it, the bearer token), and 401 without one. Never a header or field
// the client may set to anything: that would let it pick another account's
// key space.
func accountScope(r *http.Request) (string, error) {
	if acct := accountOf(r); acct != "" {
		return acct, nil
	}
	return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized}
}

// Settings that users of Stripe, Powertools and IdempotentAPI ask for: another
// header name, a key validator, a 401 with WWW-Authenticate, the stored
// statuses, the fingerprint's parts and a renderer of one's own.
func ExampleConfig() {
	guard, _, cleanup := exampleGuard()
	defer cleanup()

	// readme:begin http-config
	cfg := &idemhttp.Options{
		KeyHeader:   "X-Idempotency-Key",       // default "Idempotency-Key"
		ValidateKey: idemhttp.MinKeyLength(16), // or idemhttp.UUIDKey: refuse low-entropy keys (400)
		Scope: func(r *http.Request) (string, error) {
			if acct := accountOf(r); acct != "" {
				return acct, nil
			}
			return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized,
				Header: http.Header{"Www-Authenticate": {`Bearer realm="payments"`}}}
		},
		// Default idemhttp.DefaultKeepStatus: 2xx, 3xx and outcome 4xx (402...) are stored;
		// 5xx, 400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 425, 429, 431 are not.
		KeepStatus:         idemhttp.DefaultKeepStatus,
		FingerprintHeaders: []string{"X-Currency"},            // the same key with another currency: 422
		IgnoreFields:       []string{"sent_at", "meta.trace"}, // JSON members left out of the fingerprint
		RenderProblem: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			p.Detail += " (see https://docs.example/errors)"
			idemhttp.WriteProblem(w, p) // sends p.Header (Retry-After, WWW-Authenticate) too
		},
		MaxRequestBody: 64 << 10,
	}
	// readme:end http-config

	h := idemhttp.Middleware(guard, cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ok":true}`)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func(key, auth, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Idempotency-Key", key)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("WWW-Authenticate"), resp.Header.Get("Idempotent-Replayed"), len(b) > 0)
	}
	send("0123456789abcdef", "", `{}`)
	send("short", "acct-1", `{}`)
	send("0123456789abcdef", "acct-1", `{"amount":5,"sent_at":"10:00"}`)
	send("0123456789abcdef", "acct-1", `{"amount":5,"sent_at":"10:01"}`)
	// Output:
	// 401 Bearer realm="payments"  true
	// 400   true
	// 201   true
	// 201  true true
}

// Transport gives any http.Client (or a generated API client) one key per
// request and safe retries, within a budget shared by all its requests.
func ExampleTransport() {
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	// readme:begin http-client
	client := &http.Client{Transport: &idemhttp.Transport{
		MaxAttempts: 5,
		BaseDelay:   10 * time.Millisecond,
		Budget:      idemhttp.NewRetryBudget(0.1, 10), // 1 retry per 10 calls in the long run, 10 at once
		// Retry: idemhttp.DefaultRetry: transport errors, 5xx (not 501, 505), 429,
		// and a 409 only when it is the in-progress answer; never a business 409.
		OnRetry: func(ev idemhttp.RetryEvent) {
			log.Printf("retry %d of %s in %v (error: %v)", ev.Attempt, ev.Request.URL, ev.Wait, ev.Err)
		},
	}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1999}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req) // the same generated key on every attempt
	// readme:end http-client
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, attempts.Load())
	// Output:
	// 201 2
}

// Plain net/http: the middleware wraps any http.Handler.
func ExampleMiddleware_handler() {
	guard, db, cleanup := exampleGuard()
	defer cleanup()

	// readme:begin http-nethttp
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[*sql.Tx](r.Context()) // the transaction that holds the key
		if !ok {
			// not a guarded request: never act without the transaction
			http.Error(w, "not guarded", http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments (amount) VALUES (1999)`); err != nil {
			http.Error(w, "payment failed", http.StatusInternalServerError) // 5xx: rolled back, not stored
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"status":"approved"}`)
		// Returning without writing anything is answered 500 and rolled back, never stored.
	})
	mw := idemhttp.Middleware(guard, &idemhttp.Options{Scope: accountScope}) // each account its own key space
	srv := httptest.NewServer(mw(pay))                                       // or http.ListenAndServe(addr, ...)
	// readme:end http-nethttp
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1999}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", "pay-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%d replayed=%q\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed=""
	// 201 replayed="true"
	// payments: 1
}
