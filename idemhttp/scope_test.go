package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
)

func testScope[Tx any](t *testing.T, e env[Tx]) {
	opts := &idemhttp.Options{Scope: func(r *http.Request) (string, error) {
		acct := r.Header.Get("X-Account")
		if acct == "" {
			return "", &idemhttp.Problem{Type: "https://example.com/unauthorized", Title: "Unauthorized", Status: 401, Detail: "no account"}
		}
		return acct, nil
	}}
	s := startServer(t, e, nil, opts, created)
	post := func(acct string) result {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/things", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.DefaultKeyHeader, "shared")
		if acct != "" {
			req.Header.Set("X-Account", acct)
		}
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return result{resp.StatusCode, resp.Header, b}
	}
	a, b := post("alice"), post("bob")
	wantStatus(t, a, http.StatusCreated)
	wantStatus(t, b, http.StatusCreated)
	if bytes.Equal(a.body, b.body) {
		t.Error("two scopes shared one response")
	}
	wantReplay(t, a, post("alice"))
	wantProblem(t, post(""), 401, "https://example.com/unauthorized")
	s.wantCalls(t, 2)
	s.wantEffects(t, "alice/shared", 1)
	s.wantEffects(t, "bob/shared", 1)

	// A Scope failure that is not a Problem fails closed with 500.
	var causes atomic.Int64
	f := startServer(t, e, nil, &idemhttp.Options{
		Scope:   func(*http.Request) (string, error) { return "", errors.New("auth backend down") },
		OnError: func(*http.Request, error) { causes.Add(1) },
	}, created)
	wantProblem(t, f.post(t, `{}`, "k"), 500, idemhttp.ProblemInternal)
	f.wantCalls(t, 0)
	if causes.Load() != 1 {
		t.Errorf("OnError called %d times, want 1", causes.Load())
	}
}

func TestNilGuardFailsClosed(t *testing.T) {
	t.Parallel()
	var ran atomic.Bool
	h := idemhttp.Middleware[any](nil, &idemhttp.Options{Scope: idemhttp.SharedScope})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Store(true) }))
	srv := httptest.NewServer(h)
	defer srv.Close()
	s := &server[any]{Server: srv}
	wantProblem(t, s.post(t, `{}`, "k"), 500, idemhttp.ProblemInternal)
	if ran.Load() {
		t.Error("the handler ran without a guard")
	}
}
