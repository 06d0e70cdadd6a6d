package idemhttp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
)

// A retry predicate of one's own: retry what DefaultRetry retries and also
// a provider's 423 Locked; count the retries; share one budget; send the
// key in X-Idempotency-Key.
func ExampleTransport_retry() {
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch attempts.Add(1) {
		case 1:
			w.WriteHeader(http.StatusLocked)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	var retries atomic.Int32

	// readme:begin http-client-retry
	budget := idemhttp.NewRetryBudget(0.1, 10) // one per service, shared by all its clients
	client := &http.Client{Transport: &idemhttp.Transport{
		KeyHeader:   "X-Idempotency-Key", // default "Idempotency-Key"
		MaxAttempts: 4,
		BaseDelay:   10 * time.Millisecond,
		Budget:      budget,
		Retry: func(resp *http.Response, err error) bool {
			return idemhttp.DefaultRetry(resp, err) || resp != nil && resp.StatusCode == http.StatusLocked
		},
		OnRetry: func(ev idemhttp.RetryEvent) { retries.Add(1) },
	}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1999}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req) // one key, generated before the first attempt, on every attempt
	// readme:end http-client-retry
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", attempts.Load(), "attempts,", retries.Load(), "retry; key sent:",
		resp.Request.Header.Get("X-Idempotency-Key") != "")
	// Output: 201 after 2 attempts, 1 retry; key sent: true
}
