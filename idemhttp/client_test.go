package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// recorder is a test server that answers attempt n with script[n-1] (the
// last entry repeats) and records the key and body of every attempt.
type recorder struct {
	mu     sync.Mutex
	keys   []string // raw Idempotency-Key values; "<none>" when absent
	bodies []string
	script []func(w http.ResponseWriter, r *http.Request)
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	key := "<none>"
	if v := r.Header.Values(idemhttp.DefaultKeyHeader); len(v) > 0 {
		key = strings.Join(v, "|")
	}
	rec.keys = append(rec.keys, key)
	rec.bodies = append(rec.bodies, string(body))
	step := rec.script[min(len(rec.keys), len(rec.script))-1]
	rec.mu.Unlock()
	step(w, r)
}

func (rec *recorder) seen() (keys, bodies []string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.keys...), append([]string(nil), rec.bodies...)
}

func status(code int, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, http.StatusText(code))
	}
}

// hangUp closes the connection without a response: a network error.
func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func startRecorder(t *testing.T, script ...func(http.ResponseWriter, *http.Request)) (*recorder, *httptest.Server) {
	t.Helper()
	rec := &recorder{script: script}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	return rec, srv
}

func fastTransport(srv *httptest.Server) *idemhttp.Transport {
	return &idemhttp.Transport{Base: srv.Client().Transport, MaxAttempts: 4, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}
}

// client returns an http.Client that sends through tr.
func client(tr *idemhttp.Transport) *http.Client { return &http.Client{Transport: tr} }

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

func do(t *testing.T, c *idemhttp.Transport, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := client(c).Do(req)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// sameKey checks that every attempt carried one, identical, key and body.
func sameKey(t *testing.T, rec *recorder, wantAttempts int, wantBody string) string {
	t.Helper()
	keys, bodies := rec.seen()
	if len(keys) != wantAttempts {
		t.Fatalf("server saw %d attempts, want %d (keys %q)", len(keys), wantAttempts, keys)
	}
	for i := range keys {
		if keys[i] != keys[0] || keys[i] == "<none>" {
			t.Errorf("attempt %d key %q, attempt 1 key %q: the key must be present and never change", i+1, keys[i], keys[0])
		}
		if bodies[i] != wantBody {
			t.Errorf("attempt %d body %q, want %q", i+1, bodies[i], wantBody)
		}
	}
	return keys[0]
}

func TestTransportRetriesWithOneKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		first func(http.ResponseWriter, *http.Request)
	}{
		{"NetworkError", hangUp},
		{"409InProgress", inProgress},
		{"409RetryAfter", status(http.StatusConflict, "Retry-After", "0")},
		{"429", status(http.StatusTooManyRequests)},
		{"500", status(http.StatusInternalServerError)},
		{"503", status(http.StatusServiceUnavailable)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec, srv := startRecorder(t, tc.first, tc.first, status(http.StatusCreated))
			resp, body := do(t, fastTransport(srv), post(t, testkit.Context(t, 20*time.Second), srv.URL, `{"a":1}`))
			if resp.StatusCode != http.StatusCreated || body != "Created" {
				t.Fatalf("got %d %q, want 201 Created", resp.StatusCode, body)
			}
			key := sameKey(t, rec, 3, `{"a":1}`)
			if got := resp.Request.Header.Get(idemhttp.DefaultKeyHeader); got != key {
				t.Errorf("resp.Request key %q, server saw %q", got, key)
			}
		})
	}
}

func TestTransportGeneratesDistinctQuotedKeys(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusCreated))
	c := fastTransport(srv)
	for range 3 {
		do(t, c, post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	}
	keys, _ := rec.seen()
	if len(keys) != 3 || keys[0] == keys[1] || keys[1] == keys[2] || keys[0] == keys[2] {
		t.Fatalf("keys %q: each logical request needs its own key", keys)
	}
	for _, k := range keys {
		if len(k) != 38 || k[0] != '"' || k[37] != '"' {
			t.Errorf("key %q is not a quoted UUID sf-string", k)
		}
	}
}

func TestTransportKeepsCallersKey(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable), status(http.StatusOK))
	req := post(t, testkit.Context(t, 20*time.Second), srv.URL, `x`)
	req.Header.Set(idemhttp.DefaultKeyHeader, "my-own-key")
	resp, _ := do(t, fastTransport(srv), req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	if key := sameKey(t, rec, 2, "x"); key != "my-own-key" {
		t.Errorf("server saw key %q, want the caller's my-own-key", key)
	}
	if got := req.Header.Get(idemhttp.DefaultKeyHeader); got != "my-own-key" {
		t.Errorf("the caller's request was modified: key %q", got)
	}
}

// TestTransportKeepsCallersKeyAnySpelling: a key header set in the map
// under a name that is not canonical is the caller's key too: no second,
// generated key is sent beside it (the server would refuse two keys).
func TestTransportKeepsCallersKeyAnySpelling(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable), status(http.StatusOK))
	req := post(t, testkit.Context(t, 20*time.Second), srv.URL, `x`)
	req.Header["idempotency-key"] = []string{"my-own-key"}
	resp, _ := do(t, fastTransport(srv), req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	if key := sameKey(t, rec, 2, "x"); key != "my-own-key" {
		t.Errorf("server saw key %q, want only the caller's my-own-key", key)
	}
}

