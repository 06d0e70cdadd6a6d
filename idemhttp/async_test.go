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

func runAsyncTests[Tx any](t *testing.T, b storeRig[Tx]) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, env[Tx])
	}{
		{"WithinWait", testAsyncWithinWait[Tx]},
		{"AcceptedThenStatus", testAsyncAccepted[Tx]},
		{"DiedCompleterFinishes", testAsyncDied[Tx]},
		{"Refusals", testAsyncRefusals[Tx]},
		{"MismatchWhileRunning", testAsyncMismatchWhileRunning[Tx]},
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

// asyncSecret is the status ids' secret of the tests' Async servers: the
// same in every one, as in every instance of a service.
var asyncSecret = bytes.Repeat([]byte("0123456789abcdef"), 2)

// asyncConfig is the config of asyncServer, with the Wait wait.
func asyncConfig(wait time.Duration) *idemhttp.AsyncOptions {
	return &idemhttp.AsyncOptions{
		Options:    &idemhttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }},
		StatusPath: "/ops/",
		Secrets:    [][]byte{asyncSecret},
		Wait:       wait,
	}
}

// opsPath is the status resource of the key (account, id) on asyncServer.
func opsPath(t *testing.T, account, id string) string {
	t.Helper()
	loc, err := asyncConfig(0).StatusLocation(idempotency.Key{Scope: account, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// asyncServer serves op (POST /ship) and its status (GET /ops/) on g, the
// scope taken from X-Account.
func asyncServer[Tx any](t *testing.T, g *idempotency.Guard[Tx], op *idempotency.Operation[Tx], wait time.Duration) *httptest.Server {
	t.Helper()
	cfg := asyncConfig(wait)
	post, err := idemhttp.Async(g, op, cfg)
	if err != nil {
		t.Fatal(err)
	}
	status, err := idemhttp.AsyncStatus(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /ship", post)
	mux.Handle("GET /ops/", status)
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
	st := asyncCall(t, ctx, "GET", srv.URL+opsPath(t, "acct", "k1"), "acct", "", "")
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
	if loc := acc.header.Get("Location"); strings.Contains(loc, "slow") || !strings.HasPrefix(loc, "/ops/") {
		t.Fatalf("Location %q shows the key", loc)
	}
	if acc.status != 202 || acc.header.Get("Location") != opsPath(t, "acct", "slow/1") || acc.header.Get("Retry-After") != "1" || acc.body != `{"status":"in_progress"}` {
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
	if st := asyncCall(t, ctx, "GET", srvB.URL+acc.header.Get("Location"), "acct", "", ""); st.status != 202 {
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
	st := asyncCall(t, ctx, "GET", srvB.URL+acc.header.Get("Location"), "acct", "", "")
	if st.status != 201 || st.body != `{"shipped":{"n":3}}` {
		t.Fatalf("status after the Completer: %+v", st)
	}
	if st2 := asyncCall(t, ctx, "GET", srvA.URL+acc.header.Get("Location"), "acct", "", ""); st2.status != 201 || st2.body != st.body {
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
	mine := opsPath(t, "acct", "r1")
	forged := []byte(mine)
	forged[len(forged)-1] ^= 1
	for _, c := range []struct {
		path, account string
	}{
		{opsPath(t, "acct", "nope"), "acct"},                 // no such operation
		{mine, "other-account"},                              // another scope's id
		{opsPath(t, "other-account", "r1"), "other-account"}, // the key in another scope
		{"/ops/r1", "acct"},                                  // the raw key names nothing
		{string(forged), "acct"},                             // an id no secret opens
		{"/ops/", "acct"},
	} {
		r := asyncCall(t, ctx, "GET", srv.URL+c.path, c.account, "", "")
		if r.status != 404 || !strings.Contains(r.body, idemhttp.ProblemUnknownOperation) {
			t.Errorf("GET %s as %s: %+v; want 404 %s", c.path, c.account, r, idemhttp.ProblemUnknownOperation)
		}
	}
	if r := asyncCall(t, ctx, "GET", srv.URL+mine, "acct", "", ""); r.status != 201 {
		t.Errorf("GET %s as acct: %+v; want the stored 201", mine, r)
	}
	// Another instance of the service with another secret cannot open it.
	cfg := asyncConfig(time.Second)
	cfg.Secrets = [][]byte{bytes.Repeat([]byte("x"), 32)}
	other, err := idemhttp.AsyncStatus(e.newGuard(nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, "GET", mine, nil)
	req.Header.Set("X-Account", "acct")
	if other.ServeHTTP(rec, req); rec.Code != 404 {
		t.Errorf("GET with another secret: %d %s; want 404", rec.Code, rec.Body)
	}
	if r := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "", `{}`); r.status != 400 || !strings.Contains(r.body, idemhttp.ProblemMissingKey) {
		t.Fatalf("no key: %+v", r)
	}
	if n := e.count(ctx, "r1"); n != 1 {
		t.Fatalf("effects %d; want 1", n)
	}
}

// testAsyncMismatchWhileRunning: the same key with another body while the
// first request's operation runs is refused 422 (the stored record's
// fingerprint is final), not 409 in progress, which a client retries until
// the operation ends; the operation runs once, for the first request.
func testAsyncMismatchWhileRunning[Tx any](t *testing.T, e env[Tx]) {
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
	srv := asyncServer(t, g, shipOp(e, gate), 20*time.Millisecond)
	if acc := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "m1", `{"n":6}`); acc.status != 202 {
		t.Fatalf("POST: %+v; want 202", acc)
	}
	other := asyncServer(t, e.newGuard(nil), shipOp(e, gate), 20*time.Millisecond) // another process
	for _, url := range []string{srv.URL, other.URL} {
		t0 := time.Now()
		r := asyncCall(t, ctx, "POST", url+"/ship", "acct", "m1", `{"n":7}`)
		if r.status != 422 || !strings.Contains(r.body, idemhttp.ProblemMismatch) || time.Since(t0) > 900*time.Millisecond {
			t.Fatalf("same key, other body, while the operation runs: %+v after %v; want 422 %s within Wait", r, time.Since(t0), idemhttp.ProblemMismatch)
		}
	}
	close(release)
	var done asyncReply
	for done.status == 0 || done.status == 202 {
		time.Sleep(20 * time.Millisecond)
		done = asyncCall(t, ctx, "GET", srv.URL+opsPath(t, "acct", "m1"), "acct", "", "")
	}
	if done.status != 201 || done.body != `{"shipped":{"n":6}}` {
		t.Fatalf("status once finished: %+v", done)
	}
	if r := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "m1", `{"n":7}`); r.status != 422 {
		t.Fatalf("same key, other body, once finished: %+v; want 422", r)
	}
	if n, d := e.count(ctx, "m1"), e.count(ctx, "m1-done"); n != 1 || d != 1 {
		t.Fatalf("effects %d and %d; want 1 each", n, d)
	}
}
