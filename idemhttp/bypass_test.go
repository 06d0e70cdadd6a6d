package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
)

// TestWriterBypassSQLite and TestWriterBypassPostgres: a handler that
// writes around the middleware (gin's usual adapter, in plain net/http)
// is rolled back, reported once, and every later request is refused
// before the handler runs; the middleware used normally, concurrently, is
// never taken for one.
func TestWriterBypassSQLite(t *testing.T) {
	t.Parallel()
	runBypassTests(t, sqliteEnv)
}

func TestWriterBypassPostgres(t *testing.T) {
	t.Parallel()
	runBypassTests(t, postgresEnv)
}

func runBypassTests[Tx any](t *testing.T, b storeRig[Tx]) {
	cases := []struct {
		name string
		fn   func(*testing.T, env[Tx])
	}{
		{"RefusedAfter", testBypassRefusedAfter[Tx]},
		{"Concurrent", testBypassConcurrent[Tx]},
		{"ServerErrorLog", testBypassServerErrorLog[Tx]},
		{"NoFalsePositive", testBypassNoFalsePositive[Tx]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, b(t))
		})
	}
}

// reports collects what the middleware reports: OnError and Observer.
type reports struct {
	mu     sync.Mutex
	errs   []error
	events []idemhttp.RequestEvent
}

func (rp *reports) options() *idemhttp.Options {
	return &idemhttp.Options{
		Scope:   idemhttp.SharedScope, // one test client
		OnError: func(_ *http.Request, err error) { rp.mu.Lock(); rp.errs = append(rp.errs, err); rp.mu.Unlock() },
		Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
			rp.mu.Lock()
			rp.events = append(rp.events, ev)
			rp.mu.Unlock()
		},
	}
}

func (rp *reports) snapshot() ([]error, []idemhttp.RequestEvent) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return append([]error(nil), rp.errs...), append([]idemhttp.RequestEvent(nil), rp.events...)
}

// bypassServer serves POST /things through the generic middleware mounted
// the way gin's usual adapter mounts it: the middleware is built once, the
// handler it wraps is built per request, and the "framework" handler
// writes to the server's ResponseWriter (gin's c.Writer), the one the
// middleware was given, not the one it passes. It inserts one row through
// the transaction and answers 201 {"status":"approved"}.
type bypassServer[Tx any] struct {
	*httptest.Server
	env  env[Tx]
	runs atomic.Int64
}

func startBypass[Tx any](t *testing.T, e env[Tx], opts *idemhttp.Options, errorLog *log.Logger) *bypassServer[Tx] {
	t.Helper()
	s := &bypassServer[Tx]{env: e}
	mw := idemhttp.Middleware(e.newGuard(nil), opts)
	adapter := http.HandlerFunc(func(outer http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" { // the same middleware, its writer used as intended
			mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s.runs.Add(1)
				tx, _ := idempotency.TxFrom[Tx](r.Context())
				key, _ := idempotency.KeyFrom(r.Context())
				if err := e.effect(r.Context(), tx, key.Scope+"/"+key.ID); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "ok %d", s.runs.Load())
			})).ServeHTTP(outer, r)
			return
		}
		mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			s.runs.Add(1)
			tx, ok := idempotency.TxFrom[Tx](r.Context())
			key, _ := idempotency.KeyFrom(r.Context())
			if !ok {
				outer.WriteHeader(http.StatusTeapot)
				return
			}
			if err := e.effect(r.Context(), tx, key.Scope+"/"+key.ID); err != nil {
				http.Error(outer, err.Error(), http.StatusInternalServerError)
				return
			}
			outer.Header().Set("Content-Type", "application/json")
			outer.Header().Set("Location", "/things/1")
			outer.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(outer, `{"status":"approved"}`)
		})).ServeHTTP(outer, r)
	})
	s.Server = httptest.NewUnstartedServer(adapter)
	if errorLog == nil {
		errorLog = log.New(io.Discard, "", 0) // net/http's "superfluous WriteHeader"
	}
	s.Config.ErrorLog = errorLog
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *bypassServer[Tx]) post(t *testing.T, key string) result {
	t.Helper()
	srv := &server[Tx]{Server: s.Server}
	return srv.post(t, `{"amount":1999}`, key)
}

func (s *bypassServer[Tx]) effects(t *testing.T, key string) int {
	t.Helper()
	return (&server[Tx]{env: s.env}).effects(t, "/"+key)
}

