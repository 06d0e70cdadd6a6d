// Package paymentsdemo_test is the payments service of docs/payments.md,
// run end to end: every Go block of that page is a region of this file
// (readme_test.go at the module's root checks them), and TestPayments
// drives the service over HTTP as a client would.
package paymentsdemo_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver of database/sql

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// keepEnv names a SQLite file for TestPayments to use and leave behind,
// so that idemctl can be tried on it (docs/payments.md, "Looking at a key").
const keepEnv = "IDEMPOTENCY_PAYMENTS_DB"

// TestMain says once whether the PostgreSQL run is skipped.
func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Postgres)
}

// tokens stands for the service's authentication: a verified bearer token
// and the account it belongs to.
var tokens = map[string]string{"tok_alice": "acct_alice", "tok_bob": "acct_bob"}

// accountOf returns the account of r's verified credential, or "".
func accountOf(r *http.Request) string {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return tokens[token]
}

// openSQLite opens the service's database file, its keys table, its own
// payments table and the Guard.
func openSQLite(ctx context.Context, path string) (*sql.DB, *idempotency.Guard[*sql.Tx], error) {
	// readme:begin payments-open
	db, err := sqlite.Open(ctx, path) // path: "payments.db", created if missing
	if err != nil {
		return nil, nil, err
	}
	store, err := sqlite.New(db, nil) // the keys table "idempotency_keys"
	if err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	if err := store.Migrate(ctx); err != nil { // or put sqlite.Schema's DDL in your migrations
		return nil, nil, errors.Join(err, db.Close())
	}
	// The service's own table, in the same database as the keys.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS payments (
		id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL,
		status TEXT NOT NULL, charge TEXT NOT NULL DEFAULT '')`); err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	guard, err := idempotency.New(store, &idempotency.Config{TTL: 72 * time.Hour})
	if err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	// readme:end payments-open
	return db, guard, nil
}

// openPostgres is openSQLite on PostgreSQL: the same Guard type, so the
// handlers and the operation do not change.
func openPostgres(ctx context.Context, dsn string) (*sql.DB, *idempotency.Guard[*sql.Tx], error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, nil, err
	}
	// readme:begin payments-postgres
	store, err := postgres.NewDB(db, nil) // db: sql.Open("pgx", dsn), was sqlite.New(db, nil)
	// readme:end payments-postgres
	if err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	// readme:begin payments-postgres-table
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS payments (
		id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL,
		status TEXT NOT NULL, charge TEXT NOT NULL DEFAULT '')`)
	// readme:end payments-postgres-table
	if err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	guard, err := idempotency.New(store, &idempotency.Config{TTL: 72 * time.Hour})
	if err != nil {
		return nil, nil, errors.Join(err, db.Close())
	}
	return db, guard, nil
}

// readme:begin payments-handler
// createPayment records a payment made outside the service (a bank
// transfer): its row, the key and the answer commit together.
func createPayment(w http.ResponseWriter, r *http.Request) {
	tx, ok := idempotency.TxFrom[*sql.Tx](r.Context()) // the transaction that holds the key
	if !ok {
		// not a guarded request: never act without the transaction
		http.Error(w, "not guarded", http.StatusInternalServerError)
		return
	}
	var req struct {
		Amount int64 `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		http.Error(w, "amount: a positive integer", http.StatusBadRequest) // 400: not stored, key left free
		return
	}
	var id int64
	err := tx.QueryRowContext(r.Context(), `INSERT INTO payments (account, amount, status)
		VALUES ($1, $2, 'recorded') RETURNING id`, accountOf(r), req.Amount).Scan(&id)
	if err != nil {
		http.Error(w, "payment failed", http.StatusInternalServerError) // 5xx: rolled back, not stored
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"payment":%d,"amount":%d,"status":"recorded"}`, id, req.Amount)
}

// readme:end payments-handler

// routes mounts the service's two routes behind the guard.
func routes(guard *idempotency.Guard[*sql.Tx], processorURL string) (http.Handler, *idempotency.Operation[*sql.Tx], error) {
	// readme:begin payments-scope
	cfg := &idemhttp.Options{
		// The key space of a request: the account its credential proves.
		Scope: func(r *http.Request) (string, error) {
			if account := accountOf(r); account != "" {
				return account, nil
			}
			return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized}
		},
	}
	// readme:end payments-scope
	// readme:begin payments-middleware
	mux := http.NewServeMux()
	mw := idemhttp.Middleware(guard, cfg) // cfg: its Scope is the next section
	mux.Handle("POST /payments", mw(http.HandlerFunc(createPayment)))
	// readme:end payments-middleware
	// readme:begin payments-charge-route
	charge := chargeOperation(processorURL)
	chargeHandler, err := idemhttp.Operation(guard, charge, cfg) // the request's body is the input
	if err != nil {
		return nil, nil, err
	}
	mux.Handle("POST /charges", chargeHandler)
	// readme:end payments-charge-route
	return mux, charge, nil
}