func TestTransportNeverRetriesOther4xx(t *testing.T) {
	t.Parallel()
	for _, code := range []int{400, 401, 404, 413, 422} {
		rec, srv := startRecorder(t, status(code), status(http.StatusCreated))
		resp, body := do(t, fastTransport(srv), post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
		if resp.StatusCode != code || body != http.StatusText(code) {
			t.Errorf("got %d %q, want %d", resp.StatusCode, body, code)
		}
		sameKey(t, rec, 1, `{}`)
	}
}

func TestTransportNoKeyNoRetry(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		rec, srv := startRecorder(t, status(http.StatusServiceUnavailable), status(http.StatusOK))
		req, err := http.NewRequestWithContext(testkit.Context(t, 20*time.Second), method, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, _ := do(t, fastTransport(srv), req)
		keys, _ := rec.seen()
		if resp.StatusCode != http.StatusServiceUnavailable || len(keys) != 1 || keys[0] != "<none>" {
			t.Errorf("%s: status %d, keys %q; want one attempt without a key, 503", method, resp.StatusCode, keys)
		}
	}
	// A method outside Methods is retried when the caller gives it a key.
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable), status(http.StatusOK))
	req, _ := http.NewRequestWithContext(testkit.Context(t, 20*time.Second), http.MethodPut, srv.URL, strings.NewReader("p"))
	req.Header.Set(idemhttp.DefaultKeyHeader, `"k"`)
	if resp, _ := do(t, fastTransport(srv), req); resp.StatusCode != http.StatusOK {
		t.Errorf("PUT with a key: status %d, want 200 after a retry", resp.StatusCode)
	}
	sameKey(t, rec, 2, "p")
}

func TestTransportGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusBadGateway))
	resp, body := do(t, fastTransport(srv), post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	if resp.StatusCode != http.StatusBadGateway || body != "Bad Gateway" {
		t.Errorf("got %d %q; want the last 502 with its body", resp.StatusCode, body)
	}
	sameKey(t, rec, 4, `{}`)

	rec, srv = startRecorder(t, hangUp)
	_, err := client(fastTransport(srv)).Do(post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	if err == nil || !strings.Contains(err.Error(), "attempt 4 of 4") {
		t.Errorf("err = %v; want the last network error after 4 attempts", err)
	}
	sameKey(t, rec, 4, `{}`)
}

func TestTransportBodyWithoutGetBody(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable), status(http.StatusCreated))
	req := post(t, testkit.Context(t, 20*time.Second), srv.URL, "")
	req.Body = io.NopCloser(io.MultiReader(strings.NewReader("one "), strings.NewReader("stream")))
	req.GetBody = nil
	req.ContentLength = -1
	if resp, _ := do(t, fastTransport(srv), req); resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	sameKey(t, rec, 2, "one stream")
}

func TestTransportHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		value func() string
		min   time.Duration
	}{
		{"Seconds", func() string { return "1" }, 900 * time.Millisecond},
		// HTTP-dates have whole seconds: 2s ahead is at least 1s ahead.
		{"HTTPDate", func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, 900 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var times []time.Time
			stamp := func(next func(http.ResponseWriter, *http.Request)) func(http.ResponseWriter, *http.Request) {
				return func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					times = append(times, time.Now())
					mu.Unlock()
					next(w, r)
				}
			}
			rec, srv := startRecorder(t,
				func(w http.ResponseWriter, r *http.Request) {
					stamp(status(http.StatusTooManyRequests, "Retry-After", tc.value()))(w, r)
				},
				stamp(status(http.StatusCreated)))
			c := fastTransport(srv)
			c.MaxDelay = 5 * time.Second
			c.BaseDelay = time.Millisecond
			if resp, _ := do(t, c, post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`)); resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d, want 201", resp.StatusCode)
			}
			sameKey(t, rec, 2, `{}`)
			if gap := times[1].Sub(times[0]); gap < tc.min {
				t.Errorf("second attempt %v after the first; Retry-After asked for at least %v", gap, tc.min)
			}
		})
	}
}

func TestTransportRetryAfterBeyondMaxDelay(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable, "Retry-After", "3600"), status(http.StatusCreated))
	resp, _ := do(t, fastTransport(srv), post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "3600" {
		t.Errorf("status %d; want the 503 returned as is when Retry-After exceeds MaxDelay", resp.StatusCode)
	}
	sameKey(t, rec, 1, `{}`)
}

func TestTransportStopsWithContext(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable, "Retry-After", "600"))
	ctx, cancel := context.WithCancel(context.Background()) // no deadline: the wait starts
	defer cancel()
	c := fastTransport(srv)
	c.MaxDelay = time.Hour
	done := make(chan error, 1)
	go func() {
		_, err := client(c).Do(post(t, ctx, srv.URL, `{}`))
		done <- err
	}()
	for {
		if keys, _ := rec.seen(); len(keys) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not return after its context was cancelled")
	}
	sameKey(t, rec, 1, `{}`)

	// A wait that would pass the deadline is not started: the last
	// response is returned.
	rec, srv = startRecorder(t, status(http.StatusServiceUnavailable, "Retry-After", "2"))
	c = fastTransport(srv)
	c.MaxDelay = time.Minute
	dctx, dcancel := context.WithTimeout(testkit.Context(t, 20*time.Second), time.Second)
	defer dcancel()
	resp, body := do(t, c, post(t, dctx, srv.URL, `{}`))
	if resp.StatusCode != http.StatusServiceUnavailable || body != "Service Unavailable" {
		t.Errorf("got %d %q; want the 503 when Retry-After passes the deadline", resp.StatusCode, body)
	}
	sameKey(t, rec, 1, `{}`)
}
