package idemhttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-idempotency/idempotency/idemhttp"
)

// A service whose clients are Stripe's SDKs: form bodies, errors as
// Stripe's error object, the key echoed on every answer.
func ExampleWriteStripeError() {
	guard, _, cleanup := exampleGuard()
	defer cleanup()

	// readme:begin http-stripe-config
	cfg := &idemhttp.Options{
		Scope:         accountScope,
		RenderProblem: idemhttp.WriteStripeError, // {"error":{...}} instead of problem+json
		EchoKey:       true,                      // Idempotency-Key on every answer, replays included
	}
	// readme:end http-stripe-config

	h := idemhttp.Middleware(guard, cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cus_1","object":"customer"}`)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/customers", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", "cus-create-1")
		req.Header.Set("Authorization", "Bearer acct-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Key"), resp.Header.Get("Idempotent-Replayed"), string(b))
	}
	send("name=Jane+Doe&metadata[order]=7")
	send("metadata%5Border%5D=7&name=Jane%20Doe") // the same parameters: replayed
	send("metadata[order]=8&name=Jane+Doe")       // another order id: refused
	// Output:
	// 200 cus-create-1  {"id":"cus_1","object":"customer"}
	// 200 cus-create-1 true {"id":"cus_1","object":"customer"}
	// 422 cus-create-1  {"error":{"type":"idempotency_error","code":"idempotency_key_reused","message":"Idempotency-Key is already used. This key was used with a different request (method, route or body); use a new key for a new request.","doc_url":"https://pkg.go.dev/github.com/go-idempotency/idempotency/idemhttp#ProblemKeyReused"}}
}

// RenderProblem chooses the format per request: Stripe's error object for
// the Stripe SDKs, problem documents for idemhttp.Transport and the rest.
func ExampleWriteStripeError_perClient() {
	guard, _, cleanup := exampleGuard()
	defer cleanup()
	cfg := &idemhttp.Options{
		Scope: accountScope,
		// readme:begin http-stripe-per-client
		RenderProblem: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			if r.Header.Get("Stripe-Version") != "" { // the Stripe SDKs send it
				idemhttp.WriteStripeError(w, r, p)
				return
			}
			idemhttp.WriteProblem(w, p)
		},
		// readme:end http-stripe-per-client
	}
	srv := httptest.NewServer(idemhttp.Middleware(guard, cfg)(http.NotFoundHandler()))
	defer srv.Close()
	for _, version := range []string{"2026-11-17", ""} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/customers", nil)
		req.Header.Set("Authorization", "Bearer acct-1")
		if version != "" {
			req.Header.Set("Stripe-Version", version)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// Output:
	// 400 application/json
	// 400 application/problem+json
}
