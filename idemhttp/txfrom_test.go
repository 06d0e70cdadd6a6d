package idemhttp_test

import (
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestTxFromWrongType: a handler that asks for another transaction type
// than the Guard's (TxFrom[*sql.Tx] on a Guard of *memstore.Tx, as on a
// pgx Guard) stops at that call, before any write, with a panic whose
// message names both types. It got a nil transaction (and ok false, which
// the docs' examples ignored), then a nil dereference on its first
// statement. The key stays free: a corrected handler runs.
func TestTxFromWrongType(t *testing.T) {
	ctx := testkit.Context(t, 5*time.Second)
	s := memstore.New()
	g, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw := idemhttp.Middleware(g, &idemhttp.Options{Scope: idemhttp.SharedScope})
	reached := false
	wrong := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[*sql.Tx](r.Context())
		reached = true
		if !ok {
			http.Error(w, "not guarded", http.StatusInternalServerError)
			return
		}
		_, _ = tx.ExecContext(r.Context(), "INSERT")
	}))
	req := func() *http.Request {
		r := httptest.NewRequestWithContext(ctx, "POST", "/pay", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "k1")
		return r
	}
	func() {
		defer func() {
			e, ok := recover().(error)
			if !ok || !strings.Contains(e.Error(), "TxFrom[*sql.Tx]") || !strings.Contains(e.Error(), "call TxFrom[*memstore.Tx]") {
				t.Fatalf("recovered %v; want an error naming *sql.Tx and *memstore.Tx", e)
			}
		}()
		wrong.ServeHTTP(httptest.NewRecorder(), req())
		t.Fatal("the handler returned; want a panic at TxFrom")
	}()
	if reached {
		t.Fatal("the handler went on past TxFrom")
	}
	right := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[*memstore.Tx](r.Context())
		if !ok {
			http.Error(w, "not guarded", http.StatusInternalServerError)
			return
		}
		tx.Effect("paid")
		w.WriteHeader(http.StatusCreated)
	}))
	rec := httptest.NewRecorder()
	right.ServeHTTP(rec, req())
	if rec.Code != http.StatusCreated || s.Count("paid") != 1 {
		t.Fatalf("the corrected handler: %d, %d effects; want 201 and 1", rec.Code, s.Count("paid"))
	}
}
