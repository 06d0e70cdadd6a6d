package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

const docsURL = "https://docs.example.com/errors/idempotency"

// expiresOf parses the lifetime header of res.
func expiresOf(t *testing.T, res result) time.Time {
	t.Helper()
	v := res.header.Get(idemhttp.HeaderKeyExpires)
	e, err := http.ParseTime(v)
	if err != nil || v != e.UTC().Format(http.TimeFormat) {
		t.Fatalf("%s %q (status %d): %v; want an IMF-fixdate", idemhttp.HeaderKeyExpires, v, res.status, err)
	}
	return e
}

// exposed returns the names of Access-Control-Expose-Headers, lower case.
func exposed(res result) map[string]int {
	names := map[string]int{}
	for _, v := range res.header.Values("Access-Control-Expose-Headers") {
		for _, n := range strings.Split(v, ",") {
			names[strings.ToLower(strings.TrimSpace(n))]++
		}
	}
	return names
}

func wantExposed(t *testing.T, res result, names ...string) {
	t.Helper()
	got := exposed(res)
	for _, n := range names {
		if got[strings.ToLower(n)] != 1 {
			t.Errorf("status %d: Access-Control-Expose-Headers %q; want %s listed once", res.status, res.header.Values("Access-Control-Expose-Headers"), n)
		}
	}
}

// The first answer and every replay say when the key expires, with the
// route's TTL (Config.TTL over the Guard's 24h); browsers may read it.
func testKeyLifetime[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, &idempotency.Config{TTL: 24 * time.Hour}, &idemhttp.Options{TTL: 2 * time.Hour, ExposeHeaders: true}, created)
	before := time.Now()
	first := s.post(t, `{"amount":1}`, "life")
	after := time.Now()
	wantStatus(t, first, http.StatusCreated)
	e1 := expiresOf(t, first)
	if e1.Before(before.Add(2*time.Hour).Add(-time.Second)) || e1.After(after.Add(2*time.Hour)) {
		t.Fatalf("first answer expires %v; want 2h after the request (%v..%v)", e1, before, after)
	}
	wantExposed(t, first, idemhttp.HeaderReplayed, idemhttp.HeaderKeyExpires)
	for range 2 {
		replay := s.post(t, `{"amount":1}`, "life")
		wantReplay(t, first, replay)
		e2 := expiresOf(t, replay)
		// The replay's is the store's own expiry: no earlier than the
		// first answer's estimate, a moment later at most.
		if e2.Before(e1) || e2.Sub(e1) > 2*time.Second {
			t.Errorf("replay expires %v, first answer said %v; want the store's expiry, at or just after it", e2, e1)
		}
		wantExposed(t, replay, idemhttp.HeaderReplayed, idemhttp.HeaderKeyExpires)
	}
	s.wantCalls(t, 1)
	s.wantEffects(t, "/life", 1)

	// A CORS middleware's list is kept, and a name it lists already is
	// not repeated.
	inner := startServer(t, e, nil, &idemhttp.Options{ExposeHeaders: true}, created)
	front := httptest.NewServer(withExpose(inner.Config.Handler, "X-Request-Id, idempotent-replayed"))
	t.Cleanup(front.Close)
	cors := &server[Tx]{Server: front, env: e}
	res := cors.post(t, `{}`, "cors")
	wantStatus(t, res, http.StatusCreated)
	wantExposed(t, res, "X-Request-Id", idemhttp.HeaderReplayed, idemhttp.HeaderKeyExpires)
	// Without ExposeHeaders, nothing is exposed.
	plain := startServer(t, e, nil, nil, created).post(t, `{}`, "plain")
	if v := plain.header.Values("Access-Control-Expose-Headers"); v != nil || plain.header.Get(idemhttp.HeaderKeyExpires) == "" {
		t.Errorf("default config: exposed %q, expires %q; want nothing exposed and the lifetime header", v, plain.header.Get(idemhttp.HeaderKeyExpires))
	}
}

func withExpose(h http.Handler, list string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Expose-Headers", list)
		h.ServeHTTP(w, r)
	})
}

// holdKey starts a request with key whose handler blocks until the
// returned release is called; it returns once the handler runs.
func holdKey[Tx any](t *testing.T, s *server[Tx], key string, entered chan struct{}) (release func() result) {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- s.post(t, `{}`, key) }()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	return func() result { return <-done }
}

