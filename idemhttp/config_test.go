package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/observe"
)

// do sends one request with the given header fields (name, value pairs).
func (s *server[Tx]) do(t *testing.T, path, body string, header ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, b}
}

// testNoResponse: a handler that writes nothing is rolled back and
// answered 500, never stored as an empty 200 (the gin/echo/fiber failure).
func testNoResponse[Tx any](t *testing.T, e env[Tx]) {
	var causes []error
	var mu sync.Mutex
	s := startServer(t, e, nil, &idemhttp.Options{OnError: func(_ *http.Request, err error) {
		mu.Lock()
		causes = append(causes, err)
		mu.Unlock()
	}}, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n <= 2 {
			w.Header().Set("X-Ignored", "set but never written")
			return
		}
		w.WriteHeader(http.StatusOK) // an explicit empty 200 is an answer
	})
	for range 2 {
		res := s.post(t, `{}`, "silent")
		wantProblem(t, res, http.StatusInternalServerError, idemhttp.ProblemNoResponse)
		s.wantEffects(t, "/silent", 0)
	}
	first := s.post(t, `{}`, "silent")
	wantStatus(t, first, http.StatusOK)
	wantReplay(t, first, s.post(t, `{}`, "silent"))
	s.wantCalls(t, 3)
	s.wantEffects(t, "/silent", 1)
	mu.Lock()
	defer mu.Unlock()
	if len(causes) != 2 || !errors.Is(causes[0], idemhttp.ErrNoResponse) {
		t.Errorf("OnError got %v; want ErrNoResponse twice", causes)
	}
}

// testStorePolicy: the default stores neither validation failures nor
// conflicts (DefaultKeepStatus); Options.KeepStatus changes it.
func testStorePolicy[Tx any](t *testing.T, e env[Tx]) {
	for _, code := range []int{400, 401, 403, 404, 409, 422} {
		s := startServer(t, e, nil, nil, func(n int64, w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(code)
			_, _ = io.WriteString(w, "refused")
		})
		for range 2 {
			res := s.post(t, `{}`, "policy")
			if res.status != code || string(res.body) != "refused" || res.header.Get(idemhttp.HeaderReplayed) != "" {
				t.Errorf("%d: got %d %q %v; want the handler's answer, not replayed", code, res.status, res.body, res.header)
			}
		}
		s.wantCalls(t, 2) // not stored: the handler runs again
		s.wantEffects(t, "/policy", 0)
	}
	// A custom policy that stores 400 replays it.
	s := startServer(t, e, nil, &idemhttp.Options{KeepStatus: func(st int) bool { return st < 500 }}, func(n int64, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "bad")
	})
	first := s.post(t, `{}`, "policy-400")
	wantReplay(t, first, s.post(t, `{}`, "policy-400"))
	s.wantCalls(t, 1)
	s.wantEffects(t, "/policy-400", 1)
	// A custom policy refusing a 201 rolls it back.
	r := startServer(t, e, nil, &idemhttp.Options{KeepStatus: func(int) bool { return false }}, created)
	wantStatus(t, r.post(t, `{}`, "never"), http.StatusCreated)
	r.wantEffects(t, "/never", 0)
	for _, c := range []struct {
		status int
		want   bool
	}{{200, true}, {201, true}, {302, true}, {402, true}, {410, true}, {400, false}, {408, false}, {409, false},
		{422, false}, {425, false}, {429, false}, {500, false}, {503, false}, {100, false}} {
		if got := idemhttp.DefaultKeepStatus(c.status); got != c.want {
			t.Errorf("DefaultKeepStatus(%d) = %v, want %v", c.status, got, c.want)
		}
	}
}

// testKeyHeader: the key may come in another header.
func testKeyHeader[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, &idemhttp.Options{KeyHeader: "x-idempotency-key"}, created)
	first := s.do(t, "/things", `{}`, "X-Idempotency-Key", "xk-1")
	wantStatus(t, first, http.StatusCreated)
	wantReplay(t, first, s.do(t, "/things", `{}`, "X-Idempotency-Key", `"xk-1"`))
	// The standard header is not read any more.
	p := wantProblem(t, s.do(t, "/things", `{}`, "Idempotency-Key", "xk-1"), 400, idemhttp.ProblemMissingKey)
	if !strings.Contains(p.Title+p.Detail, "X-Idempotency-Key") {
		t.Errorf("problem %+v does not name the configured header", p)
	}
	s.wantCalls(t, 1)
	s.wantEffects(t, "/xk-1", 1)
}