// testBypassRefusedAfter is the bypass failure, in net/http terms:
// the client was told 201 "approved" while the middleware, seeing no
// answer, rolled the payment back, and every retry did it again. The first
// request cannot be taken back (201 reached the client, nothing
// committed); it is reported once, loudly, and every later request is
// refused with 500 before the handler runs.
func testBypassRefusedAfter[Tx any](t *testing.T, e env[Tx]) {
	var rp reports
	s := startBypass(t, e, rp.options(), nil)
	srv := &server[Tx]{Server: s.Server, env: e}
	stored := srv.send(t, http.MethodPost, "/ok", "application/json", `{}`, "ok-1")
	wantStatus(t, stored, http.StatusCreated)

	first := s.post(t, "pay-1")
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %q; want the handler's 201, which went to the client around the middleware", first.status, first.body)
	}
	if n := s.effects(t, "pay-1"); n != 0 {
		t.Errorf("first: %d effects committed, want 0 (rolled back)", n)
	}
	for i, key := range []string{"pay-1", "pay-1", "pay-2"} {
		res := s.post(t, key)
		if res.status == http.StatusCreated {
			t.Fatalf("request %d (%s): the handler answered 201 again around the middleware (handler ran %d times): want 500 before the handler runs", i+2, key, s.runs.Load())
		}
		p := wantProblem(t, res, http.StatusInternalServerError, idemhttp.ProblemInternal)
		if !strings.Contains(p.Detail, "not processed") {
			t.Errorf("request %d: detail %q; want it to say the request was not processed", i+2, p.Detail)
		}
	}
	// A key stored before the bypass is still replayed; a new key on the
	// route mounted correctly is refused too: the state is the
	// middleware's, whichever handler it wraps.
	wantReplay(t, stored, srv.send(t, http.MethodPost, "/ok", "application/json", `{}`, "ok-1"))
	wantProblem(t, srv.send(t, http.MethodPost, "/ok", "application/json", `{}`, "ok-2"), http.StatusInternalServerError, idemhttp.ProblemInternal)
	if n := s.runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (ok-1, then the bypass; the later requests are refused before it runs)", n)
	}
	srv.wantEffects(t, "/ok-1", 1)
	srv.wantEffects(t, "/ok-2", 0)
	for _, key := range []string{"pay-1", "pay-2"} {
		if n := s.effects(t, key); n != 0 {
			t.Errorf("%s: %d effects committed, want 0", key, n)
		}
	}
	errs, events := rp.snapshot()
	if len(errs) != 1 || !errors.Is(errs[0], idemhttp.ErrWriterBypassed) {
		t.Fatalf("OnError got %v; want ErrWriterBypassed exactly once", errs)
	}
	for _, want := range []string{"MISCONFIGURED", "rolled back", "idemgin.Middleware", "every guarded request 500"} {
		if !strings.Contains(errs[0].Error(), want) {
			t.Errorf("OnError's report %q does not say %q", errs[0], want)
		}
	}
	if len(events) != 7 {
		t.Fatalf("%d events, want 7", len(events))
	}
	if events[0].Outcome != observe.Executed || events[5].Outcome != observe.Replayed {
		t.Errorf("events %+v; want ok-1 executed, then replayed", events)
	}
	events = append(events[1:5], events[6])
	if ev := events[0]; ev.Outcome != observe.Internal || !errors.Is(ev.Err, idemhttp.ErrWriterBypassed) || ev.Key.ID != "pay-1" {
		t.Errorf("first event %+v; want outcome internal, ErrWriterBypassed, key pay-1", ev)
	}
	for _, ev := range events[1:] {
		if ev.Outcome != observe.Internal || ev.Status != 500 || ev.Key.ID == "" || !errors.Is(ev.Err, idemhttp.ErrBypassRefused) || errors.Is(ev.Err, idemhttp.ErrWriterBypassed) {
			t.Errorf("later event %+v; want outcome internal, 500, ErrBypassRefused", ev)
		}
	}
	// Methods the middleware does not guard pass through as before.
	get, err := s.Client().Get(s.URL + "/things")
	if err != nil {
		t.Fatal(err)
	}
	get.Body.Close()
	if get.StatusCode != http.StatusTeapot {
		t.Errorf("GET: %d, want the handler's unguarded 418", get.StatusCode)
	}
}