// blockFirst is a step whose first run waits for release.
func blockFirst(entered, release chan struct{}) step {
	return func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			close(entered)
			<-release
		}
		created(n, w, r)
	}
}

// Every problem carries the Link to the configured documentation; the
// in-progress problem carries Retry-After and a lower bound of the key's
// expiry; the browser may read all three.
func testProblemLinks[Tx any](t *testing.T, e env[Tx]) {
	entered, release := make(chan struct{}), make(chan struct{})
	opts := &idemhttp.Options{ProblemDocs: docsURL, ExposeHeaders: true, MaxRequestBody: 64}
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1, TTL: time.Hour}, opts, blockFirst(entered, release))
	wantLink := func(res result) {
		t.Helper()
		if got := res.header.Values("Link"); len(got) != 1 || got[0] != "<"+docsURL+`>; rel="describedby"` {
			t.Errorf("status %d: Link %q; want one <%s>; rel=\"describedby\"", res.status, got, docsURL)
		}
		wantExposed(t, res, "Link")
	}
	done := holdKey(t, s, "held", entered)
	arrived := time.Now()
	busy := s.post(t, `{}`, "held")
	close(release)
	wantProblem(t, busy, http.StatusConflict, idemhttp.ProblemInProgress)
	wantLink(busy)
	if busy.header.Get("Retry-After") != "1" {
		t.Errorf("409 Retry-After %q, want 1", busy.header.Get("Retry-After"))
	}
	if bound := expiresOf(t, busy); bound.Before(arrived.Add(time.Hour-2*time.Second)) || bound.After(time.Now().Add(time.Hour)) {
		t.Errorf("409 says the key expires %v; want the request's arrival plus the 1h TTL (%v)", bound, arrived.Add(time.Hour))
	}
	wantExposed(t, busy, "Retry-After", idemhttp.HeaderKeyExpires)
	first := done()
	wantStatus(t, first, http.StatusCreated)
	if first.header.Get("Link") != "" {
		t.Errorf("the handler's answer got a Link %q", first.header.Get("Link"))
	}

	missing := s.post(t, `{}`)
	wantProblem(t, missing, http.StatusBadRequest, idemhttp.ProblemMissingKey)
	wantLink(missing)
	reused := s.post(t, `{"other":1}`, "held")
	wantProblem(t, reused, http.StatusUnprocessableEntity, idemhttp.ProblemMismatch)
	wantLink(reused)
	large := s.post(t, `{"a":"`+strings.Repeat("x", 100)+`"}`, "large")
	wantProblem(t, large, http.StatusRequestEntityTooLarge, idemhttp.ProblemRequestTooLarge)
	wantLink(large)
	e.breakStore()
	down := s.post(t, `{}`, "down")
	wantProblem(t, down, http.StatusServiceUnavailable, idemhttp.ProblemStoreUnavailable)
	wantLink(down)
	s.wantCalls(t, 1)
}

// InProgressStatus 425 answers "in progress" with 425 Too Early, the same
// problem and Retry-After; DefaultRetry retries it.
func testTooEarly[Tx any](t *testing.T, e env[Tx]) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, &idemhttp.Options{InProgressStatus: http.StatusTooEarly}, blockFirst(entered, release))
	done := holdKey(t, s, "early", entered)
	busy := s.post(t, `{}`, "early")
	close(release)
	wantProblem(t, busy, http.StatusTooEarly, idemhttp.ProblemInProgress)
	if busy.header.Get("Retry-After") != "1" || busy.header.Get(idemhttp.HeaderKeyExpires) == "" {
		t.Errorf("425 header %v; want Retry-After: 1 and %s", busy.header, idemhttp.HeaderKeyExpires)
	}
	resp := &http.Response{StatusCode: busy.status, Header: busy.header, Body: io.NopCloser(strings.NewReader(string(busy.body)))}
	if !idemhttp.IsInProgress(resp) || !idemhttp.DefaultRetry(resp, nil) {
		t.Error("the 425 in-progress answer is not recognised (IsInProgress, DefaultRetry)")
	}
	wantStatus(t, done(), http.StatusCreated)
	// The handler's own 425 is still not stored.
	s.wantCalls(t, 1)
	s.wantEffects(t, "/early", 1)
}

