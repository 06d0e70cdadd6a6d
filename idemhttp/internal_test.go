package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	ok := []struct{ in, want string }{
		{`abc`, `abc`},
		{`  abc	`, `abc`},
		{`"abc"`, `abc`},
		{` "abc" `, `abc`},
		{`"a\"b\\c"`, `a"b\c`},
		{`""`, ``}, // empty: refused later by Key.Validate
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, `8e03978e-40d5-43e8-bc93-6894a57f9324`},
		{`a"b`, `a"b`}, // bare values are taken as they are
	}
	for _, c := range ok {
		got, err := parseKey(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseKey(%q) = %q, %v; want %q, nil", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{`"abc`, `"abc"x`, `"a\nb"`, `"a\`, "\"a\x01\"", "\"\xc3\xa9\"", `"abc";p=1`} {
		if got, err := parseKey(in); err == nil {
			t.Errorf("parseKey(%q) = %q, nil; want an error", in, got)
		}
	}
}

func TestQuoteKeyRoundTrip(t *testing.T) {
	t.Parallel()
	for _, id := range []string{`abc`, `a"b\c`, `\\""`} {
		got, err := parseKey(quoteKey(id))
		if err != nil || got != id {
			t.Errorf("parseKey(quoteKey(%q)) = %q, %v", id, got, err)
		}
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		k := NewKeyID()
		if !re.MatchString(k) {
			t.Fatalf("NewKeyID() = %q, not a version 4 UUID", k)
		}
		if seen[k] {
			t.Fatalf("NewKeyID() repeated %q", k)
		}
		seen[k] = true
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 120 ", 120 * time.Second, true},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Fri, 02 Jan 2026 03:04:15 GMT", 10 * time.Second, true},
		{"Friday, 02-Jan-26 03:04:15 GMT", 10 * time.Second, true}, // RFC 850, obsolete but allowed
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	}
	for _, c := range cases {
		got, ok := retryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestDelayBounds(t *testing.T) {
	t.Parallel()
	c := &Transport{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}
	now := time.Now()
	for attempt := 1; attempt <= 70; attempt++ {
		ceil := min(10*time.Millisecond<<min(attempt-1, 20), 50*time.Millisecond)
		for range 50 {
			d, ok := c.delay(attempt, nil, now)
			if !ok || d < 0 || d > ceil {
				t.Fatalf("delay(attempt %d) = %v, %v; want in [0, %v], true", attempt, d, ok, ceil)
			}
		}
	}
	resp := &http.Response{Header: http.Header{"Retry-After": {"0"}}}
	if d, ok := c.delay(1, resp, now); d != 0 || !ok {
		t.Errorf("Retry-After 0: delay = %v, %v; want 0, true", d, ok)
	}
	resp.Header.Set("Retry-After", "1")
	if d, ok := c.delay(1, resp, now); d != time.Second || ok {
		t.Errorf("Retry-After 1 > MaxDelay: delay = %v, %v; want 1s, false", d, ok)
	}
}

func TestCaptureMimicsNetHTTP(t *testing.T) {
	t.Parallel()
	c := newCapture(nil, 8)
	c.Header().Set("X-A", "1")
	c.WriteHeader(http.StatusEarlyHints) // dropped
	if _, err := c.Write([]byte("<html>")); err != nil {
		t.Fatal(err)
	}
	c.Header().Set("X-Late", "ignored") // after the header was sent
	c.WriteHeader(http.StatusTeapot)    // ignored: the status is 200
	if _, err := c.Write([]byte("abc")); err != errResponseTooLarge {
		t.Fatalf("write past the limit: err = %v, want errResponseTooLarge", err)
	}
	c.finish()
	if c.status != http.StatusOK || !c.over || c.sent.Get("X-A") != "1" || c.sent.Get("X-Late") != "" {
		t.Errorf("status %d over %v sent %v", c.status, c.over, c.sent)
	}
	if got := c.sent.Get("Content-Type"); got != "text/html; charset=utf-8" {
		t.Errorf("sniffed Content-Type = %q", got)
	}
	nc := newCapture(nil, -1)
	nc.WriteHeader(http.StatusNoContent)
	if _, err := nc.Write([]byte("x")); err != http.ErrBodyNotAllowed {
		t.Errorf("write after 204: err = %v", err)
	}
}

func TestStoredHeader(t *testing.T) {
	t.Parallel()
	c := newSettings(&Options{ReplayHeaders: []string{"content-type", "x-keep", "set-cookie", "connection", "transfer-encoding", "proxy-foo", "x-nominated"}})
	h := http.Header{
		"Content-Type":      {"application/json"},
		"X-Keep":            {"1", "2"},
		"x-keep":            {"3"}, // non-canonical key set by hand
		"Set-Cookie":        {"s=1"},
		"Connection":        {"x-nominated"},
		"Transfer-Encoding": {"chunked"},
		"Proxy-Foo":         {"p"},
		"X-Nominated":       {"n"},
		"X-Other":           {"o"},
	}
	got := c.storedHeader(h)
	if len(got) != 2 || got.Get("Content-Type") != "application/json" || len(got.Values("X-Keep")) != 3 {
		t.Errorf("storedHeader = %v; want only Content-Type and X-Keep (3 values)", got)
	}
}

// TestFailTruthful: only a key that is held is answered "in progress"; an
// error of the store is a 503 even when it also wraps ErrInProgress (a busy
// single-writer store under NoWait), with Retry-After and a detail that
// says the store is busy or unavailable.
func TestFailTruthful(t *testing.T) {
	t.Parallel()
	h := &handler[any]{c: newSettings(nil)}
	for _, c := range []struct {
		err    error
		status int
		typ    string
	}{
		{fmt.Errorf("key %q: %w", "k", idempotency.ErrInProgress), http.StatusConflict, ProblemInProgress},
		{fmt.Errorf("%w: database busy with another writer", idempotency.ErrStore), http.StatusServiceUnavailable, problemStoreUnavailable},
		{fmt.Errorf("%w: %w", idempotency.ErrStore, idempotency.ErrInProgress), http.StatusServiceUnavailable, problemStoreUnavailable},
	} {
		rec := httptest.NewRecorder()
		ev := &RequestEvent{}
		h.fail(rec, httptest.NewRequest(http.MethodPost, "/", nil), ev, c.err, time.Now())
		var p Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if rec.Code != c.status || p.Type != c.typ || rec.Header().Get("Retry-After") == "" || ev.Status != c.status {
			t.Errorf("%v: %d %+v %v; want %d %s with Retry-After", c.err, rec.Code, p, rec.Header(), c.status, c.typ)
		}
		if c.status == http.StatusServiceUnavailable && (!strings.Contains(p.Detail, "busy or unavailable") || strings.Contains(p.Title+p.Detail, "in progress")) {
			t.Errorf("503 problem %+v does not say the store is busy or unavailable", p)
		}
	}
}