// chargeRequest is the body of POST /charges.
type chargeRequest struct {
	Amount int64  `json:"amount"`
	Card   string `json:"card"`
}

// readme:begin payments-operation
// chargeOperation charges a card at the processor, then records the
// payment, under the request's idempotency key.
func chargeOperation(processorURL string) *idempotency.Operation[*sql.Tx] {
	return &idempotency.Operation[*sql.Tx]{
		Name: "charge",
		Validate: func(ctx context.Context, input []byte) error { // 400, nothing stored
			var req chargeRequest
			if err := json.Unmarshal(input, &req); err != nil || req.Amount <= 0 || req.Card == "" {
				return errors.New(`want {"amount": a positive integer, "card": a card token}`)
			}
			return nil
		},
		Steps: []idempotency.Step[*sql.Tx]{
			{Name: "processor", Foreign: func(ctx context.Context, s *idempotency.State) error {
				// The same derived key in every run: the processor charges once.
				result, err := callProcessor(ctx, processorURL, s.Key().Derive("charge"), s.Input())
				if err != nil {
					return err // transient: a retry or the Completer resumes here
				}
				s.Set("charge", result.Charge)
				s.Set("decline", result.Decline)
				return nil
			}},
			{Name: "record", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
				var req chargeRequest
				if err := json.Unmarshal(s.Input(), &req); err != nil {
					return err
				}
				status := "approved"
				if s.Get("decline") != "" {
					status = "declined"
				}
				var id int64
				if err := tx.QueryRowContext(ctx, `INSERT INTO payments (account, amount, status, charge)
					VALUES ($1, $2, $3, $4) RETURNING id`, s.Key().Scope, req.Amount, status, s.Get("charge")).Scan(&id); err != nil {
					return err
				}
				s.Set("payment", strconv.FormatInt(id, 10))
				if status == "declined" { // an answer, not a failure: stored with the row, replayed
					return idempotency.FinalAnswer(idempotency.Response{
						Status: http.StatusPaymentRequired,
						Header: http.Header{"Content-Type": {"application/json"}},
						Body:   fmt.Appendf(nil, `{"payment":%d,"status":"declined","reason":%q}`, id, s.Get("decline")),
					})
				}
				return nil
			}},
		},
		Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{
				Status: http.StatusCreated,
				Header: http.Header{"Content-Type": {"application/json"}},
				Body:   fmt.Appendf(nil, `{"payment":%s,"status":"approved","charge":%q}`, s.Get("payment"), s.Get("charge")),
			}, nil
		},
	}
}

// readme:end payments-operation

// processorResult is the processor's answer: a charge, or a decline.
type processorResult struct {
	Charge  string `json:"charge"`
	Decline string `json:"decline"`
}

// readme:begin payments-processor
// callProcessor asks the card processor to charge; key is its Idempotency-Key.
func callProcessor(ctx context.Context, url, key string, body []byte) (processorResult, error) {
	var result processorResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return result, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPaymentRequired {
		return result, fmt.Errorf("unexpected status %s", resp.Status)
	}
	return result, json.NewDecoder(resp.Body).Decode(&result)
}

// readme:end payments-processor

// readme:begin payments-purge
// purgeEvery deletes expired keys until ctx ends (every: an hour, say).
func purgeEvery(ctx context.Context, guard *idempotency.Guard[*sql.Tx], every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if _, err := guard.Purge(ctx); err != nil && ctx.Err() == nil {
				log.Printf("purge: %v", err) // the next tick tries again
			}
		}
	}
}

// readme:end payments-purge

// processor is a card processor stub: it charges once per Idempotency-Key,
// declines the card "card_declined" (402), and answers 503 while down > 0.
type processor struct {
	down    atomic.Int64
	mu      sync.Mutex
	charges map[string]string // key -> charge id
}