// A Config field out of range is refused by Validate; mounted anyway, the
// middleware answers every guarded request 500 without running the
// handler, and reports it once.
func testInvalidConfig[Tx any](t *testing.T, e env[Tx]) {
	bad := map[string]idemhttp.Options{
		"negative TTL":  {TTL: -time.Second},
		"TTL under 1ms": {TTL: time.Microsecond},
		"docs scheme":   {ProblemDocs: "ftp://docs.example.com/x"},
		"docs relative": {ProblemDocs: "/errors"},
		"docs space":    {ProblemDocs: "https://docs.example.com/a b"},
		"docs bracket":  {ProblemDocs: "https://docs.example.com/a>b"},
		"status 418":    {InProgressStatus: http.StatusTeapot},
		"key schema":    {KeySchema: &idemhttp.KeySchema{MinLength: 10, MaxLength: 5}},
		"key too long":  {KeySchema: &idemhttp.KeySchema{MaxLength: 256}},
	}
	for name, c := range bad {
		c.Scope = idemhttp.SharedScope
		if err := c.Validate(); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: Validate() = %v; want ErrInvalidConfig", name, err)
		}
		if _, err := idemhttp.OpenAPI(&c); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: OpenAPI() = %v; want ErrInvalidConfig", name, err)
		}
		var reports atomic.Int64
		c.OnError = func(*http.Request, error) { reports.Add(1) }
		s := startServer(t, e, nil, &c, created)
		for i := range 2 {
			res := s.post(t, `{}`, "bad-"+strings.ReplaceAll(name, " ", "-"))
			wantProblem(t, res, http.StatusInternalServerError, idemhttp.ProblemInternal)
			if i == 1 && reports.Load() != 1 {
				t.Errorf("%s: reported %d times, want once", name, reports.Load())
			}
		}
		s.wantCalls(t, 0)
	}
	good := idemhttp.Options{Scope: idemhttp.SharedScope, TTL: time.Millisecond, ProblemDocs: docsURL + "?q=1#x",
		InProgressStatus: http.StatusConflict, KeySchema: &idemhttp.KeySchema{MinLength: 16}}
	if err := good.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// countingTransport counts the attempts that reach the server.
type countingTransport struct{ n atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// The client stops retrying once a retry would arrive after the key
// expired, by the server's lifetime header, and says so; with a long TTL
// it retries as usual.
func testClientKeyExpiry[Tx any](t *testing.T, e env[Tx]) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, &idemhttp.Options{TTL: time.Second}, blockFirst(entered, release))
	done := holdKey(t, s, "short", entered)
	defer func() { close(release); wantStatus(t, done(), http.StatusCreated) }()
	post := func(url string, tr *idemhttp.Transport) (*http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/things", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultKeyHeader, "short")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if resp != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}

	// The key's holder answers after this request, kept 1s from then at
	// least: a retry in 1s (Retry-After) may find it gone.
	base := &countingTransport{}
	var retries atomic.Int64
	resp, err := post(s.URL, &idemhttp.Transport{Base: base, OnRetry: func(idemhttp.RetryEvent) { retries.Add(1) }})
	if !errors.Is(err, idemhttp.ErrKeyExpired) || resp != nil {
		t.Fatalf("short TTL: %v, %v; want ErrKeyExpired", resp, err)
	}
	if !strings.Contains(err.Error(), "status 409") || base.n.Load() != 1 || retries.Load() != 0 {
		t.Errorf("short TTL: %q after %d attempts, %d retries; want the 409 named, 1 attempt, no retry", err, base.n.Load(), retries.Load())
	}

	// A route on the same store that keeps its keys an hour answers the
	// same held key 409 too: that one is retried.
	long := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, &idemhttp.Options{TTL: time.Hour}, created)
	base = &countingTransport{}
	resp, err = post(long.URL, &idemhttp.Transport{Base: base, MaxAttempts: 2})
	if err != nil || resp.StatusCode != http.StatusConflict || base.n.Load() != 2 {
		t.Fatalf("long TTL: %v, %v after %d attempts; want the 409 after 2 attempts", resp, err, base.n.Load())
	}
	s.wantCalls(t, 1)
	long.wantCalls(t, 0)
}