// testValidateKey: low-entropy keys are refused before anything is stored.
func testValidateKey[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, &idemhttp.Options{ValidateKey: idemhttp.UUIDKey}, created)
	wantProblem(t, s.post(t, `{}`, "1"), 400, idemhttp.ProblemInvalidKey)
	wantProblem(t, s.post(t, `{}`, "8e03978e-40d5-43e8-bc93-6894a57f932x"), 400, idemhttp.ProblemInvalidKey)
	s.wantCalls(t, 0)
	wantStatus(t, s.post(t, `{}`, "8e03978e-40d5-43e8-bc93-6894a57f9324"), http.StatusCreated)
	m := startServer(t, e, nil, &idemhttp.Options{ValidateKey: idemhttp.MinKeyLength(16)}, created)
	wantProblem(t, m.post(t, `{}`, "short"), 400, idemhttp.ProblemInvalidKey)
	wantStatus(t, m.post(t, `{}`, "long-enough-key-0001"), http.StatusCreated)
	m.wantCalls(t, 1)
}

// testRenderProblem: a renderer replaces problem+json, and a Scope 401
// carries WWW-Authenticate.
func testRenderProblem[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, &idemhttp.Options{
		Scope: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") == "" {
				return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: 401,
					Header: http.Header{"Www-Authenticate": {`Bearer realm="payments"`}}}
			}
			return "acct", nil
		},
		RenderProblem: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			for k, v := range p.Header {
				w.Header()[k] = v
			}
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(p.Status)
			_, _ = io.WriteString(w, "custom: "+p.Title)
		},
	}, created)
	res := s.post(t, `{}`, "r-1")
	if res.status != 401 || res.header.Get("WWW-Authenticate") != `Bearer realm="payments"` || string(res.body) != "custom: Unauthorized" {
		t.Errorf("got %d %v %q; want the custom 401 with WWW-Authenticate", res.status, res.header, res.body)
	}
	// The default renderer sends Problem.Header too.
	d := startServer(t, e, nil, &idemhttp.Options{Scope: func(*http.Request) (string, error) {
		return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: 401, Detail: "log in",
			Header: http.Header{"Www-Authenticate": {"Basic"}}}
	}}, created)
	res = d.post(t, `{}`, "r-2")
	wantProblem(t, res, 401, "about:blank")
	if res.header.Get("WWW-Authenticate") != "Basic" {
		t.Errorf("default renderer dropped WWW-Authenticate: %v", res.header)
	}
	// Retry-After reaches a custom renderer on 409.
	entered, release := make(chan struct{}), make(chan struct{})
	b := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, &idemhttp.Options{
		RenderProblem: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			for k, v := range p.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(p.Status)
		},
	}, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			close(entered)
			<-release
		}
		created(n, w, r)
	})
	done := make(chan result, 1)
	go func() { done <- b.post(t, `{}`, "busy") }()
	<-entered
	res = b.post(t, `{}`, "busy")
	close(release)
	<-done
	if res.status != http.StatusConflict || res.header.Get("Retry-After") == "" {
		t.Errorf("in progress through a custom renderer: %d %v; want 409 with Retry-After", res.status, res.header)
	}
	s.wantCalls(t, 0)
}

// testFingerprintOptions: headers in, fields out, or a function of one's own.
func testFingerprintOptions[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, &idemhttp.Options{
		FingerprintHeaders: []string{"x-account"},
		IgnoreFields:       []string{"sent_at", "meta.trace"},
	}, created)
	first := s.do(t, "/things", `{"amount":5,"sent_at":"10:00","meta":{"trace":"a","v":1}}`, "Idempotency-Key", "fp", "X-Account", "A")
	wantStatus(t, first, http.StatusCreated)
	// Ignored fields changed: replayed.
	wantReplay(t, first, s.do(t, "/things", `{"amount":5,"sent_at":"10:05","meta":{"trace":"b","v":1}}`, "Idempotency-Key", "fp", "X-Account", "A"))
	// A field that counts, or the header: refused.
	wantProblem(t, s.do(t, "/things", `{"amount":5,"sent_at":"10:00","meta":{"trace":"a","v":2}}`, "Idempotency-Key", "fp", "X-Account", "A"), 422, idemhttp.ProblemMismatch)
	wantProblem(t, s.do(t, "/things", `{"amount":5,"sent_at":"10:00","meta":{"trace":"a","v":1}}`, "Idempotency-Key", "fp", "X-Account", "B"), 422, idemhttp.ProblemMismatch)
	s.wantCalls(t, 1)

	f := startServer(t, e, nil, &idemhttp.Options{Fingerprint: func(r *http.Request, body []byte) (string, error) {
		if len(body) == 0 {
			return "", &idemhttp.Problem{Type: "about:blank", Title: "Empty body", Status: 400, Detail: "send a body"}
		}
		return r.URL.Path, nil // the body does not count
	}}, created)
	first = f.post(t, `{"a":1}`, "own")
	wantReplay(t, first, f.post(t, `{"a":2}`, "own"))
	wantProblem(t, f.send(t, http.MethodPost, "/other", "application/json", `{"a":1}`, "own"), 422, idemhttp.ProblemMismatch)
	wantProblem(t, f.send(t, http.MethodPost, "/things", "", ``, "own-2"), 400, "about:blank")
	f.wantCalls(t, 1)
}

