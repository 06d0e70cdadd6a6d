package idemhttp_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

func TestAsyncSQLite(t *testing.T) {
	t.Parallel()
	runAsyncTests(t, sqliteEnv)
}

func TestAsyncPostgres(t *testing.T) {
	t.Parallel()
	runAsyncTests(t, postgresEnv)
}

func runAsyncTests[Tx any](t *testing.T, b backend[Tx]) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, env[Tx])
	}{
		{"WithinWait", testAsyncWithinWait[Tx]},
		{"AcceptedThenStatus", testAsyncAccepted[Tx]},
		{"DiedCompleterFinishes", testAsyncDied[Tx]},
		{"Refusals", testAsyncRefusals[Tx]},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, b(t)) })
	}
}

// shipOp writes an effect tagged with the key's id in its first step,
// runs gate (if not nil) as a Foreign call, then answers 201 with a body
// that names the input.
func shipOp[Tx any](e env[Tx], gate func(ctx context.Context) error) *idempotency.Operation[Tx] {
	return &idempotency.Operation[Tx]{
		Name: "ship",
		Steps: []idempotency.Step[Tx]{
			{Name: "label", Local: func(ctx context.Context, tx Tx, s *idempotency.State) error {
				return e.effect(ctx, tx, s.Key().ID)
			}},
			{Name: "carrier", Foreign: func(ctx context.Context, s *idempotency.State) error {
				if gate != nil {
					return gate(ctx)
				}
				return nil
			}},
		},
		Finish: func(ctx context.Context, tx Tx, s *idempotency.State) (idempotency.Response, error) {
			if err := e.effect(ctx, tx, s.Key().ID+"-done"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
				Body: append([]byte(`{"shipped":`), append(bytes.Clone(s.Input()), '}')...)}, nil
		},
		Lease: 300 * time.Millisecond,
	}
}

// asyncServer serves op (POST /ship) and its status (GET /ops/) on g, the
// scope taken from X-Account.
func asyncServer[Tx any](t *testing.T, g *idempotency.Guard[Tx], op *idempotency.Operation[Tx], wait time.Duration) *httptest.Server {
	cfg := &idemhttp.AsyncConfig{
		Config:     &idemhttp.Config{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }},
		StatusPath: "/ops/",
		Wait:       wait,
	}
	mux := http.NewServeMux()
	mux.Handle("POST /ship", idemhttp.Async(g, op, cfg))
	mux.Handle("GET /ops/", idemhttp.AsyncStatus(g, cfg))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

type asyncReply struct {
	status int
	header http.Header
	body   string
}

func asyncCall(t *testing.T, ctx context.Context, method, url, account, key, body string) asyncReply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Account", account)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return asyncReply{resp.StatusCode, resp.Header, string(b)}
}

func testAsyncWithinWait[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	srv := asyncServer(t, e.newGuard(nil), shipOp(e, nil), 5*time.Second)
	first := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "k1", `{"n":1}`)
	if first.status != 201 || first.body != `{"shipped":{"n":1}}` || first.header.Get(idemhttp.HeaderReplayed) != "" || first.header.Get(idemhttp.HeaderKeyExpires) == "" {
		t.Fatalf("first: %+v", first)
	}
	again := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "k1", `{"n":1}`)
	if again.status != 201 || again.body != first.body || again.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("retry: %+v", again)
	}
	st := asyncCall(t, ctx, "GET", srv.URL+"/ops/k1", "acct", "", "")
	if st.status != 201 || st.body != first.body || st.header.Get(idemhttp.HeaderReplayed) != "true" || st.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status: %+v", st)
	}
	if n, d := e.count(ctx, "k1"), e.count(ctx, "k1-done"); n != 1 || d != 1 {
		t.Fatalf("effects %d and %d; want 1 each", n, d)
	}
}

func testAsyncAccepted[Tx any](t *testing.T, e env[Tx]) {
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
	g := e.newGuard(nil)
	srv := asyncServer(t, g, shipOp(e, gate), time.Millisecond)
	acc := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "slow/1", `{"n":2}`)
	if acc.status != 202 || acc.header.Get("Location") != "/ops/slow%2F1" || acc.header.Get("Retry-After") != "1" || acc.body != `{"status":"in_progress"}` {
		t.Fatalf("POST: %+v; want 202 with the status resource", acc)
	}
	st := asyncCall(t, ctx, "GET", srv.URL+acc.header.Get("Location"), "acct", "", "")
	if st.status != 202 || st.body != `{"status":"in_progress"}` || st.header.Get("Retry-After") != "1" {
		t.Fatalf("status while running: %+v", st)
	}
	// A retry of the POST meanwhile gets 202 again, and runs nothing.
	if again := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "slow/1", `{"n":2}`); again.status != 202 {
		t.Fatalf("POST retry while running: %+v", again)
	}
	close(release)
	var done asyncReply
	for {
		done = asyncCall(t, ctx, "GET", srv.URL+acc.header.Get("Location"), "acct", "", "")
		if done.status != 202 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if done.status != 201 || done.body != `{"shipped":{"n":2}}` || done.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("status once finished: %+v", done)
	}
	patient := asyncServer(t, g, shipOp(e, gate), 5*time.Second)
	if replay := asyncCall(t, ctx, "POST", patient.URL+"/ship", "acct", "slow/1", `{"n":2}`); replay.status != 201 || replay.body != done.body {
		t.Fatalf("POST once finished: %+v; want the stored answer", replay)
	}
	if n, d := e.count(ctx, "slow/1"), e.count(ctx, "slow/1-done"); n != 1 || d != 1 {
		t.Fatalf("effects %d and %d; want 1 each", n, d)
	}
}

