package idemhttp_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/observe"
)

// A quota per account, kept in the store: two new keys an hour, five
// requests at once, 1 MiB of stored answers an hour. The third new key is
// refused with 429 and Retry-After; the retry of a payment already made is
// still answered.
func ExampleConfig_quota() {
	guard, _, cleanup := exampleGuard()
	defer cleanup()
	overQuota := &labelCounter{count: map[string]int{}} // stands for a metric's counter vector

	// readme:begin http-quota
	cfg := &idemhttp.Options{
		Scope: accountScope, // quotas are per scope: here, per account
		Quota: &idempotency.Quota{
			Window:      time.Hour, // fixed windows, by the store's clock
			MaxKeys:     2,         // new keys per window (replays are free)
			MaxInFlight: 5,         // requests of the account running at once
			MaxBytes:    1 << 20,   // bytes of stored answers per window
		},
		Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
			if ev.Outcome == observe.OverQuota {
				overQuota.WithLabelValues(ev.QuotaLimit).Inc() // "keys", "in_flight", "bytes"
			}
		},
	}
	if err := cfg.Validate(); err != nil { // an invalid quota fails here, at start-up
		log.Fatal(err)
	}
	// readme:end http-quota

	h := idemhttp.Middleware(guard, cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, key := range []string{"order-1", "order-2", "order-3", "order-1"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acct-42")
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(key, resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), resp.Header.Get("Retry-After") != "")
	}
	fmt.Println("refusals counted:", overQuota.count["keys"])
	// Output:
	// order-1 201  false
	// order-2 201  false
	// order-3 429  true
	// order-1 201 true false
	// refusals counted: 1
}

// labelCounter stands for a metrics counter with one label.
type labelCounter struct {
	label string
	count map[string]int
}

func (c *labelCounter) WithLabelValues(v string) *labelCounter { c.label = v; return c }
func (c *labelCounter) Inc()                                   { c.count[c.label]++ }
