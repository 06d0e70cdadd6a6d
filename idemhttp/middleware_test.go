package idemhttp_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// runMiddlewareTests runs every middleware case on one backend.
func runMiddlewareTests[Tx any](t *testing.T, b storeRig[Tx]) {
	cases := []struct {
		name string
		fn   func(*testing.T, env[Tx])
	}{
		{"MissingKey", testMissingKey[Tx]},
		{"InvalidKey", testInvalidKey[Tx]},
		{"QuotedKey", testQuotedKey[Tx]},
		{"InvalidJSON", testInvalidJSON[Tx]},
		{"InProgressNoWait", testInProgressNoWait[Tx]},
		{"InProgressLookup", testInProgressLookup[Tx]},
		{"RequestTooLarge", testRequestTooLarge[Tx]},
		{"KeyReused", testKeyReused[Tx]},
		{"Replay", testReplay[Tx]},
		{"ServerErrorNotStored", testServerErrorNotStored[Tx]},
		{"TransientNotStored", testTransientNotStored[Tx]},
		{"PanicRollsBack", testPanicRollsBack[Tx]},
		{"ResponseTooLarge", testResponseTooLarge[Tx]},
		{"Scope", testScope[Tx]},
		{"NoScope", testNoScope[Tx]},
		{"RenderProblemStatus", testRenderProblemStatus[Tx]},
		{"StoreDown", testStoreDown[Tx]},
		{"ConcurrentSameKey", testConcurrentSameKey[Tx]},
		{"NoResponse", testNoResponse[Tx]},
		{"StorePolicy", testStorePolicy[Tx]},
		{"KeyHeader", testKeyHeader[Tx]},
		{"ValidateKey", testValidateKey[Tx]},
		{"RenderProblem", testRenderProblem[Tx]},
		{"FingerprintOptions", testFingerprintOptions[Tx]},
		{"Observer", testObserver[Tx]},
		{"ObserverStoreDown", testObserverStoreDown[Tx]},
		{"KeyLifetime", testKeyLifetime[Tx]},
		{"ProblemLinks", testProblemLinks[Tx]},
		{"TooEarly", testTooEarly[Tx]},
		{"InvalidConfig", testInvalidConfig[Tx]},
		{"ClientKeyExpiry", testClientKeyExpiry[Tx]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, b(t))
		})
	}
}

func testMissingKey[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	wantProblem(t, s.post(t, `{"a":1}`), 400, idemhttp.ProblemMissingKey)
	wantProblem(t, s.send(t, http.MethodPatch, "/things", "text/plain", "x"), 400, idemhttp.ProblemMissingKey)
	// Other methods pass through, without a transaction.
	wantStatus(t, s.send(t, http.MethodGet, "/things", "", ""), http.StatusTeapot)
	wantStatus(t, s.send(t, http.MethodPut, "/things", "", "x"), http.StatusTeapot)
	s.wantCalls(t, 2)

	// With KeyOptional, a request without key goes through unprotected.
	o := startServer(t, e, nil, &idemhttp.Options{KeyOptional: true}, created)
	wantStatus(t, o.post(t, `{}`), http.StatusTeapot)
	o.wantCalls(t, 1)
}

func testInvalidKey[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	for _, keys := range [][]string{
		{strings.Repeat("k", backend.MaxIDLen+1)},
		{"caf\u00e9"},
		{`"unterminated`},
		{`"bad\escape"`},
		{`""`},
		{""},
		{"a", "b"},
	} {
		p := wantProblem(t, s.post(t, `{}`, keys...), 400, idemhttp.ProblemInvalidKey)
		t.Logf("%q: %s", keys, p.Detail)
	}
	s.wantCalls(t, 0)
	// The longest key is accepted.
	long := strings.Repeat("k", backend.MaxIDLen)
	wantStatus(t, s.post(t, `{}`, long), http.StatusCreated)
	s.wantEffects(t, "/"+long, 1)
}