// testBypassConcurrent: several bypassed requests at once. Whichever
// detect the bypass are rolled back; the report is made once; nothing is
// committed; the rest are refused before the handler runs.
func testBypassConcurrent[Tx any](t *testing.T, e env[Tx]) {
	const n = 8
	var rp reports
	s := startBypass(t, e, rp.options(), nil)
	statuses := make([]int, n)
	testkit.Together(n, func(i int) { statuses[i] = s.post(t, fmt.Sprintf("c-%d", i)).status })
	created := 0
	for i, st := range statuses {
		switch st {
		case http.StatusCreated:
			created++
		case http.StatusInternalServerError:
		default:
			t.Errorf("request %d: %d, want 201 (bypassed) or 500 (refused)", i, st)
		}
		if c := s.effects(t, fmt.Sprintf("c-%d", i)); c != 0 {
			t.Errorf("request %d: %d effects committed, want 0", i, c)
		}
	}
	errs, events := rp.snapshot()
	bypassed, refused := 0, 0
	for _, ev := range events {
		switch {
		case errors.Is(ev.Err, idemhttp.ErrWriterBypassed):
			bypassed++
		case errors.Is(ev.Err, idemhttp.ErrBypassRefused):
			refused++
		default:
			t.Errorf("event %+v; want a bypass or a refusal", ev)
		}
	}
	if runs := int(s.runs.Load()); created < 1 || created != runs || bypassed != runs || bypassed+refused != n {
		t.Errorf("%d answered 201, handler ran %d times, %d bypass and %d refusal events; want as many 201s, runs and bypasses (at least 1), %d events", created, runs, bypassed, refused, n)
	}
	if len(errs) != 1 || !errors.Is(errs[0], idemhttp.ErrWriterBypassed) {
		t.Errorf("OnError got %d reports %v; want exactly one", len(errs), errs)
	}
	// From now on, every request is refused.
	before := s.runs.Load()
	testkit.Together(n, func(i int) {
		if st := s.post(t, fmt.Sprintf("d-%d", i)).status; st != http.StatusInternalServerError {
			t.Errorf("after: %d, want 500", st)
		}
	})
	if d := s.runs.Load() - before; d != 0 {
		t.Errorf("handler ran %d more times after the bypass was known, want 0", d)
	}
}

// testBypassServerErrorLog: without Config.OnError, the one report goes
// to the http.Server's ErrorLog.
func testBypassServerErrorLog[Tx any](t *testing.T, e env[Tx]) {
	var mu sync.Mutex
	var buf bytes.Buffer
	logger := log.New(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), "", 0)
	s := startBypass(t, e, &idemhttp.Options{Scope: idemhttp.SharedScope}, logger)
	for i := range 3 {
		s.post(t, fmt.Sprintf("l-%d", i))
	}
	if n := s.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if c := strings.Count(buf.String(), "MISCONFIGURED"); c != 1 {
		t.Errorf("the server's ErrorLog has the report %d times, want once:\n%s", c, buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// testBypassNoFalsePositive: the middleware used as intended, with outer
// middleware that sets header fields before and after it, several requests
// at once on a few keys, and handlers that write nothing: nothing is taken
// for a bypass and nothing is refused.
func testBypassNoFalsePositive[Tx any](t *testing.T, e env[Tx]) {
	var rp reports
	mw := idemhttp.Middleware(e.newGuard(nil), rp.options())
	var runs atomic.Int64
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, _ := idempotency.TxFrom[Tx](r.Context())
		key, _ := idempotency.KeyFrom(r.Context())
		if err := e.effect(r.Context(), tx, key.Scope+"/"+key.ID); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if strings.HasPrefix(key.ID, "silent") {
			w.Header().Set("X-Set-But-Not-Written", "1")
			return // no answer: ErrNoResponse, not a bypass
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q,"run":%d}`, key.ID, runs.Load())
	})
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "r-1") // set before the middleware runs
		mw(inner).ServeHTTP(w, r)             // built per request, as adapters do
	})
	srv := httptest.NewServer(outer)
	t.Cleanup(srv.Close)
	s := &server[Tx]{Server: srv, env: e}

	const keys, perKey = 4, 4
	res := make([]result, keys*perKey)
	testkit.Together(len(res), func(i int) { res[i] = s.post(t, `{}`, fmt.Sprintf("k-%d", i%keys)) })
	for i, r := range res {
		first := res[i%keys]
		if r.status != http.StatusCreated || !bytes.Equal(r.body, first.body) || r.header.Get("X-Request-Id") != "r-1" {
			t.Errorf("request %d: %d %q %v; want 201 with the bytes of its key's first answer %q", i, r.status, r.body, r.header, first.body)
		}
	}
	for k := range keys {
		s.wantEffects(t, fmt.Sprintf("/k-%d", k), 1)
	}
	for range 2 {
		wantProblem(t, s.post(t, `{}`, "silent-1"), http.StatusInternalServerError, idemhttp.ProblemNoResponse)
	}
	after := s.post(t, `{}`, "k-new")
	wantStatus(t, after, http.StatusCreated)
	s.wantEffects(t, "/k-new", 1)
	if n := runs.Load(); n != keys+3 {
		t.Errorf("handler ran %d times, want %d (one per key, two silent runs, one new key)", n, keys+3)
	}
	errs, events := rp.snapshot()
	for _, err := range errs {
		if !errors.Is(err, idemhttp.ErrNoResponse) {
			t.Errorf("OnError got %v; want only the two ErrNoResponse", err)
		}
	}
	for _, ev := range events {
		if errors.Is(ev.Err, idemhttp.ErrWriterBypassed) || errors.Is(ev.Err, idemhttp.ErrBypassRefused) {
			t.Errorf("event %+v: a bypass where there is none", ev)
		}
	}
}
