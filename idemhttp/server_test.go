package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// env is one isolated store behind a guard, plus a way to perform and count
// an effect inside the store's transaction.
type env[Tx any] struct {
	newGuard func(cfg *idempotency.Config) *idempotency.Guard[Tx]
	// effect inserts one row labelled tag through tx.
	effect func(ctx context.Context, tx Tx, tag string) error
	// count counts committed rows labelled tag, outside any transaction.
	count func(ctx context.Context, tag string) int
	// breakStore makes every later store call fail (closes the pool).
	breakStore func()
}

// storeRig builds a fresh env per test; it registers cleanups with t.
type storeRig[Tx any] func(t *testing.T) env[Tx]

// server is a guarded httptest server whose handler, per request, runs
// step(n) (n counts handler runs from 1) after doing one effect labelled
// with the request's key id.
type server[Tx any] struct {
	*httptest.Server
	env   env[Tx]
	calls atomic.Int64
}

// step decides what the handler does on its n-th run, after its effect.
type step func(n int64, w http.ResponseWriter, r *http.Request)

func created(n int64, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/things/%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"echo":%q,"at":%q}`, n, body, time.Now().Format(time.RFC3339Nano))
}

// startServer mounts the middleware with opts. The suite's clients are one
// tenant: options that set no Scope get [idemhttp.SharedScope], on
// purpose (the middleware itself refuses a missing Scope; see mount).
func startServer[Tx any](t *testing.T, e env[Tx], cfg *idempotency.Config, opts *idemhttp.Options, s step) *server[Tx] {
	t.Helper()
	o := idemhttp.Options{}
	if opts != nil {
		o = *opts
	}
	if o.Scope == nil {
		o.Scope = idemhttp.SharedScope
	}
	return mount(t, e, cfg, &o, s)
}

// mount mounts the middleware with opts as they are (nil included).
func mount[Tx any](t *testing.T, e env[Tx], cfg *idempotency.Config, opts *idemhttp.Options, s step) *server[Tx] {
	t.Helper()
	srv := &server[Tx]{env: e}
	g := e.newGuard(cfg)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := srv.calls.Add(1)
		tx, ok := idempotency.TxFrom[Tx](r.Context())
		key, kok := idempotency.KeyFrom(r.Context())
		if !ok || !kok {
			w.WriteHeader(http.StatusTeapot) // unguarded: no effect
			return
		}
		if err := e.effect(r.Context(), tx, key.Scope+"/"+key.ID); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s(n, w, r)
	})
	srv.Server = httptest.NewUnstartedServer(idemhttp.Middleware(g, opts)(h))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // panics are expected in some tests
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// send posts body with the given Idempotency-Key values (none if empty).
func (s *server[Tx]) send(t *testing.T, method, path, ctype, body string, keys ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for _, k := range keys {
		req.Header.Add(idemhttp.DefaultKeyHeader, k)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{resp.StatusCode, resp.Header, b}
}

func (s *server[Tx]) post(t *testing.T, body string, keys ...string) result {
	t.Helper()
	return s.send(t, http.MethodPost, "/things", "application/json", body, keys...)
}

func (s *server[Tx]) effects(t *testing.T, tag string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.env.count(ctx, tag)
}

func (s *server[Tx]) wantCalls(t *testing.T, want int64) {
	t.Helper()
	if got := s.calls.Load(); got != want {
		t.Errorf("handler ran %d times, want %d", got, want)
	}
}

func (s *server[Tx]) wantEffects(t *testing.T, tag string, want int) {
	t.Helper()
	if got := s.effects(t, tag); got != want {
		t.Errorf("%d effects committed for %q, want %d", got, tag, want)
	}
}

// wantProblem checks an RFC 9457 answer of the given status and type.
func wantProblem(t *testing.T, res result, status int, typ string) idemhttp.Problem {
	t.Helper()
	var p idemhttp.Problem
	if ct := res.header.Get("Content-Type"); ct != idemhttp.ProblemContentType {
		t.Errorf("Content-Type %q, want %q (status %d, body %s)", ct, idemhttp.ProblemContentType, res.status, res.body)
	}
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem body %q: %v", res.body, err)
	}
	if res.status != status || p.Status != status || p.Type != typ || p.Title == "" || p.Detail == "" && status != 500 {
		t.Errorf("got %d %+v; want status %d type %s with title and detail", res.status, p, status, typ)
	}
	return p
}

func wantStatus(t *testing.T, res result, status int) {
	t.Helper()
	if res.status != status {
		t.Fatalf("status %d (body %s), want %d", res.status, res.body, status)
	}
}

func wantReplay(t *testing.T, first, replay result) {
	t.Helper()
	if replay.status != first.status || !bytes.Equal(replay.body, first.body) {
		t.Errorf("replay %d %q, first %d %q: want the same status and bytes", replay.status, replay.body, first.status, first.body)
	}
	if got := replay.header.Get(idemhttp.HeaderReplayed); got != "true" {
		t.Errorf("replay %s = %q, want true", idemhttp.HeaderReplayed, got)
	}
	if got := first.header.Values(idemhttp.HeaderReplayed); got != nil {
		t.Errorf("first response has %s %q", idemhttp.HeaderReplayed, got)
	}
}
