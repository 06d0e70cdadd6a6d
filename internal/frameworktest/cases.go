package frameworktest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// Result is one answer read off the wire.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
	// Err is the transport error, if the server dropped the connection.
	Err error
}

// Post sends one POST with a JSON body and the given key.
func Post(t *testing.T, url, key, body string) Result {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Result{Err: err}
	}
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func runCases[Tx any](t *testing.T, e *Env[Tx], start func(*testing.T, *idemhttp.Options) string) {
	base := start(t, &idemhttp.Options{Scope: idemhttp.SharedScope}) // the suite's clients are one tenant
	count := func(id string) int { return e.Count(t, "", id) }

	// NoScope: mounted without Config.Scope, the integration shares no
	// answer between clients: every guarded request is refused with 500
	// before the chain runs, nothing is stored.
	t.Run("NoScope", func(t *testing.T) {
		for name, opts := range map[string]*idemhttp.Options{"nil": nil, "empty": {}} {
			url := start(t, opts)
			runs := e.Runs()
			for i := range 2 { // client A, then client B with A's key and body
				res := Post(t, url+RouteWrite, "noscope-"+name, `{"amount":100}`)
				if res.Err != nil || res.Status != http.StatusInternalServerError || !strings.Contains(string(res.Body), "idemhttp#ProblemInternal") ||
					res.Header.Get(idemhttp.HeaderReplayed) != "" {
					t.Errorf("%s, request %d: %d %v %q (%v); want 500 %s, never an answer", name, i, res.Status, res.Header, res.Body, res.Err, "idemhttp#ProblemInternal")
				}
			}
			if d := e.Runs() - runs; d != 0 {
				t.Errorf("%s: the chain ran %d times, want 0", name, d)
			}
			if n := count("noscope-" + name); n != 0 {
				t.Errorf("%s: %d effects, want 0", name, n)
			}
		}
	})

	// Contract: the shared Config's route TTL, lifetime header, browser
	// exposure and problem links reach the client through the
	// integration.
	t.Run("Contract", func(t *testing.T) {
		const docs = "https://docs.example.com/idempotency"
		url := start(t, &idemhttp.Options{Scope: idemhttp.SharedScope, TTL: 3 * time.Hour, ExposeHeaders: true,
			ProblemDocs: docs, InProgressStatus: http.StatusTooEarly})
		before := time.Now()
		first := Post(t, url+RouteWrite, "contract-1", `{"amount":100}`)
		if first.Err != nil || first.Status != http.StatusCreated {
			t.Fatalf("first: %d %q (%v); want 201", first.Status, first.Body, first.Err)
		}
		e1, err := http.ParseTime(first.Header.Get(idemhttp.HeaderKeyExpires))
		if err != nil || e1.Before(before.Add(3*time.Hour-time.Second)) || e1.After(time.Now().Add(3*time.Hour)) {
			t.Fatalf("first: %s %q (%v); want 3h from now (the route's TTL)", idemhttp.HeaderKeyExpires, first.Header.Get(idemhttp.HeaderKeyExpires), err)
		}
		replay := Post(t, url+RouteWrite, "contract-1", `{"amount":100}`)
		e2, err := http.ParseTime(replay.Header.Get(idemhttp.HeaderKeyExpires))
		if replay.Status != http.StatusCreated || !bytes.Equal(replay.Body, first.Body) || err != nil || e2.Before(e1) || e2.Sub(e1) > 2*time.Second {
			t.Fatalf("replay: %d %v %q (%v); want the first bytes and its expiry (%v)", replay.Status, replay.Header, replay.Body, err, e1)
		}
		for _, r := range []Result{first, replay} {
			exposed := strings.Join(r.Header.Values("Access-Control-Expose-Headers"), ",")
			if !strings.Contains(exposed, idemhttp.HeaderKeyExpires) || !strings.Contains(exposed, idemhttp.HeaderReplayed) {
				t.Errorf("Access-Control-Expose-Headers %q; want %s and %s", exposed, idemhttp.HeaderKeyExpires, idemhttp.HeaderReplayed)
			}
		}
		missing := Post(t, url+RouteWrite, "", `{"amount":100}`)
		if missing.Status != http.StatusBadRequest || missing.Header.Get("Link") != "<"+docs+`>; rel="describedby"` {
			t.Errorf("no key: %d, Link %q; want 400 with the documentation link", missing.Status, missing.Header.Get("Link"))
		}
		if n := count("contract-1"); n != 1 {
			t.Errorf("%d effects, want 1", n)
		}
	})

	t.Run("Write", func(t *testing.T) {
		runs := e.Runs()
		first := Post(t, base+RouteWrite, "w-1", `{"amount":100}`)
		if first.Err != nil || first.Status != http.StatusCreated || first.Header.Get("Location") == "" ||
			first.Header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("first: %d %v %q (%v); want 201 with Location", first.Status, first.Header, first.Body, first.Err)
		}
		var got map[string]any
		if err := json.Unmarshal(first.Body, &got); err != nil || got["run"] == nil {
			t.Fatalf("first body %q: %v", first.Body, err)
		}
		for i := range 3 {
			// Other key order and spacing: the same JSON request.
			replay := Post(t, base+RouteWrite, "w-1", `{ "amount": 1e2 }`)
			if replay.Err != nil || replay.Status != first.Status || !bytes.Equal(replay.Body, first.Body) ||
				replay.Header.Get(idemhttp.HeaderReplayed) != "true" ||
				replay.Header.Get("Location") != first.Header.Get("Location") ||
				replay.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
				t.Fatalf("replay %d: %d %v %q (%v); want the first answer's bytes %q", i, replay.Status, replay.Header, replay.Body, replay.Err, first.Body)
			}
		}
		if n := count("w-1"); n != 1 {
			t.Errorf("%d effects, want 1", n)
		}
		if d := e.Runs() - runs; d != 1 {
			t.Errorf("handler ran %d times, want 1", d)
		}
		mismatch := Post(t, base+RouteWrite, "w-1", `{"amount":101}`)
		if mismatch.Status != http.StatusUnprocessableEntity || !strings.Contains(string(mismatch.Body), idemhttp.ProblemMismatch) {
			t.Errorf("same key, other body: %d %q; want 422 %s", mismatch.Status, mismatch.Body, idemhttp.ProblemMismatch)
		}
		missing := Post(t, base+RouteWrite, "", `{"amount":100}`)
		if missing.Status != http.StatusBadRequest || !strings.Contains(string(missing.Body), "idemhttp#ProblemMissingKey") {
			t.Errorf("no key: %d %q; want 400 %s", missing.Status, missing.Body, "idemhttp#ProblemMissingKey")
		}
	})

	// notStored checks that a route answered want (or, for want == 0, a
	// dropped connection or a 500), and left no effect and no stored key.
	// The same key runs the handler again.
	notStored := func(t *testing.T, route string, want int, body string, check func(Result)) {
		t.Helper()
		key := strings.TrimPrefix(route, "/") + "-1"
		for attempt := 1; attempt <= 2; attempt++ {
			runs := e.Runs()
			res := Post(t, base+route, key, body)
			switch {
			case want == 0 && res.Err == nil && res.Status != http.StatusInternalServerError:
				t.Errorf("attempt %d: %d %q; want a 500 or a dropped connection", attempt, res.Status, res.Body)
			case want != 0 && (res.Err != nil || res.Status != want):
				t.Errorf("attempt %d: %d %q (%v); want %d", attempt, res.Status, res.Body, res.Err, want)
			}
			if res.Header.Get(idemhttp.HeaderReplayed) != "" {
				t.Errorf("attempt %d was replayed: the answer was stored", attempt)
			}
			if check != nil && res.Err == nil {
				check(res)
			}
			if d := e.Runs() - runs; d != 1 {
				t.Errorf("attempt %d: handler ran %d times, want 1 (a stored key would replay)", attempt, d)
			}
			if n := count(key); n != 0 {
				t.Errorf("attempt %d: %d effects committed, want 0 (rolled back)", attempt, n)
			}
		}
	}
	t.Run("Error", func(t *testing.T) { notStored(t, RouteError, http.StatusBadGateway, `{}`, nil) })
	t.Run("Panic", func(t *testing.T) { notStored(t, RoutePanic, 0, `{}`, nil) })
	t.Run("Nothing", func(t *testing.T) {
		notStored(t, RouteNothing, http.StatusInternalServerError, `{}`, func(r Result) {
			if !strings.Contains(string(r.Body), "idemhttp#ProblemNoResponse") {
				t.Errorf("body %q; want the %s problem", r.Body, "idemhttp#ProblemNoResponse")
			}
		})
	})
	t.Run("Bind", func(t *testing.T) { notStored(t, RouteBind, http.StatusBadRequest, `{"amount":"x"}`, nil) })

	// Quota: Config.Quota reaches the framework's integration: the third
	// new key of a scope is refused with 429 and Retry-After before the
	// chain runs; the first key still replays.
	t.Run("Quota", func(t *testing.T) {
		var b [6]byte
		_, _ = rand.Read(b[:])
		scope := "quota-" + hex.EncodeToString(b[:])
		url := start(t, &idemhttp.Options{
			Scope: func(*http.Request) (string, error) { return scope, nil },
			Quota: &idempotency.Quota{Window: time.Hour, MaxKeys: 2},
		})
		runs := e.Runs()
		var first Result
		for i, key := range []string{"q-1", "q-2", "q-3", "q-1"} {
			res := Post(t, url+RouteWrite, key, `{"amount":100}`)
			switch {
			case res.Err != nil:
				t.Fatalf("%s: %v", key, res.Err)
			case i == 0:
				first = res
				fallthrough
			case i == 1:
				if res.Status != http.StatusCreated {
					t.Errorf("%s: %d %q; want 201", key, res.Status, res.Body)
				}
			case i == 2:
				if res.Status != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" ||
					!strings.Contains(string(res.Body), "idemhttp#ProblemOverQuota") {
					t.Errorf("%s: %d %v %q; want 429 %s with Retry-After", key, res.Status, res.Header, res.Body, "idemhttp#ProblemOverQuota")
				}
			default:
				if res.Status != http.StatusCreated || !bytes.Equal(res.Body, first.Body) || res.Header.Get(idemhttp.HeaderReplayed) != "true" {
					t.Errorf("replay of q-1: %d %q; want the first answer %q replayed", res.Status, res.Body, first.Body)
				}
			}
		}
		if d := e.Runs() - runs; d != 2 {
			t.Errorf("the chain ran %d times, want 2", d)
		}
		for id, want := range map[string]int{"q-1": 1, "q-2": 1, "q-3": 0} {
			if n := e.Count(t, scope, id); n != want {
				t.Errorf("%s: %d effects, want %d", id, n, want)
			}
		}
	})
}
