// Package frameworktest is the test suite every framework integration of
// idemhttp runs (net/http, ServeMux, chi, gin, echo, fiber). It runs over
// real HTTP, against a real store: SQLite, and PostgreSQL from
// IDEMPOTENCY_POSTGRES_DSN. It checks that a handler that writes is stored
// and replayed byte-exact with one effect in the database. It checks that a
// handler that returns a framework error, panics, writes nothing or fails
// request validation leaves no effect and no stored key.
package frameworktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// Routes the framework under test serves, all POST, each behind the
// framework's integration of the middleware, each written in the
// framework's own idiom.
const (
	// RouteWrite: call Handlers.Effect, then answer 201 with
	// Handlers.Body(n) as application/json and Location: /things/<n>.
	RouteWrite = "/write"
	// RouteError: call Handlers.Effect, then fail the framework's way
	// (gin: c.AbortWithStatusJSON or c.Error; echo: return
	// echo.NewHTTPError(502); fiber: return fiber.NewError(502)) with a
	// 502 Bad Gateway.
	RouteError = "/error"
	// RoutePanic: call Handlers.Effect, then panic. The framework's own
	// recovery middleware (outside the integration) answers.
	RoutePanic = "/panic"
	// RouteNothing: call Handlers.Effect, then return without writing
	// anything.
	RouteNothing = "/nothing"
	// RouteBind: bind the JSON body {"amount": <int>} with the framework's
	// binder (which refuses {"amount":"x"}) and answer its 400, after
	// calling Handlers.Effect.
	RouteBind = "/bind"
)

// Handlers is what the framework's handlers use.
type Handlers struct {
	// Effect inserts one row for the request's key through the
	// transaction that ctx carries (the request's context, where the
	// integration put it). It fails when ctx carries none.
	Effect func(ctx context.Context) error
	// Run counts a handler run and returns its number, from 1.
	Run func() int64
}

// Body is the 201 body of RouteWrite on run n: unique per run, so a
// second run cannot pass for a replay.
func Body(n int64) map[string]any {
	return map[string]any{"run": n, "at": time.Now().Format(time.RFC3339Nano)}
}

// Mount starts the framework's server on one store and returns its base
// URL; it stops it with t.Cleanup. Each method is the same generic code of
// the framework's test, instantiated with the store's transaction type.
type Mount interface {
	SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], opts *idemhttp.Config, h Handlers) string
	Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], opts *idemhttp.Config, h Handlers) string
}

// Run runs the suite on SQLite and PostgreSQL.
func Run(t *testing.T, m Mount) {
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		e := SQLite(t)
		runCases(t, e, func(t *testing.T, opts *idemhttp.Config) string {
			return m.SQLite(t, e.Guard(t, nil), opts, e.Handlers)
		})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		e := Postgres(t)
		runCases(t, e, func(t *testing.T, opts *idemhttp.Config) string {
			return m.Postgres(t, e.Guard(t, nil), opts, e.Handlers)
		})
	})
}

// Env is one store with an effects table.
type Env[Tx any] struct {
	Store    idempotency.KeyStore[Tx]
	Handlers Handlers
	// Count counts the committed effects of a key (scope/id).
	Count func(t *testing.T, scope, id string) int
	runs  *atomic.Int64
}