func testQuotedKey[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	first := s.post(t, `{"a":1}`, `"k-\"q\"-\\"`)
	wantStatus(t, first, http.StatusCreated)
	// The bare form of the same id is the same key.
	wantReplay(t, first, s.post(t, `{"a":1}`, `k-"q"-\`))
	wantReplay(t, first, s.post(t, `{"a":1}`, ` "k-\"q\"-\\" `))
	s.wantCalls(t, 1)
	s.wantEffects(t, `/k-"q"-\`, 1)
}

func testInvalidJSON[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	for _, c := range []struct{ ctype, body string }{
		{"application/json", `{"a":`},
		{"application/json; charset=utf-8", `{"a":1,"a":2}`},
		{"application/merge-patch+json", `{"a":1} {"b":2}`},
		{"application/json", `nope`},
	} {
		wantProblem(t, s.send(t, http.MethodPost, "/things", c.ctype, c.body, "bad-json"), 400, idemhttp.ProblemInvalidBody)
	}
	s.wantCalls(t, 0)
	// Nothing was stored: the key still runs a valid request. The same
	// bytes as text are not parsed.
	wantStatus(t, s.send(t, http.MethodPost, "/things", "text/plain", `{"a":`, "bad-json"), http.StatusCreated)
	s.wantEffects(t, "/bad-json", 1)
}

func testInProgressNoWait[Tx any](t *testing.T, e env[Tx]) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, nil, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			close(entered)
			<-release
		}
		created(n, w, r)
	})
	done := make(chan result, 1)
	go func() { done <- s.post(t, `{}`, "busy") }()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	res := s.post(t, `{}`, "busy")
	close(release)
	wantProblem(t, res, http.StatusConflict, idemhttp.ProblemInProgress)
	if res.header.Get("Retry-After") == "" {
		t.Error("409 without Retry-After")
	}
	first := <-done
	wantStatus(t, first, http.StatusCreated)
	wantReplay(t, first, s.post(t, `{}`, "busy"))
	s.wantCalls(t, 1)
	s.wantEffects(t, "/busy", 1)
}

// testInProgressLookup: Config.InProgress answers a request whose key is
// held (from the resource being created), or leaves it to the middleware.
func testInProgressLookup[Tx any](t *testing.T, e env[Tx]) {
	entered, release := make(chan struct{}), make(chan struct{})
	var asked []string
	cfg := &idemhttp.Options{Scope: idemhttp.SharedScope, InProgress: func(w http.ResponseWriter, r *http.Request, key idempotency.Key) bool {
		asked = append(asked, key.ID)
		if key.ID != "lookup" {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"order":"pending"}`))
		return true
	}}
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, cfg, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			close(entered)
			<-release
		}
		created(n, w, r)
	})
	done := make(chan result, 1)
	go func() { done <- s.post(t, `{}`, "lookup") }()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	res := s.post(t, `{}`, "lookup")
	if res.status != http.StatusAccepted || string(res.body) != `{"order":"pending"}` {
		t.Fatalf("in progress, looked up: %d %s", res.status, res.body)
	}
	close(release)
	wantStatus(t, <-done, http.StatusCreated)
	s.wantCalls(t, 1)
	if len(asked) != 1 || asked[0] != "lookup" {
		t.Fatalf("InProgress asked for %q", asked)
	}
}

func testRequestTooLarge[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, &idemhttp.Options{MaxRequestBody: 16}, created)
	wantProblem(t, s.post(t, `{"a":"1234567890"}`, "big"), http.StatusRequestEntityTooLarge, idemhttp.ProblemRequestTooLarge)
	// Without a Content-Length (chunked), the limit holds while reading.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/things", io.MultiReader(strings.NewReader(`{"a":"123`), strings.NewReader(`4567890"}`)))
	req.Header.Set(idemhttp.DefaultKeyHeader, "big")
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantProblem(t, result{resp.StatusCode, resp.Header, b}, http.StatusRequestEntityTooLarge, idemhttp.ProblemRequestTooLarge)
	s.wantCalls(t, 0)
	// Exactly at the limit is accepted, and the key was never stored.
	wantStatus(t, s.post(t, `{"a":"12345678"}`, "big"), http.StatusCreated)
	s.wantEffects(t, "/big", 1)
}

