package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

func TestOperationSQLite(t *testing.T) {
	t.Parallel()
	runOperationTests(t, sqliteEnv)
}

func TestOperationPostgres(t *testing.T) {
	t.Parallel()
	runOperationTests(t, postgresEnv)
}

func runOperationTests[Tx any](t *testing.T, b storeRig[Tx]) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, env[Tx])
	}{
		{"Statuses", testOperationStatuses[Tx]},
		{"ValidateStoresNothing", testOperationValidate[Tx]},
		{"AsyncValidateStoresNothing", testAsyncValidate[Tx]},
		{"MismatchWhileRunning", testOperationMismatchWhileRunning[Tx]},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, b(t)) })
	}
}

// payOp writes an effect tagged with the key's id in its first step,
// then calls a processor (Foreign) that fails while failing is set and
// declines an amount of 666 with a Stop(402). Validate refuses an amount
// that is not positive, with a *Problem 422 for a currency it does not
// take. Finish answers 201.
func payOp[Tx any](e env[Tx], failing *atomic.Bool) *idempotency.Operation[Tx] {
	type payment struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	parse := func(b []byte) (payment, error) {
		var p payment
		err := json.Unmarshal(b, &p)
		return p, err
	}
	return &idempotency.Operation[Tx]{
		Name: "pay",
		Validate: func(_ context.Context, input []byte) error {
			p, err := parse(input)
			switch {
			case err != nil:
				return err
			case p.Currency != "" && p.Currency != "EUR":
				return &idemhttp.Problem{Type: "https://example.com/currency", Title: "Currency not taken", Status: http.StatusUnprocessableEntity,
					Detail: "Pay in EUR."}
			case p.Amount <= 0:
				return fmt.Errorf("amount %d: send a positive amount of cents", p.Amount)
			}
			return nil
		},
		Steps: []idempotency.Step[Tx]{
			{Name: "order", Local: func(ctx context.Context, tx Tx, s *idempotency.State) error {
				return e.effect(ctx, tx, s.Key().ID)
			}},
			{Name: "charge", Foreign: func(_ context.Context, s *idempotency.State) error {
				if failing != nil && failing.Load() {
					return errors.New("processor timed out")
				}
				if p, _ := parse(s.Input()); p.Amount == 666 {
					return idempotency.FinalAnswer(idempotency.Response{Status: http.StatusPaymentRequired, Body: []byte(`{"declined":true}`)})
				}
				return nil
			}},
		},
		Finish: func(ctx context.Context, tx Tx, s *idempotency.State) (idempotency.Response, error) {
			if err := e.effect(ctx, tx, s.Key().ID+"-done"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"paid":true}`)}, nil
		},
	}
}

// opServer serves op at POST /pay, the scope from X-Account.
func opServer[Tx any](t *testing.T, g *idempotency.Guard[Tx], op *idempotency.Operation[Tx]) *httptest.Server {
	t.Helper()
	h, err := idemhttp.Operation(g, op, &idemhttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// testOperationStatuses: every outcome of a run maps to its documented
// status.
func testOperationStatuses[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	var failing atomic.Bool
	srv := opServer(t, e.newGuard(nil), payOp(e, &failing))
	url := srv.URL + "/pay"
	first := asyncCall(t, ctx, "POST", url, "acct", "p1", `{"amount":5}`)
	if first.status != 201 || first.body != `{"paid":true}` || first.header.Get(idemhttp.HeaderReplayed) != "" || first.header.Get(idemhttp.HeaderKeyExpires) == "" {
		t.Fatalf("first: %+v", first)
	}
	if again := asyncCall(t, ctx, "POST", url, "acct", "p1", `{"amount":5}`); again.status != 201 || again.body != first.body || again.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay: %+v", again)
	}
	if other := asyncCall(t, ctx, "POST", url, "acct", "p1", `{"amount":6}`); other.status != 422 || !strings.Contains(other.body, idemhttp.ProblemMismatch) {
		t.Fatalf("other body: %+v; want 422", other)
	}
	if d := asyncCall(t, ctx, "POST", url, "acct", "p2", `{"amount":666}`); d.status != 402 || d.body != `{"declined":true}` {
		t.Fatalf("declined: %+v; want the Stop's 402", d)
	}
	if d := asyncCall(t, ctx, "POST", url, "acct", "p2", `{"amount":666}`); d.status != 402 || d.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("declined, replayed: %+v", d)
	}
	failing.Store(true)
	u := asyncCall(t, ctx, "POST", url, "acct", "p3", `{"amount":7}`)
	if u.status != 503 || !strings.Contains(u.body, idemhttp.ProblemUnfinished) || u.header.Get("Retry-After") == "" {
		t.Fatalf("a failed step: %+v; want 503 %s with Retry-After", u, idemhttp.ProblemUnfinished)
	}
	failing.Store(false)
	if r := asyncCall(t, ctx, "POST", url, "acct", "p3", `{"amount":7}`); r.status != 201 {
		t.Fatalf("the retry after a failed step: %+v; want 201", r)
	}
	if r := asyncCall(t, ctx, "POST", url, "acct", "", `{"amount":7}`); r.status != 400 || !strings.Contains(r.body, idemhttp.ProblemMissingKey) {
		t.Fatalf("no key: %+v", r)
	}
	for _, tag := range []string{"p1", "p1-done", "p2", "p3", "p3-done"} {
		if n := e.count(ctx, tag); n != 1 {
			t.Errorf("effects %q: %d; want 1", tag, n)
		}
	}
	if n := e.count(ctx, "p2-done"); n != 0 {
		t.Errorf("a declined payment finished: %d", n)
	}
}

// testOperationValidate: a body Validate refuses is answered 400 with its
// message (or the Problem it returned), with nothing stored, and the
// corrected body with the same key runs. Before Validate, the operation
// could only refuse in a step, with a Stop(400) that was stored: the
// corrected retry got 422.
func testOperationValidate[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	g := e.newGuard(nil)
	srv := opServer(t, g, payOp(e, nil))
	url := srv.URL + "/pay"
	bad := asyncCall(t, ctx, "POST", url, "acct", "v1", `{"amount":0}`)
	if bad.status != 400 || !strings.Contains(bad.body, idemhttp.ProblemInvalidBody) ||
		!strings.Contains(bad.body, `"detail":"amount 0: send a positive amount of cents"`) {
		t.Fatalf("invalid body: %+v; want 400 with Validate's message", bad)
	}
	p := asyncCall(t, ctx, "POST", url, "acct", "v1", `{"amount":1,"currency":"USD"}`)
	if p.status != 422 || !strings.Contains(p.body, "https://example.com/currency") || !strings.Contains(p.body, "Pay in EUR.") {
		t.Fatalf("a Problem from Validate: %+v; want it answered", p)
	}
	if _, err := g.Inspect(ctx, idempotency.Key{Scope: "acct", ID: "v1"}, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the key after the refusals: %v; want nothing stored", err)
	}
	if ok := asyncCall(t, ctx, "POST", url, "acct", "v1", `{"amount":9}`); ok.status != 201 {
		t.Fatalf("the corrected body with the same key: %+v; want 201", ok)
	}
	if n := e.count(ctx, "v1"); n != 1 {
		t.Fatalf("effects %d; want 1", n)
	}
}

// testAsyncValidate: Async answers Validate's refusal at once (not after
// Wait), 400, with nothing stored; the corrected body runs.
func testAsyncValidate[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	g := e.newGuard(nil)
	srv := asyncServer(t, g, payOp(e, nil), 5*time.Second)
	t0 := time.Now()
	bad := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "a1", `{"amount":-1}`)
	if bad.status != 400 || !strings.Contains(bad.body, "send a positive amount") || time.Since(t0) > 3*time.Second {
		t.Fatalf("invalid body: %+v after %v; want 400 with Validate's message at once", bad, time.Since(t0))
	}
	if _, err := g.Inspect(ctx, idempotency.Key{Scope: "acct", ID: "a1"}, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the key after the refusal: %v; want nothing stored (Async runs Durable)", err)
	}
	if ok := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "a1", `{"amount":3}`); ok.status != 201 {
		t.Fatalf("the corrected body with the same key: %+v; want 201", ok)
	}
}

// TestOperationRefusesBadConfig: Operation refuses, when built, what it
// cannot serve.
func TestOperationRefusesBadConfig(t *testing.T) {
	g, err := idempotency.New[*memstore.Tx](memstore.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	op := labelOp(nil, nil)
	scope := func(*http.Request) (string, error) { return "", nil }
	for _, c := range []struct {
		name string
		g    *idempotency.Guard[*memstore.Tx]
		op   *idempotency.Operation[*memstore.Tx]
		cfg  *idemhttp.Options
		want string
	}{
		{"nil Config", g, op, nil, "Scope"},
		{"no Scope", g, op, &idemhttp.Options{}, "Scope"},
		{"bad TTL", g, op, &idemhttp.Options{Scope: scope, TTL: -1}, "TTL"},
		{"KeyOptional", g, op, &idemhttp.Options{Scope: scope, KeyOptional: true}, "KeyOptional"},
		{"Quota", g, op, &idemhttp.Options{Scope: scope, Quota: &idempotency.Quota{MaxKeys: 1, Window: time.Minute}}, "Quota"},
		{"nil Guard", nil, op, &idemhttp.Options{Scope: scope}, "nil Guard"},
		{"nil op", g, nil, &idemhttp.Options{Scope: scope}, "nil operation"},
		{"op without Finish", g, &idempotency.Operation[*memstore.Tx]{Name: "x"}, &idemhttp.Options{Scope: scope}, "Finish"},
	} {
		h, err := idemhttp.Operation(c.g, c.op, c.cfg)
		if h != nil || err == nil || !strings.Contains(err.Error(), c.want) ||
			(!errors.Is(err, idempotency.ErrInvalidConfig) && !errors.Is(err, idemhttp.ErrNoScope)) {
			t.Errorf("%s: %v, %v; want ErrInvalidConfig naming %q", c.name, h, err, c.want)
		}
	}
	if _, err := idemhttp.Operation(g, op, &idemhttp.Options{Scope: scope}); err != nil {
		t.Fatalf("a good config: %v", err)
	}
}

// testOperationMismatchWhileRunning: the same key with another body while
// the first request's operation runs (committed, its lease live) is 422,
// in this process and in another, not 409 in progress, which a client
// retries until the operation ends.
func testOperationMismatchWhileRunning[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	release := make(chan struct{})
	gate := func(ctx context.Context) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	quick := &idempotency.Config{WaitTimeout: 200 * time.Millisecond}
	op := shipOp(e, gate)
	op.Lease = time.Minute // the first run holds the key throughout
	srv := opServer(t, e.newGuard(quick), op)
	other := opServer(t, e.newGuard(quick), op)
	first := make(chan asyncReply, 1)
	go func() { first <- asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "m1", `{"n":1}`) }()
	testkit.WaitUntil(t, 5*time.Second, "the first step committed", func() bool { return e.count(ctx, "m1") == 1 })
	for _, url := range []string{srv.URL, other.URL} {
		if r := asyncCall(t, ctx, "POST", url+"/ship", "acct", "m1", `{"n":2}`); r.status != 422 || !strings.Contains(r.body, idemhttp.ProblemMismatch) {
			t.Errorf("same key, other body, while the operation runs: %+v; want 422", r)
		}
	}
	if r := asyncCall(t, ctx, "POST", other.URL+"/ship", "acct", "m1", `{"n":1}`); r.status != 409 || !strings.Contains(r.body, idemhttp.ProblemInProgress) {
		t.Errorf("same key, same body, while the operation runs: %+v; want 409 in progress", r)
	}
	close(release)
	if r := <-first; r.status != 201 || r.body != `{"shipped":{"n":1}}` {
		t.Fatalf("the first request: %+v", r)
	}
	if n, d := e.count(ctx, "m1"), e.count(ctx, "m1-done"); n != 1 || d != 1 {
		t.Fatalf("effects %d and %d; want 1 each", n, d)
	}
}
