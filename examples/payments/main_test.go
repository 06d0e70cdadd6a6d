package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
)

func TestPaymentsSQLite(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 60*time.Second)
	a, err := open(ctx, filepath.Join(t.TempDir(), "payments.db"), defaultTables)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	testPayments(t, a)
}

func TestPaymentsPostgres(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 60*time.Second)
	dsn := testenv.PostgresDSN(t)
	suffix := testkit.Name("")
	names := tables{Payments: "payments_" + suffix, Keys: "idempotency_keys_" + suffix}
	pgkit.DropAtCleanup(t, dsn, "TABLE", names.Payments, names.Keys)
	a, err := openPostgres(ctx, dsn, names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	testPayments(t, a)
}

type answer struct {
	status   int
	ctype    string
	replayed bool
	body     []byte
}

func read(t *testing.T, resp *http.Response, err error) answer {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get(idemhttp.HeaderReplayed) == "true", body}
}

func newPost(t *testing.T, ctx context.Context, url, body, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
	}
	return req
}

func wantProblem(t *testing.T, a answer, status int, typ string) {
	t.Helper()
	var p idemhttp.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	if a.status != status || a.ctype != "application/problem+json" || p.Status != status || p.Type != typ {
		t.Errorf("got %d %s %+v; want %d application/problem+json type %s", a.status, a.ctype, p, status, typ)
	}
}

func testPayments(t *testing.T, a *app) {
	ctx := testkit.Context(t, 60*time.Second)
	srv := httptest.NewServer(a.handler)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport}}
	key := `"` + idemhttp.NewKeyID() + `"`

	// 20 concurrent requests, one key, released together.
	const n = 20
	answers := make([]answer, n)
	testkit.Together(n, func(i int) {
		resp, err := client.Do(newPost(t, ctx, srv.URL, `{"orderId":42,"amount":1999}`, key))
		answers[i] = read(t, resp, err)
	})

	rows, err := a.payments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Errorf("%d payment rows after %d requests with one key, want 1", rows, n)
	}
	replayed := 0
	for i, ans := range answers {
		if ans.replayed {
			replayed++
		}
		if ans.status != http.StatusCreated || !bytes.Equal(ans.body, answers[0].body) {
			t.Errorf("answer %d: %d %s; want 201 %s", i, ans.status, ans.body, answers[0].body)
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replayed answers, want %d", replayed, n-1)
	}
	var r receipt
	if err := json.Unmarshal(answers[0].body, &r); err != nil {
		t.Fatalf("body %q: %v", answers[0].body, err)
	}
	if r.ID == "" || r.OrderID != 42 || r.Amount != 1999 || r.Status != "approved" {
		t.Errorf("receipt %+v", r)
	}

	// The same key with another amount: 422, nothing paid.
	resp, err := client.Do(newPost(t, ctx, srv.URL, `{"orderId":42,"amount":2000}`, key))
	wantProblem(t, read(t, resp, err), http.StatusUnprocessableEntity, idemhttp.ProblemMismatch)

	// No key (a plain client, which adds none): 400.
	resp, err = srv.Client().Do(newPost(t, ctx, srv.URL, `{"orderId":43,"amount":1}`, ""))
	wantProblem(t, read(t, resp, err), http.StatusBadRequest, "https://pkg.go.dev/github.com/go-idempotency/idempotency/idemhttp#ProblemMissingKey")

	if rows, err := a.payments(ctx); err != nil || rows != 1 {
		t.Errorf("%d payment rows (err %v) at the end, want 1", rows, err)
	}
}
