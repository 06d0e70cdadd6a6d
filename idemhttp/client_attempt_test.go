package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestTransportErrorCarriesKey: when no attempt got an answer (the server
// hung up on each; the caller's deadline ended while the server worked),
// ErrorKey reads from the error the key every attempt carried, and the
// error's text names no key. A retry of the operation
// later, sent with that key, reaches the server with the same key: without
// it, sending the request again would generate a new key, and the server
// would run the operation a second time.
func TestTransportErrorCarriesKey(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, err error, rec *recorder, attempts int) string {
		t.Helper()
		header, key, ok := idemhttp.ErrorKey(err)
		if !ok {
			t.Fatalf("ErrorKey(%v) (%T): not ok", err, err)
		}
		sent := sameKey(t, rec, attempts, `{"a":1}`)
		if key != sent || header != idemhttp.DefaultKeyHeader {
			t.Errorf("ErrorKey: header %q, key %q; the server saw key %q", header, key, sent)
		}
		if strings.Contains(err.Error(), strings.Trim(key, `"`)) {
			t.Errorf("the error's text names the key: %v", err)
		}
		return key
	}
	t.Run("HangUp", func(t *testing.T) {
		t.Parallel()
		rec, srv := startRecorder(t, hangUp)
		tr := fastTransport(srv)
		_, err := client(tr).Do(post(t, testkit.Context(t, 20*time.Second), srv.URL, `{"a":1}`))
		key := check(t, err, rec, tr.MaxAttempts)

		// The operation tried again later, with the key of the error.
		rec.mu.Lock()
		rec.script = []func(http.ResponseWriter, *http.Request){status(http.StatusCreated)}
		rec.mu.Unlock()
		req := post(t, testkit.Context(t, 20*time.Second), srv.URL, `{"a":1}`)
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
		resp, body := do(t, tr, req)
		if resp.StatusCode != http.StatusCreated || body != "Created" {
			t.Fatalf("the retry with the error's key: %d %q", resp.StatusCode, body)
		}
		sameKey(t, rec, tr.MaxAttempts+1, `{"a":1}`)
	})
	t.Run("Deadline", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		rec, srv := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			select { // the operation runs; its answer comes too late
			case <-release:
			case <-r.Context().Done():
			}
		})
		ctx, cancel := context.WithTimeout(testkit.Context(t, 20*time.Second), 200*time.Millisecond)
		defer cancel()
		_, err := client(fastTransport(srv)).Do(post(t, ctx, srv.URL, `{"a":1}`))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v, want the deadline", err)
		}
		check(t, err, rec, 1)
		if _, _, ok := idemhttp.ErrorKey(context.DeadlineExceeded); ok {
			t.Error("ErrorKey of an error of no Transport: ok")
		}
	})
}