// testAsyncDied: the process that accepted the request dies inside the
// Foreign call (its run hangs there, its lease runs out); another
// process's Completer finishes the operation, whose status resource then
// serves the answer. The hung run, woken, commits nothing more.
func testAsyncDied[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	hang := make(chan struct{})
	var once sync.Once
	wake := func() { once.Do(func() { close(hang) }) }
	t.Cleanup(wake)
	hung := func(ctx context.Context) error { <-hang; return nil }
	gA := e.newGuard(nil)
	srvA := asyncServer(t, gA, shipOp(e, hung), time.Millisecond)
	acc := asyncCall(t, ctx, "POST", srvA.URL+"/ship", "acct", "died", `{"n":3}`)
	if acc.status != 202 {
		t.Fatalf("POST: %+v", acc)
	}
	gB := e.newGuard(nil)
	opB := shipOp(e, nil)
	srvB := asyncServer(t, gB, opB, time.Millisecond)
	if st := asyncCall(t, ctx, "GET", srvB.URL+"/ops/died", "acct", "", ""); st.status != 202 {
		t.Fatalf("status from another process while the lease lives: %+v", st)
	}
	c, err := idempotency.NewCompleter(gB, &idempotency.CompleterConfig{Grace: time.Millisecond}, opB)
	if err != nil {
		t.Fatal(err)
	}
	var rep idempotency.CompleterReport
	for rep.Finished == 0 {
		time.Sleep(50 * time.Millisecond)
		if rep, err = c.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st := asyncCall(t, ctx, "GET", srvB.URL+"/ops/died", "acct", "", "")
	if st.status != 201 || st.body != `{"shipped":{"n":3}}` {
		t.Fatalf("status after the Completer: %+v", st)
	}
	if st2 := asyncCall(t, ctx, "GET", srvA.URL+"/ops/died", "acct", "", ""); st2.status != 201 || st2.body != st.body {
		t.Fatalf("status from the first process: %+v", st2)
	}
	wake() // the hung run goes on: its next phase finds the key completed
	patientA := asyncServer(t, gA, shipOp(e, hung), 5*time.Second)
	if replay := asyncCall(t, ctx, "POST", patientA.URL+"/ship", "acct", "died", `{"n":3}`); replay.status != 201 || replay.body != st.body {
		t.Fatalf("POST to the first process: %+v", replay)
	}
	if n, d := e.count(ctx, "died"), e.count(ctx, "died-done"); n != 1 || d != 1 {
		t.Fatalf("effects %d and %d; want 1 each", n, d)
	}
}

func testAsyncRefusals[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 20*time.Second)
	srv := asyncServer(t, e.newGuard(nil), shipOp(e, nil), 5*time.Second)
	if r := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "r1", `{"n":4}`); r.status != 201 {
		t.Fatalf("POST: %+v", r)
	}
	if r := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "r1", `{"n":5}`); r.status != 422 {
		t.Fatalf("same key, other body: %+v; want 422", r)
	}
	for _, c := range []struct {
		path, account string
		status        int
		problem       string
	}{
		{"/ops/nope", "acct", 404, idemhttp.ProblemUnknownOperation},
		{"/ops/r1", "other-account", 404, idemhttp.ProblemUnknownOperation},
		{"/ops/bad%00id", "acct", 400, idemhttp.ProblemInvalidKey},
	} {
		r := asyncCall(t, ctx, "GET", srv.URL+c.path, c.account, "", "")
		if r.status != c.status || !strings.Contains(r.body, c.problem) {
			t.Errorf("GET %s as %s: %+v; want %d %s", c.path, c.account, r, c.status, c.problem)
		}
	}
	if r := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "", `{}`); r.status != 400 || !strings.Contains(r.body, idemhttp.ProblemMissingKey) {
		t.Fatalf("no key: %+v", r)
	}
	if n := e.count(ctx, "r1"); n != 1 {
		t.Fatalf("effects %d; want 1", n)
	}
}