func testKeyReused[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	first := s.post(t, `{"amount":100,"order":7}`, "reuse")
	wantStatus(t, first, http.StatusCreated)
	// Same JSON value, other key order and spacing: same request.
	wantReplay(t, first, s.post(t, "{ \"order\": 7,\n \"amount\": 1.00e2 }", "reuse"))
	wantProblem(t, s.post(t, `{"amount":101,"order":7}`, "reuse"), 422, idemhttp.ProblemMismatch)
	wantProblem(t, s.send(t, http.MethodPost, "/other", "application/json", `{"amount":100,"order":7}`, "reuse"), 422, idemhttp.ProblemMismatch)
	wantProblem(t, s.send(t, http.MethodPatch, "/things", "application/json", `{"amount":100,"order":7}`, "reuse"), 422, idemhttp.ProblemMismatch)
	wantProblem(t, s.send(t, http.MethodPost, "/things", "text/plain", `{"amount":100,"order":7}`, "reuse"), 422, idemhttp.ProblemMismatch)
	// The query string is part of the default route.
	wantProblem(t, s.send(t, http.MethodPost, "/things?currency=EUR", "application/json", `{"amount":100,"order":7}`, "reuse"), 422, idemhttp.ProblemMismatch)
	s.wantCalls(t, 1)
	s.wantEffects(t, "/reuse", 1)
}

func testReplay[Tx any](t *testing.T, e env[Tx]) {
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\r', '\n', 0x80}
	s := startServer(t, e, nil, nil, func(n int64, w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Location", fmt.Sprintf("/things/%d", n))
		h.Add("Link", "</a>; rel=a")
		h.Add("Link", "</b>; rel=b")
		h.Set("X-Not-Listed", "1")
		h.Set("Keep-Alive", "timeout=5")
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret"})
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(binary)
		fmt.Fprintf(w, "run %d at %s", n, time.Now().Format(time.RFC3339Nano))
	})
	first := s.post(t, `{"x":[1,2,3]}`, "replay")
	wantStatus(t, first, http.StatusAccepted)
	// The first response is sent as the handler wrote it.
	for _, f := range []string{"Set-Cookie", "X-Not-Listed", "Location", "Content-Type"} {
		if first.header.Get(f) == "" {
			t.Errorf("first response lacks %s: %v", f, first.header)
		}
	}
	if !bytes.HasPrefix(first.body, binary) {
		t.Fatalf("first body %q", first.body)
	}
	for range 3 {
		replay := s.post(t, `{"x":[1,2,3]}`, "replay")
		wantReplay(t, first, replay)
		for _, f := range []string{"Content-Type", "Location"} {
			if replay.header.Get(f) != first.header.Get(f) {
				t.Errorf("replay %s %q, first %q", f, replay.header.Get(f), first.header.Get(f))
			}
		}
		if got := replay.header.Values("Link"); len(got) != 2 || got[0] != "</a>; rel=a" || got[1] != "</b>; rel=b" {
			t.Errorf("replay Link %q, want both values in order", got)
		}
		for _, f := range []string{"Set-Cookie", "X-Not-Listed", "Keep-Alive"} {
			if v := replay.header.Values(f); v != nil {
				t.Errorf("replay has %s %q; it must not be stored", f, v)
			}
		}
	}
	s.wantCalls(t, 1)
	s.wantEffects(t, "/replay", 1)

	// A custom allowlist replays what it lists, never cookies.
	c := startServer(t, e, nil, &idemhttp.Options{ReplayHeaders: []string{"x-not-listed", "Set-Cookie"}}, func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Not-Listed", "kept")
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret"})
		_, _ = io.WriteString(w, "plain text")
	})
	first = c.post(t, `{}`, "allow")
	replay := c.post(t, `{}`, "allow")
	wantReplay(t, first, replay)
	if replay.header.Get("X-Not-Listed") != "kept" || replay.header.Get("Set-Cookie") != "" {
		t.Errorf("custom allowlist replay headers %v", replay.header)
	}
	// The sniffed Content-Type is the one net/http would have sent, both times.
	if replay.header.Get("Content-Type") != "text/plain; charset=utf-8" || first.header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("Content-Type first %q replay %q", first.header.Get("Content-Type"), replay.header.Get("Content-Type"))
	}
}