// Guard builds a guard on the env's store.
func (e *Env[Tx]) Guard(t *testing.T, cfg *idempotency.Config) *idempotency.Guard[Tx] {
	t.Helper()
	g, err := idempotency.New(e.Store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Runs returns how many times handlers ran.
func (e *Env[Tx]) Runs() int64 { return e.runs.Load() }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func tag(ctx context.Context) (string, error) {
	k, ok := idemhttp.KeyFrom(ctx)
	if !ok {
		return "", fmt.Errorf("frameworktest: no idempotency key in the handler's context")
	}
	return k.Scope + "/" + k.ID, nil
}

// SQLite returns a fresh SQLite database file with an effects table.
func SQLite(t *testing.T) *Env[*sql.Tx] {
	c := ctx(t)
	db, err := sqlite.Open(c, filepath.Join(t.TempDir(), "frameworks.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(c); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(c, `CREATE TABLE effects (tag TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	return &Env[*sql.Tx]{
		Store: s,
		runs:  runs,
		Handlers: Handlers{
			Run: func() int64 { return runs.Add(1) },
			Effect: func(ctx context.Context) error {
				tx, ok := idemhttp.TxFrom[*sql.Tx](ctx)
				if !ok {
					return fmt.Errorf("frameworktest: no transaction in the handler's context")
				}
				tg, err := tag(ctx)
				if err != nil {
					return err
				}
				_, err = tx.ExecContext(ctx, `INSERT INTO effects (tag) VALUES (?)`, tg)
				return err
			},
		},
		Count: func(t *testing.T, scope, id string) int {
			var n int
			if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM effects WHERE tag = ?`, scope+"/"+id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

// Postgres returns fresh tables (keys, effects) with random names in the
// database of IDEMPOTENCY_POSTGRES_DSN, dropped at cleanup.
func Postgres(t *testing.T) *Env[pgx.Tx] {
	c := ctx(t)
	dsn := testenv.PostgresDSN(t)
	pool, err := pgxpool.New(c, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "frameworks_" + hex.EncodeToString(b[:])
	effects := table + "_effects"
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(c, `DROP TABLE IF EXISTS `+table+`, `+table+`_quota, `+effects); err != nil {
			t.Error(err)
		}
	})
	s, err := postgres.New(pool, &postgres.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(c); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(c, `CREATE TABLE `+effects+` (tag TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	return &Env[pgx.Tx]{
		Store: s,
		runs:  runs,
		Handlers: Handlers{
			Run: func() int64 { return runs.Add(1) },
			Effect: func(ctx context.Context) error {
				tx, ok := idemhttp.TxFrom[pgx.Tx](ctx)
				if !ok {
					return fmt.Errorf("frameworktest: no transaction in the handler's context")
				}
				tg, err := tag(ctx)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO `+effects+` (tag) VALUES ($1)`, tg)
				return err
			},
		},
		Count: func(t *testing.T, scope, id string) int {
			var n int
			if err := pool.QueryRow(ctx(t), `SELECT count(*) FROM `+effects+` WHERE tag = $1`, scope+"/"+id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

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
		req.Header.Set(idemhttp.HeaderKey, key)
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

func runCases[Tx any](t *testing.T, e *Env[Tx], start func(*testing.T, *idemhttp.Config) string) {
	base := start(t, &idemhttp.Config{Scope: idemhttp.SharedScope}) // the suite's clients are one tenant
	count := func(id string) int { return e.Count(t, "", id) }

	// NoScope: mounted without Config.Scope, the integration shares no
	// answer between clients: every guarded request is refused with 500
	// before the chain runs, nothing is stored.
	t.Run("NoScope", func(t *testing.T) {
		for name, opts := range map[string]*idemhttp.Config{"nil": nil, "empty": {}} {
			url := start(t, opts)
			runs := e.Runs()
			for i := range 2 { // client A, then client B with A's key and body
				res := Post(t, url+RouteWrite, "noscope-"+name, `{"amount":100}`)
				if res.Err != nil || res.Status != http.StatusInternalServerError || !strings.Contains(string(res.Body), idemhttp.ProblemInternal) ||
					res.Header.Get(idemhttp.HeaderReplayed) != "" {
					t.Errorf("%s, request %d: %d %v %q (%v); want 500 %s, never an answer", name, i, res.Status, res.Header, res.Body, res.Err, idemhttp.ProblemInternal)
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
		url := start(t, &idemhttp.Config{Scope: idemhttp.SharedScope, TTL: 3 * time.Hour, ExposeHeaders: true,
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
		if mismatch.Status != http.StatusUnprocessableEntity || !strings.Contains(string(mismatch.Body), idemhttp.ProblemKeyReused) {
			t.Errorf("same key, other body: %d %q; want 422 %s", mismatch.Status, mismatch.Body, idemhttp.ProblemKeyReused)
		}
		missing := Post(t, base+RouteWrite, "", `{"amount":100}`)
		if missing.Status != http.StatusBadRequest || !strings.Contains(string(missing.Body), idemhttp.ProblemMissingKey) {
			t.Errorf("no key: %d %q; want 400 %s", missing.Status, missing.Body, idemhttp.ProblemMissingKey)
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
			if !strings.Contains(string(r.Body), idemhttp.ProblemNoResponse) {
				t.Errorf("body %q; want the %s problem", r.Body, idemhttp.ProblemNoResponse)
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
		url := start(t, &idemhttp.Config{
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
					!strings.Contains(string(res.Body), idemhttp.ProblemOverQuota) {
					t.Errorf("%s: %d %v %q; want 429 %s with Retry-After", key, res.Status, res.Header, res.Body, idemhttp.ProblemOverQuota)
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
