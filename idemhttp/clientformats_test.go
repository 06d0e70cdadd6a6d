package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestClientFormats: what clients that did not come from this repository
// send and read. Form bodies fingerprinted canonically, problems rendered
// as Stripe's errors, the key echoed on every answer.
func TestClientFormats(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"SQLite", func(t *testing.T) { runClientFormats(t, sqliteEnv) }},
		{"Postgres", func(t *testing.T) { runClientFormats(t, postgresEnv) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

func runClientFormats[Tx any](t *testing.T, b storeRig[Tx]) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, env[Tx])
	}{
		{"FormBodies", testFormBodies[Tx]},
		{"FormStoredAsBytes", testFormStoredAsBytes[Tx]},
		{"StripeErrors", testStripeErrors[Tx]},
		{"EchoKey", testEchoKey[Tx]},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, b(t))
		})
	}
}

const formType = "application/x-www-form-urlencoded"

// testFormBodies: a form body with the same parameters in another order or
// spelling is the same request; another value, or the values of one name
// in another order, is another request; a body net/url refuses is 400.
func testFormBodies[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	first := s.send(t, http.MethodPost, "/things", formType, "amount=100&currency=usd&metadata[order]=7&expand[]=a&expand[]=b", "form")
	wantStatus(t, first, http.StatusCreated)
	for _, same := range []string{
		"expand%5B%5D=a&currency=usd&expand%5B%5D=b&metadata%5Border%5D=7&amount=100",
		"currency=%75sd&&amount=100&metadata[order]=7&expand[]=a&expand[]=b&",
	} {
		wantReplay(t, first, s.send(t, http.MethodPost, "/things", formType+"; charset=UTF-8", same, "form"))
	}
	for _, other := range []string{
		"amount=101&currency=usd&metadata[order]=7&expand[]=a&expand[]=b",
		"amount=100&currency=usd&metadata[order]=7&expand[]=b&expand[]=a",
		"amount=100&currency=usd&metadata[order]=7&expand[]=a",
	} {
		wantProblem(t, s.send(t, http.MethodPost, "/things", formType, other, "form"), 422, idemhttp.ProblemMismatch)
	}
	// Another media type is another request, and its bytes count as they are.
	wantProblem(t, s.send(t, http.MethodPost, "/things", "text/plain", "amount=100&currency=usd&metadata[order]=7&expand[]=a&expand[]=b", "form"),
		422, idemhttp.ProblemMismatch)
	wantStatus(t, s.send(t, http.MethodPost, "/things", "text/plain", "a=1&b=2", "text"), http.StatusCreated)
	wantProblem(t, s.send(t, http.MethodPost, "/things", "text/plain", "b=2&a=1", "text"), 422, idemhttp.ProblemMismatch)
	for _, bad := range []string{"amount=%zz", "amount=1;currency=usd"} {
		p := wantProblem(t, s.send(t, http.MethodPost, "/things", formType, bad, "bad-form"), 400, idemhttp.ProblemInvalidBody)
		if p.Title != "Request body is not a valid form" {
			t.Errorf("title %q", p.Title)
		}
	}
	s.wantCalls(t, 2)
	s.wantEffects(t, "/form", 1)
	s.wantEffects(t, "/bad-form", 0)
}

// testFormStoredAsBytes: a form request stored before CanonicalForm (its
// fingerprint taken on the body's bytes), retried with the same bytes,
// gets its answer; with other bytes it is refused as it was then.
func testFormStoredAsBytes[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, nil, created)
	ctx := testkit.Context(t, 20*time.Second)
	raw := "currency=usd&amount=100&name=Jane+Doe"
	old := idempotency.Fingerprint([]byte(http.MethodPost), []byte("/things"), []byte(formType), []byte(raw))
	stored := idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"then"}`)}
	if _, err := e.newGuard(nil).Do(ctx, idempotency.Key{ID: "then"}, old, func(Tx) (idempotency.Response, error) { return stored, nil }); err != nil {
		t.Fatal(err)
	}
	res := s.send(t, http.MethodPost, "/things", formType, raw, "then")
	if res.status != http.StatusCreated || string(res.body) != `{"id":"then"}` || res.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("the same bytes: %d %s %v; want the stored answer, replayed", res.status, res.body, res.header)
	}
	wantProblem(t, s.send(t, http.MethodPost, "/things", formType, "amount=100&currency=usd&name=Jane+Doe", "then"), 422, idemhttp.ProblemMismatch)
	wantProblem(t, s.send(t, http.MethodPost, "/things", formType, "currency=usd&amount=101&name=Jane+Doe", "then"), 422, idemhttp.ProblemMismatch)
	s.wantCalls(t, 0)
}

// stripeBody decodes a WriteStripeError body strictly.
func stripeBody(t *testing.T, res result, status int, typ, code string, retry bool) idemhttp.StripeError {
	t.Helper()
	var body struct {
		Error *idemhttp.StripeError `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Error == nil {
		t.Fatalf("body %q: %v, want a Stripe error object", res.body, err)
	}
	e := *body.Error
	if res.status != status || e.Type != typ || e.Code != code || e.Message == "" {
		t.Errorf("got %d %+v; want %d type %s code %q with a message", res.status, e, status, typ, code)
	}
	want := map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store",
		idemhttp.HeaderShouldRetry: map[bool]string{true: "true", false: "false"}[retry]}
	for k, v := range want {
		if got := res.header.Get(k); got != v {
			t.Errorf("%d %s: %q, want %q", status, k, got, v)
		}
	}
	return e
}

