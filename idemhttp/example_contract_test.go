package idemhttp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
)

// Two routes of one Guard keep their keys for different times; every
// answer says until when, browsers may read it, and problems link to the
// service's documentation.
func ExampleConfig_lifetime() {
	guard, _, cleanup := exampleGuard()
	defer cleanup()
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":1}`)
	})

	// readme:begin http-lifetime
	base := idemhttp.Options{
		Scope:            accountScope,
		ExposeHeaders:    true,                                          // Access-Control-Expose-Headers for browsers
		ProblemDocs:      "https://docs.example.com/errors/idempotency", // Link: <...>; rel="describedby" on problems
		InProgressStatus: http.StatusTooEarly,                           // 425 instead of 409 for "in progress"
	}
	if err := base.Validate(); err != nil {
		log.Fatal(err)
	}
	payments, orders := base, base
	payments.TTL = 72 * time.Hour // this route's keys; the Guard's TTL (24h) for the others
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idemhttp.Middleware(guard, &payments)(created))
	mux.Handle("POST /orders", idemhttp.Middleware(guard, &orders)(created))
	// readme:end http-lifetime

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct{ path, key string }{{"/payments", "k-0123456789"}, {"/orders", "k-abcdefghij"}, {"/orders", ""}} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+c.path, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer acct-1")
		if c.key != "" {
			req.Header.Set(idemhttp.DefaultKeyHeader, c.key)
		}
		sent := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lifetime := "-"
		if expires, err := http.ParseTime(resp.Header.Get(idemhttp.HeaderKeyExpires)); err == nil {
			lifetime = expires.Sub(sent).Round(time.Hour).String()
		}
		fmt.Println(strings.TrimSpace(fmt.Sprintln(c.path, resp.StatusCode, lifetime, resp.Header.Get("Link"))))
		fmt.Println(" ", resp.Header.Get("Access-Control-Expose-Headers"))
	}
	// Output:
	// /payments 201 72h0m0s
	//   Idempotent-Replayed, Idempotency-Key-Expires
	// /orders 201 24h0m0s
	//   Idempotent-Replayed, Idempotency-Key-Expires
	// /orders 400 - <https://docs.example.com/errors/idempotency>; rel="describedby"
	//   Link
}

// The OpenAPI fragment of a guarded operation, merged into the service's
// own document.
func ExampleOpenAPI() {
	// readme:begin http-openapi
	fragment, err := idemhttp.OpenAPI(&idemhttp.Options{ValidateKey: idemhttp.UUIDKey, InProgressStatus: http.StatusTooEarly})
	if err != nil {
		log.Fatal(err)
	}
	var doc map[string]any // the service's document, read with encoding/json
	if err := json.Unmarshal([]byte(`{"openapi": "3.1.0", "info": {"title": "payments", "version": "1"},
		"paths": {"/payments": {"post": {"responses": {"201": {"description": "Created"}}}}}}`), &doc); err != nil {
		log.Fatal(err)
	}
	if err := fragment.AddTo(doc, "/payments", "POST"); err != nil {
		log.Fatal(err)
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	// readme:end http-openapi
	if err != nil {
		log.Fatal(err)
	}
	var back struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name   string
				Schema map[string]any
			}
			Responses map[string]struct {
				Headers map[string]any
			}
		}
	}
	_ = json.Unmarshal(out, &back)
	op := back.Paths["/payments"]["post"]
	fmt.Println(op.Parameters[0].Name, op.Parameters[0].Schema["format"], op.Parameters[0].Schema["maxLength"])
	for _, code := range []string{"201", "400", "409", "413", "422", "425", "429", "500", "503"} {
		r, ok := op.Responses[code]
		fmt.Println(code, ok, len(r.Headers))
	}
	// Output:
	// Idempotency-Key uuid 36
	// 201 true 2
	// 400 true 0
	// 409 false 0
	// 413 true 0
	// 422 true 0
	// 425 true 2
	// 429 true 1
	// 500 true 0
	// 503 true 1
}

// A client whose retry would arrive after the server forgets the key
// stops, with an error that says so.
func ExampleErrKeyExpired() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// In progress, and the key is kept only until now (a short TTL).
		w.Header().Set("Retry-After", "1")
		w.Header().Set(idemhttp.HeaderKeyExpires, time.Now().UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"type":%q,"title":"In progress","status":409}`, idemhttp.ProblemInProgress)
	}))
	defer srv.Close()

	// readme:begin http-client-expiry
	client := &http.Client{Transport: &idemhttp.Transport{}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1999}`))
	resp, err := client.Do(req)
	switch {
	case errors.Is(err, idemhttp.ErrKeyExpired):
		// The operation may have run once; a retry could run it again.
		// Look the payment up before sending it with a new key.
		fmt.Println("not retried: the key expires before the retry")
	case err != nil:
		log.Fatal(err)
	default:
		defer resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	// readme:end http-client-expiry
	// Output:
	// not retried: the key expires before the retry
}