func (p *processor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.down.Add(-1) >= 0 {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	var req chargeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Card == "card_declined" {
		w.WriteHeader(http.StatusPaymentRequired)
		io.WriteString(w, `{"decline":"insufficient_funds"}`)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	if _, ok := p.charges[key]; !ok {
		p.charges[key] = fmt.Sprintf("ch_%d", len(p.charges)+1)
	}
	fmt.Fprintf(w, `{"charge":%q}`, p.charges[key])
}

// count is how many charges p made.
func (p *processor) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// TestPayments runs the service of docs/payments.md on a SQLite file.
func TestPayments(t *testing.T) {
	ctx := t.Context()
	path := os.Getenv(keepEnv)
	if path == "" {
		path = filepath.Join(t.TempDir(), "payments.db")
	} else if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	db, guard, err := openSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	runPayments(t, db, guard)
}

// TestPaymentsPostgres runs the same service on PostgreSQL, in a schema
// of its own.
func TestPaymentsPostgres(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx := t.Context()
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() }) // after the schema is dropped
	schema := fmt.Sprintf("paymentsdemo_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Error(err)
		}
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, guard, err := openPostgres(ctx, dsn+sep+"search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	runPayments(t, db, guard)
}

// reply is one answer of the service.
type reply struct {
	status   int
	body     string
	replayed bool
	problem  string // the problem type of an application/problem+json answer
}

// runPayments drives the service as clients would.
func runPayments(t *testing.T, db *sql.DB, guard *idempotency.Guard[*sql.Tx]) {
	ctx := t.Context()
	proc := &processor{charges: map[string]string{}}
	procSrv := httptest.NewServer(proc)
	defer procSrv.Close()
	handler, charge, err := routes(guard, procSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	defer srv.Close()

	post := func(path, token, key, body string) reply {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return reply{}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Error(err)
		}
		r := reply{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idemhttp.HeaderReplayed) == "true"}
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			var p idemhttp.Problem
			if err := json.Unmarshal(b, &p); err != nil {
				t.Errorf("problem %s: %v", b, err)
			}
			r.problem = p.Type
		}
		return r
	}
	rows := func(where string, args ...any) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE `+where, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The same request, 10 times at once and once more after: one row,
	// one answer byte for byte.
	const body = `{"amount":1999}`
	var wg sync.WaitGroup
	replies := make([]reply, 10)
	for i := range replies {
		wg.Go(func() { replies[i] = post("/payments", "tok_alice", "pay-1", body) })
	}
	wg.Wait()
	replies = append(replies, post("/payments", "tok_alice", "pay-1", body))
	first := replies[0]
	if first.status != http.StatusCreated || !strings.Contains(first.body, `"status":"recorded"`) {
		t.Fatalf("first answer: %+v", first)
	}
	for i, r := range replies {
		if r.status != first.status || r.body != first.body {
			t.Errorf("answer %d: %d %q, want %d %q", i, r.status, r.body, first.status, first.body)
		}
	}
	if !replies[len(replies)-1].replayed {
		t.Errorf("the later request was not replayed: %+v", replies[len(replies)-1])
	}
	if n := rows(`account = 'acct_alice'`); n != 1 {
		t.Errorf("payments rows after 11 requests with one key: %d, want 1", n)
	}

	// The same key with another body: 422, nothing written.
	if r := post("/payments", "tok_alice", "pay-1", `{"amount":5}`); r.status != http.StatusUnprocessableEntity || r.problem != idemhttp.ProblemMismatch {
		t.Errorf("same key, other body: %+v, want 422", r)
	}
	// Another account's same key and body: its own payment, never alice's answer.
	if r := post("/payments", "tok_bob", "pay-1", body); r.status != http.StatusCreated || r.replayed || r.body == first.body {
		t.Errorf("bob with alice's key: %+v, want a 201 of his own", r)
	}
	// No credential: 401 before anything is stored.
	if r := post("/payments", "tok_mallory", "pay-1", body); r.status != http.StatusUnauthorized {
		t.Errorf("unknown token: %+v, want 401", r)
	}
	if n := rows(`1 = 1`); n != 2 {
		t.Errorf("payments rows: %d, want 2 (alice's, bob's)", n)
	}

	// A charge: approved, then replayed; the processor charged once.
	charged := post("/charges", "tok_alice", "charge-1", `{"amount":500,"card":"card_ok"}`)
	if charged.status != http.StatusCreated || !strings.Contains(charged.body, `"charge":"ch_1"`) {
		t.Fatalf("charge: %+v", charged)
	}
	if r := post("/charges", "tok_alice", "charge-1", `{"amount":500,"card":"card_ok"}`); r.body != charged.body || !r.replayed {
		t.Errorf("charge retried: %+v, want the replay of %q", r, charged.body)
	}
	// A decline is an answer: stored with its row, replayed.
	declined := post("/charges", "tok_alice", "charge-2", `{"amount":700,"card":"card_declined"}`)
	if declined.status != http.StatusPaymentRequired || !strings.Contains(declined.body, "insufficient_funds") {
		t.Fatalf("decline: %+v", declined)
	}
	if r := post("/charges", "tok_alice", "charge-2", `{"amount":700,"card":"card_declined"}`); r.status != 402 || r.body != declined.body || !r.replayed {
		t.Errorf("decline retried: %+v, want the replay of %q", r, declined.body)
	}
	if n := rows(`status = 'declined'`); n != 1 {
		t.Errorf("declined rows: %d, want 1", n)
	}
	// A body Validate refuses: 400, nothing stored.
	if r := post("/charges", "tok_alice", "charge-4", `{"amount":-1}`); r.status != http.StatusBadRequest {
		t.Errorf("invalid charge: %+v, want 400", r)
	}

	// The processor is down: the operation stops at its Foreign step,
	// unfinished (503); the client never retries; the Completer finishes it.
	proc.down.Store(1)
	if r := post("/charges", "tok_alice", "charge-3", `{"amount":900,"card":"card_ok"}`); r.status != http.StatusServiceUnavailable || !strings.HasSuffix(r.problem, "ProblemUnfinished") {
		t.Fatalf("charge while the processor is down: %+v, want 503 ProblemUnfinished", r)
	}
	key := idempotency.Key{Scope: "acct_alice", ID: "charge-3"}
	info, err := guard.Inspect(ctx, key, false)
	if err != nil || info.State != idempotency.KeyUnfinished || info.Step != "processor" {
		t.Fatalf("inspect the unfinished charge: %+v, %v", info, err)
	}
	time.Sleep(20 * time.Millisecond) // past the Completer's Grace below
	// readme:begin payments-completer
	completer, err := idempotency.NewCompleter(guard, &idempotency.CompleterConfig{Grace: time.Millisecond}, charge)
	if err != nil {
		t.Fatal(err)
	}
	// A service runs go completer.Serve(ctx) instead: a pass every 30 s,
	// for keys whose run stopped at least Grace (1 minute) ago.
	report, err := completer.Once(ctx)
	if err != nil || report.Finished != 1 {
		t.Fatalf("completer: %+v, %v", report, err)
	}
	// readme:end payments-completer
	if r := post("/charges", "tok_alice", "charge-3", `{"amount":900,"card":"card_ok"}`); r.status != http.StatusCreated || !r.replayed || !strings.Contains(r.body, `"charge":"ch_2"`) {
		t.Errorf("charge finished by the Completer, retried: %+v", r)
	}
	if n := proc.count(); n != 2 {
		t.Errorf("processor charges: %d, want 2", n)
	}
	if n := rows(`status = 'approved'`); n != 2 {
		t.Errorf("approved rows: %d, want 2", n)
	}

	// Another charge left unfinished, for the purge to keep (and for
	// idemctl to show in the database keepEnv leaves).
	proc.down.Store(1)
	if r := post("/charges", "tok_alice", "charge-5", `{"amount":300,"card":"card_ok"}`); r.status != http.StatusServiceUnavailable {
		t.Fatalf("charge while the processor is down: %+v, want 503", r)
	}

	// An expired key is purged; the others stay, the unfinished one too.
	short, err := guard.WithTTL(time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	old := idempotency.Key{Scope: "acct_bob", ID: "expired-1"}
	if _, err := short.Do(ctx, old, idempotency.Fingerprint([]byte("x")), func(*sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: http.StatusCreated}, nil
	}); err != nil {
		t.Fatal(err)
	}
	purgeCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); purgeEvery(purgeCtx, guard, 5*time.Millisecond) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := guard.Inspect(ctx, old, false)
		if errors.Is(err, idempotency.ErrNotFound) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("expired key not purged: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	<-done
	for id, want := range map[string]idempotency.KeyState{"pay-1": idempotency.KeyCompleted, "charge-3": idempotency.KeyCompleted, "charge-5": idempotency.KeyUnfinished} {
		if info, err := guard.Inspect(ctx, idempotency.Key{Scope: "acct_alice", ID: id}, false); err != nil || info.State != want {
			t.Errorf("%s after the purge: %+v, %v; want %v", id, info, err, want)
		}
	}
}