// testStripeErrors: with RenderProblem: WriteStripeError every problem the
// middleware answers is a Stripe error object, with its status and fields.
func testStripeErrors[Tx any](t *testing.T, e env[Tx]) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := startServer(t, e, &idempotency.Config{WaitTimeout: -1}, &idemhttp.Options{
		RenderProblem: idemhttp.WriteStripeError,
		Scope: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") == "" {
				return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: 401,
					Header: http.Header{"Www-Authenticate": {`Bearer realm="payments"`}}}
			}
			return "acct", nil
		},
	}, func(n int64, w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			close(entered)
			<-release
		case "/silent":
			return // no answer: 500 ProblemNoResponse
		}
		created(n, w, r)
	})
	auth := []string{"Authorization", "Bearer sk_test"}
	post := func(path, body string, header ...string) result {
		return s.do(t, path, body, append(header, auth...)...)
	}

	stripeBody(t, post("/things", `{}`), 400, "invalid_request_error", "idempotency_key_missing", false)
	stripeBody(t, post("/things", `{}`, "Idempotency-Key", "a", "Idempotency-Key", "b"), 400, "invalid_request_error", "idempotency_key_invalid", false)
	stripeBody(t, post("/things", `{"a":`, "Idempotency-Key", "bad"), 400, "invalid_request_error", "invalid_body", false)
	res := s.do(t, "/things", `{}`, "Idempotency-Key", "noauth")
	if e := stripeBody(t, res, 401, "authentication_error", "", false); e.DocURL != "" || e.Message != "Unauthorized" {
		t.Errorf("401: %+v", e)
	}
	if got := res.header.Get("WWW-Authenticate"); got != `Bearer realm="payments"` {
		t.Errorf("401 lost WWW-Authenticate: %q", got)
	}

	wantStatus(t, post("/things", `{"amount":1}`, "Idempotency-Key", "used"), http.StatusCreated)
	res = post("/things", `{"amount":2}`, "Idempotency-Key", "used")
	stripeBody(t, res, 422, "idempotency_error", "idempotency_key_reused", false)
	want := `{"error":{"type":"idempotency_error","code":"idempotency_key_reused","message":"Idempotency-Key is already used. ` +
		`This key was used with a different request (method, route or body); use a new key for a new request.",` +
		`"doc_url":"https://pkg.go.dev/github.com/go-idempotency/idempotency/idemhttp#ProblemKeyReused"}}`
	if string(res.body) != want {
		t.Errorf("422 body\n%s\nwant\n%s", res.body, want)
	}

	stripeBody(t, post("/silent", `{}`, "Idempotency-Key", "silent"), 500, "api_error", "no_response", false)

	done := make(chan result, 1)
	go func() { done <- post("/slow", `{}`, "Idempotency-Key", "held") }()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	res = post("/slow", `{}`, "Idempotency-Key", "held")
	close(release)
	stripeBody(t, res, http.StatusConflict, "idempotency_error", "idempotency_key_in_use", true)
	if res.header.Get("Retry-After") == "" || res.header.Get(idemhttp.HeaderKeyExpires) == "" {
		t.Errorf("409 lost Retry-After or %s: %v", idemhttp.HeaderKeyExpires, res.header)
	}
	wantStatus(t, <-done, http.StatusCreated)

	e.breakStore()
	stripeBody(t, post("/things", `{}`, "Idempotency-Key", "down"), 503, "api_error", "idempotency_store_unavailable", true)
	s.wantCalls(t, 3) // used, silent, slow
}