func testServerErrorNotStored[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("X-Failure", "yes")
			http.Error(w, "upstream down", http.StatusBadGateway)
			return
		}
		created(n, w, r)
	})
	res := s.post(t, `{}`, "fivexx")
	if res.status != http.StatusBadGateway || string(res.body) != "upstream down\n" || res.header.Get("X-Failure") != "yes" {
		t.Fatalf("got %d %q %v; want the handler's own 502", res.status, res.body, res.header)
	}
	s.wantEffects(t, "/fivexx", 0) // rolled back
	first := s.post(t, `{}`, "fivexx")
	wantStatus(t, first, http.StatusCreated)
	wantReplay(t, first, s.post(t, `{}`, "fivexx"))
	s.wantCalls(t, 2)
	s.wantEffects(t, "/fivexx", 1)
}

func testTransientNotStored[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusPaymentRequired) // a stored 4xx: the operation's outcome
		_, _ = io.WriteString(w, "card declined")
	})
	wantStatus(t, s.post(t, `{}`, "transient"), http.StatusTooManyRequests)
	s.wantEffects(t, "/transient", 0)
	first := s.post(t, `{}`, "transient")
	wantStatus(t, first, http.StatusPaymentRequired)
	wantReplay(t, first, s.post(t, `{}`, "transient"))
	s.wantCalls(t, 2)
	s.wantEffects(t, "/transient", 1)
}

func testPanicRollsBack[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "never sent")
			panic("handler bug")
		}
		created(n, w, r)
	})
	// The panicking attempt drops the connection; the Transport retries it with
	// the same key and the handler runs again.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/things", strings.NewReader(`{"p":1}`))
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Transport: &idemhttp.Transport{Base: s.Client().Transport, BaseDelay: time.Millisecond}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	first := result{resp.StatusCode, resp.Header, body}
	wantStatus(t, first, http.StatusCreated)
	s.wantCalls(t, 2)
	id := strings.Trim(resp.Request.Header.Get(idemhttp.DefaultKeyHeader), `"`) // a generated UUID, quoted
	s.wantEffects(t, "/"+id, 1)
	wantReplay(t, first, s.post(t, `{"p":1}`, id))
}

func testResponseTooLarge[Tx any](t *testing.T, e env[Tx]) {
	var writeErr atomic.Value
	s := startServer(t, e, nil, &idemhttp.Options{MaxResponseBody: 10}, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			_, err := io.WriteString(w, "0123456789A")
			writeErr.Store(fmt.Sprint(err))
			return
		}
		_, _ = io.WriteString(w, "0123456789")
	})
	wantProblem(t, s.post(t, `{}`, "huge"), 500, idemhttp.ProblemResponseTooLarge)
	if got, _ := writeErr.Load().(string); got == "<nil>" || got == "" {
		t.Error("the handler's Write past the limit returned no error")
	}
	s.wantEffects(t, "/huge", 0)
	first := s.post(t, `{}`, "huge")
	wantStatus(t, first, http.StatusOK)
	wantReplay(t, first, s.post(t, `{}`, "huge"))
	s.wantEffects(t, "/huge", 1)
}
