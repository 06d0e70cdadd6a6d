package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/examples/checkout/internal/processor"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// inProcess is the service on a SQLite file in the test process.
func inProcess(t *testing.T, ctx context.Context) (*fixture, string) {
	t.Helper()
	f := newFixture(t, ctx, storeKinds[0])
	a, err := open(ctx, f.dsn, newTables(f.prefix), config{processor: f.stub.URL, lease: 5 * time.Second, chargeTimeout: time.Second, logf: t.Logf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	srv := httptest.NewServer(a.handler)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// A checkout charges once and stores its answer; a retry gets it byte for
// byte, replayed; another body with the key is refused.
func TestCheckout(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	f, url := inProcess(t, ctx)
	first := post(ctx, url, "order-1", 1999)
	if first.status != 201 || !bytes.HasPrefix(first.body, []byte(`{"order_id":"ord_`)) {
		t.Fatalf("got %v, want 201 and a receipt", first)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/checkout", strings.NewReader(`{"email":"ann@example.com","amount":1999}`))
	req.Header.Set("Idempotency-Key", `"order-1"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || resp.Header.Get(HeaderReplayed) != "true" {
		t.Errorf("retry: got %d, %s %q; want 201 replayed", resp.StatusCode, HeaderReplayed, resp.Header.Get(HeaderReplayed))
	}
	again := post(ctx, url, "order-1", 1999)
	if other := post(ctx, url, "order-1", 2000); other.status != http.StatusUnprocessableEntity {
		t.Errorf("another body with the key: got %v, want 422", other)
	}
	f.checkKey(ctx, "order-1", false, []answer{first, again})
	if f.proc.Charges() != 1 || f.proc.Requests() != 1 {
		t.Errorf("the processor saw %d requests, made %d charges; want 1 and 1", f.proc.Requests(), f.proc.Charges())
	}
}

// A declined card is a stored 402: the order marked declined, no receipt,
// no e-mail.
func TestCheckoutDeclined(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	f, url := inProcess(t, ctx)
	f.proc.Decline(declinedAmount)
	first := post(ctx, url, "order-2", declinedAmount)
	if first.status != 402 || !bytes.Contains(first.body, []byte(`"status":"declined"`)) {
		t.Fatalf("got %v, want 402 declined", first)
	}
	again := post(ctx, url, "order-2", declinedAmount)
	f.checkKey(ctx, "order-2", true, []answer{first, again})
	if f.proc.Declines() != 1 || f.proc.Requests() != 1 {
		t.Errorf("the processor saw %d requests, %d declines; want 1 and 1", f.proc.Requests(), f.proc.Declines())
	}
}

// A processor failing with 503 leaves the key unfinished at the charge: the
// client gets 503, its retry resumes there (no second order) and charges
// once.
func TestCheckoutProcessorDown(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	f, url := inProcess(t, ctx)
	f.proc.FailNext(2)
	var answers []answer
	for range 2 {
		a := post(ctx, url, "order-3", 1999)
		if a.status != http.StatusServiceUnavailable {
			t.Fatalf("got %v, want 503", a)
		}
		answers = append(answers, a)
	}
	info, err := f.app.inspect(ctx, keyOf("order-3"))
	if err != nil || info.State != idempotency.KeyUnfinished || info.Step != "charge" || info.Tries != 2 {
		t.Fatalf("after two failures: %+v, %v; want unfinished at charge with 2 tries", info, err)
	}
	final := post(ctx, url, "order-3", 1999)
	if final.status != 201 {
		t.Fatalf("got %v, want 201", final)
	}
	f.checkKey(ctx, "order-3", false, append(answers, final))
	if f.proc.Charges() != 1 || f.proc.Requests() != 3 {
		t.Errorf("the processor saw %d requests, made %d charges; want 3 and 1", f.proc.Requests(), f.proc.Charges())
	}
}

// Bad requests are refused before anything is written.
func TestCheckoutBadRequest(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	f, url := inProcess(t, ctx)
	for _, c := range []struct{ key, body string }{
		{"", `{"amount": 1, "email": "a@b"}`},
		{strings.Repeat("k", 256), `{"amount": 1, "email": "a@b"}`},
		{"k", `{"amount": 0, "email": "a@b"}`},
		{"k", `{"amount": 1, "email": "nobody"}`},
		{"k", `{"amount": 1, "email": "a@b", "coupon": "x"}`},
		{"k", `not json`},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/checkout", strings.NewReader(c.body))
		req.Header.Set("Idempotency-Key", c.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("key %q body %s: got %d, want 400", c.key, c.body, resp.StatusCode)
		}
	}
	st, err := f.app.stats(ctx)
	if err != nil || st != (idempotency.Stats{}) || f.proc.Requests() != 0 {
		t.Errorf("stats %+v (%v), %d processor requests; want nothing", st, err, f.proc.Requests())
	}
	// Nothing was stored: the corrected body with the same key runs.
	if a := post(ctx, url, "k", 5); a.status != http.StatusCreated {
		t.Errorf("the corrected body with the key: got %v, want 201", a)
	}
}

// The stores the service refuses, and bad hooks and flags.
func TestRefused(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	for _, dsn := range []string{"redis://127.0.0.1:6379/0", "127.0.0.1:6379", "http://x/y", "checkout"} {
		if _, err := open(ctx, dsn, newTables("x_"), config{}, nil); err == nil || !strings.Contains(err.Error(), "accepted -store values") {
			t.Errorf("-store %s: got %v, want a refusal listing the accepted values", dsn, err)
		}
	}
	if _, err := open(ctx, "redis://127.0.0.1:6379", newTables("x_"), config{}, nil); err == nil || !strings.Contains(err.Error(), "Redis cannot run this service") {
		t.Errorf("Redis: got %v", err)
	}
	for _, v := range []string{"nowhere", "after:order@0", "after:order@x"} {
		if _, err := newPauser(v, nil, nil); err == nil || !strings.Contains(err.Error(), PauseEnv) {
			t.Errorf("%s=%s: got %v, want a refusal", PauseEnv, v, err)
		}
	}
	dir := t.TempDir()
	cfg := config{store: filepath.Join(dir, "c.db"), addr: "127.0.0.1:0", processor: "http://127.0.0.1:1", lease: time.Second, chargeTimeout: time.Second, logf: t.Logf}
	if err := run(cfg, &bytes.Buffer{}, ""); err == nil || !strings.Contains(err.Error(), "-lease") {
		t.Errorf("lease under the charge timeout: got %v", err)
	}
	cfg.lease, cfg.stub = 2*time.Second, true
	if err := run(cfg, &bytes.Buffer{}, ""); err == nil || !strings.Contains(err.Error(), "exactly one of") {
		t.Errorf("-processor and -processor-stub: got %v", err)
	}
}

// The pause hook prints its line at the Nth hit only, and holds the run
// until shutdown.
func TestPause(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	stop := make(chan struct{})
	p, err := newPauser("after:order@2", &out, stop)
	if err != nil {
		t.Fatal(err)
	}
	key := keyOf("k")
	if err := p.at("before:order", key); err != nil {
		t.Fatal(err)
	}
	if err := p.at("after:order", key); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.at("after:order", key) }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the second hit did not pause: %v", err)
	default:
	}
	close(stop)
	select {
	case err := <-done:
		if !errors.Is(err, errPaused) {
			t.Errorf("got %v, want errPaused", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the paused run was not released at shutdown")
	}
	if want := fmt.Sprintf("paused after:order %v\n", key); out.String() != want {
		t.Errorf("printed %q, want %q", out.String(), want)
	}
}

// The processor stub deduplicates on its key as a payment API does.
func TestProcessorStub(t *testing.T) {
	t.Parallel()
	p := processor.New()
	srv := httptest.NewServer(p)
	defer srv.Close()
	send := func(key, body string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(body))
		if key != "" {
			req.Header.Set(processor.HeaderKey, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String(), resp.Header.Get(processor.HeaderReplayed)
	}
	s1, b1, _ := send("a", `{"amount":5}`)
	s2, b2, r2 := send("a", `{"amount":5}`)
	s3, _, _ := send("a", `{"amount":6}`)
	s4, _, _ := send("", `{"amount":5}`)
	p.Decline(7)
	s5, b5, _ := send("b", `{"amount":7}`)
	p.FailNext(1)
	s6, _, _ := send("c", `{"amount":5}`)
	s7, b7, _ := send("c", `{"amount":5}`)
	switch {
	case s1 != 201 || b1 != `{"id":"ch_000001","amount":5}`:
		t.Errorf("first: %d %s", s1, b1)
	case s2 != 201 || b2 != b1 || r2 != "true":
		t.Errorf("replay: %d %s %q", s2, b2, r2)
	case s3 != 422 || s4 != 400:
		t.Errorf("other body: %d; no key: %d", s3, s4)
	case s5 != 402 || b5 != `{"error":"card_declined"}`:
		t.Errorf("decline: %d %s", s5, b5)
	case s6 != 503 || s7 != 201 || b7 != `{"id":"ch_000002","amount":5}`:
		t.Errorf("503 then: %d %d %s", s6, s7, b7)
	case p.Charges() != 2 || p.Declines() != 1 || p.Requests() != 7:
		t.Errorf("counts: %d charges, %d declines, %d requests", p.Charges(), p.Declines(), p.Requests())
	}
}