// TestStripeErrorOf: every problem type of the package has its type and
// code; others go by status.
func TestStripeErrorOf(t *testing.T) {
	for _, c := range []struct {
		p           idemhttp.Problem
		typ, code   string
		docs, retry string
	}{
		{idemhttp.Problem{Type: idemhttp.ProblemOverQuota, Title: "Quota exceeded", Status: 429, Header: http.Header{"Retry-After": {"30"}}},
			"rate_limit_error", "rate_limit", idemhttp.ProblemOverQuota, "false"},
		{idemhttp.Problem{Type: idemhttp.ProblemInProgress, Title: "In progress", Status: 425, Header: http.Header{"Retry-After": {"1"}}},
			"idempotency_error", "idempotency_key_in_use", idemhttp.ProblemInProgress, "true"},
		{idemhttp.Problem{Type: idemhttp.ProblemUnfinished, Title: "Unfinished", Status: 503, Header: http.Header{"Retry-After": {"1"}}},
			"api_error", "operation_unfinished", idemhttp.ProblemUnfinished, "true"},
		{idemhttp.Problem{Type: idemhttp.ProblemInternal, Title: "Failed", Status: 500}, "api_error", "internal_error", idemhttp.ProblemInternal, "false"},
		{idemhttp.Problem{Type: "urn:example:locked", Title: "Locked", Status: 403}, "permission_error", "", "", "false"},
		{idemhttp.Problem{Type: "https://docs.example/slow-down", Title: "Slow down", Status: 429}, "rate_limit_error", "", "https://docs.example/slow-down", "false"},
		{idemhttp.Problem{Type: "about:blank", Title: "Bad gateway", Status: 502}, "api_error", "", "", "false"},
		{idemhttp.Problem{Type: "about:blank", Title: "Gone", Status: 410}, "invalid_request_error", "", "", "false"},
	} {
		e := idemhttp.StripeErrorOf(&c.p)
		if e.Type != c.typ || e.Code != c.code || e.DocURL != c.docs || e.Message != c.p.Title {
			t.Errorf("%s %d: %+v; want %s %q docs %q", c.p.Type, c.p.Status, e, c.typ, c.code, c.docs)
		}
		rec := httptest.NewRecorder()
		idemhttp.WriteStripeError(rec, nil, &c.p)
		if rec.Code != c.p.Status || rec.Header().Get(idemhttp.HeaderShouldRetry) != c.retry {
			t.Errorf("%s %d: wrote %d, %s %q", c.p.Type, c.p.Status, rec.Code, idemhttp.HeaderShouldRetry, rec.Header().Get(idemhttp.HeaderShouldRetry))
		}
		if ra := c.p.Header.Get("Retry-After"); rec.Header().Get("Retry-After") != ra {
			t.Errorf("%s: Retry-After %q, want %q", c.p.Type, rec.Header().Get("Retry-After"), ra)
		}
	}
	e := idemhttp.StripeErrorOf(&idemhttp.Problem{Type: "about:blank", Title: "Nope.", Status: 400, Detail: "Send a name."})
	if e.Message != "Nope. Send a name." {
		t.Errorf("message %q", e.Message)
	}
}

// testEchoKey: with EchoKey the key header comes back as sent on every
// answer once it parses: the first answer, replays and problems.
func testEchoKey[Tx any](t *testing.T, e env[Tx]) {
	s := startServer(t, e, nil, &idemhttp.Options{EchoKey: true, ExposeHeaders: true}, created)
	first := s.post(t, `{"a":1}`, `"echo-1"`)
	wantStatus(t, first, http.StatusCreated)
	replay := s.post(t, `{"a":1}`, "echo-1")
	wantReplay(t, first, replay)
	reused := s.post(t, `{"a":2}`, "echo-1")
	wantProblem(t, reused, 422, idemhttp.ProblemMismatch)
	for _, c := range []struct {
		res  result
		want string
	}{{first, `"echo-1"`}, {replay, "echo-1"}, {reused, "echo-1"}} {
		if got := c.res.header.Values(idemhttp.DefaultKeyHeader); len(got) != 1 || got[0] != c.want {
			t.Errorf("%d: %s %q, want %q", c.res.status, idemhttp.DefaultKeyHeader, got, c.want)
		}
		if exp := strings.Join(c.res.header.Values("Access-Control-Expose-Headers"), ","); !strings.Contains(exp, idemhttp.DefaultKeyHeader) {
			t.Errorf("%d: Access-Control-Expose-Headers %q lacks %s", c.res.status, exp, idemhttp.DefaultKeyHeader)
		}
	}
	// No key, or one that does not parse: nothing to echo.
	for _, res := range []result{s.post(t, `{}`), s.post(t, `{}`, "a", "b"), s.post(t, `{}`, strings.Repeat("k", 256))} {
		if got := res.header.Values(idemhttp.DefaultKeyHeader); res.status != 400 || got != nil {
			t.Errorf("%d: echoed %q", res.status, got)
		}
	}
	// Another key header is echoed under its own name; off by default.
	x := startServer(t, e, nil, &idemhttp.Options{EchoKey: true, KeyHeader: "X-Idempotency-Key"}, created)
	res := x.do(t, "/things", `{}`, "X-Idempotency-Key", "x-1")
	if got := res.header.Get("X-Idempotency-Key"); res.status != http.StatusCreated || got != "x-1" || res.header.Get(idemhttp.DefaultKeyHeader) != "" {
		t.Errorf("%d: X-Idempotency-Key %q, Idempotency-Key %q", res.status, got, res.header.Get(idemhttp.DefaultKeyHeader))
	}
	d := startServer(t, e, nil, nil, created)
	if got := d.post(t, `{}`, "quiet").header.Values(idemhttp.DefaultKeyHeader); got != nil {
		t.Errorf("echoed %q without EchoKey", got)
	}
	s.wantEffects(t, "/echo-1", 1)
}