type recorded struct {
	mu  sync.Mutex
	evs []idemhttp.RequestEvent
}

func (rc *recorded) observe(_ context.Context, ev idemhttp.RequestEvent) {
	rc.mu.Lock()
	rc.evs = append(rc.evs, ev)
	rc.mu.Unlock()
}

func (rc *recorded) last(t *testing.T) idemhttp.RequestEvent {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.evs) == 0 {
		t.Fatal("no event")
	}
	return rc.evs[len(rc.evs)-1]
}

// testObserver: every guarded request reaches the observer, refusals
// before the store and the handler's own failures included.
func testObserver[Tx any](t *testing.T, e env[Tx]) {
	rc := &recorded{}
	s := startServer(t, e, nil, &idemhttp.Options{Observer: rc.observe, MaxRequestBody: 32}, func(n int64, w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(http.StatusBadGateway)
		case "/invalid":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case "/panic":
			panic("bug")
		default:
			created(n, w, r)
		}
	})
	check := func(res result, outcome observe.Outcome, status int, id string, wantErr bool) {
		t.Helper()
		ev := rc.last(t)
		if ev.Outcome != outcome || ev.Status != status || ev.Key.ID != id || (ev.Err != nil) != wantErr || ev.Duration <= 0 || ev.Method != http.MethodPost {
			t.Errorf("event %+v; want outcome %s, status %d, id %q, error %v", ev, outcome, status, id, wantErr)
		}
		if res.status != 0 && res.status != status {
			t.Errorf("sent %d, event says %d", res.status, status)
		}
	}
	check(s.post(t, `{}`), observe.Rejected, 400, "", true)
	check(s.post(t, `{}`, "a", "b"), observe.Rejected, 400, "", true)
	check(s.post(t, `{"a":"0123456789012345678901234567890"}`, "big"), observe.Rejected, 413, "big", true)
	check(s.post(t, `{"a":`, "bad"), observe.Rejected, 400, "bad", true)
	check(s.post(t, `{}`, "ok"), observe.Executed, 201, "ok", false)
	check(s.post(t, `{}`, "ok"), observe.Replayed, 201, "ok", false)
	check(s.post(t, `{"x":1}`, "ok"), observe.Mismatch, 422, "ok", true)
	check(s.send(t, http.MethodPost, "/fail", "application/json", `{}`, "f"), observe.HandlerError, 502, "f", true)
	check(s.send(t, http.MethodPost, "/invalid", "application/json", `{}`, "i"), observe.NotStored, 422, "i", false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/panic", strings.NewReader(`{}`))
	req.Header.Set(idemhttp.DefaultKeyHeader, "p")
	if resp, err := s.Client().Do(req); err == nil {
		resp.Body.Close()
	}
	check(result{}, observe.HandlerError, 0, "p", true)
	// Unguarded methods are not events.
	rc.mu.Lock()
	n := len(rc.evs)
	rc.mu.Unlock()
	s.send(t, http.MethodGet, "/things", "", "")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.evs) != n {
		t.Error("a GET reached the observer")
	}
}

// testObserverStoreDown: a store failure is its own outcome, apart from
// the handler's 5xx.
func testObserverStoreDown[Tx any](t *testing.T, e env[Tx]) {
	rc := &recorded{}
	s := startServer(t, e, nil, &idemhttp.Options{Observer: rc.observe}, created)
	e.breakStore()
	res := s.post(t, `{}`, "down")
	wantProblem(t, res, http.StatusServiceUnavailable, idemhttp.ProblemStoreUnavailable)
	if ev := rc.last(t); ev.Outcome != observe.StoreError || ev.Status != 503 || ev.Err == nil {
		t.Errorf("event %+v; want store_error 503 with the cause", ev)
	}
}
