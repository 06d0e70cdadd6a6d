package idemhttp_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/observe"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// TestSchemaMissing: a keys table that does not exist (never migrated)
// answers 500 ProblemInternal without Retry-After, never 503 "retry
// later", and the handler does not run; OnError and the event get the
// ErrSchema that names the table. With a Quota and no quota table, the
// same. On SQLite and PostgreSQL.
func TestSchemaMissing(t *testing.T) {
	t.Run("SQLite", func(t *testing.T) {
		ctx := testkit.Context(t, 20*time.Second)
		db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "schema.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		s, err := sqlite.New(db, &sqlite.Config{Table: "never_migrated"})
		if err != nil {
			t.Fatal(err)
		}
		schemaAnswers500[*sql.Tx](t, s, nil, "never_migrated", nil)
		q, err := sqlite.New(db, &sqlite.Config{Table: "no_quota"})
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `DROP TABLE "no_quota_quota"`); err != nil {
			t.Fatal(err)
		}
		schemaAnswers500[*sql.Tx](t, q, &idempotency.Quota{Window: time.Minute, MaxKeys: 10}, "no_quota_quota", nil)
	})
	t.Run("Operation", func(t *testing.T) {
		// Operation runs Guard.Run, whose Acquire meets the missing table.
		ctx := testkit.Context(t, 20*time.Second)
		db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "schema.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		s, err := sqlite.New(db, &sqlite.Config{Table: "never_migrated"})
		if err != nil {
			t.Fatal(err)
		}
		schemaAnswers500[*sql.Tx](t, s, nil, "never_migrated", func(g *idempotency.Guard[*sql.Tx], cfg *idemhttp.Options) http.Handler {
			op := &idempotency.Operation[*sql.Tx]{Name: "op", Finish: func(context.Context, *sql.Tx, *idempotency.State) (idempotency.Response, error) {
				return idempotency.Response{Status: 201}, nil
			}}
			h, err := idemhttp.Operation(g, op, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return h
		})
	})
	t.Run("Postgres", func(t *testing.T) {
		table := testkit.Name("idem_never_")
		pool, err := pgxpool.New(testkit.Context(t, 20*time.Second), testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pgkit.DropAtCleanup(t, testenv.PostgresDSN(t), "TABLE", table)
		s, err := postgres.New(pool, &postgres.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		schemaAnswers500[pgx.Tx](t, s, nil, table, nil)
	})
}

// schemaAnswers500 posts to a handler guarded on s, whose table (or quota
// table, with q) named table is missing, and checks the answer. The
// handler is Middleware's, or what handler builds (the guard's handler
// then counts no calls).
func schemaAnswers500[Tx any](t *testing.T, s idempotency.KeyStore[Tx], q *idempotency.Quota, table string,
	handler func(*idempotency.Guard[Tx], *idemhttp.Options) http.Handler) {
	t.Helper()
	g, err := idempotency.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		causes []error
		events []idemhttp.RequestEvent
		calls  int
	)
	cfg := &idemhttp.Options{
		Scope: idemhttp.SharedScope,
		Quota: q,
		OnError: func(_ *http.Request, err error) {
			mu.Lock()
			defer mu.Unlock()
			causes = append(causes, err)
		},
		Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
		},
	}
	h := idemhttp.Middleware(g, cfg)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	if handler != nil {
		h = handler(g, cfg)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(testkit.Context(t, 20*time.Second), http.MethodPost, srv.URL, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+testkit.Name("k")+`"`)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if res.StatusCode != http.StatusInternalServerError || p.Type != idemhttp.ProblemInternal || res.Header.Get("Retry-After") != "" {
		t.Fatalf("got %d %+v, Retry-After %q; want 500 %s without Retry-After", res.StatusCode, p, res.Header.Get("Retry-After"), idemhttp.ProblemInternal)
	}
	if strings.Contains(string(body), table) {
		t.Errorf("the problem names the table %s to the client: %s", table, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 0 {
		t.Errorf("the handler ran %d times; want 0", calls)
	}
	if len(causes) != 1 || !errors.Is(causes[0], idempotency.ErrSchema) || errors.Is(causes[0], idempotency.ErrStore) ||
		!strings.Contains(causes[0].Error(), table) {
		t.Errorf("OnError got %v; want one ErrSchema naming %s, not ErrStore", causes, table)
	}
	if len(events) != 1 || events[0].Outcome != observe.Internal || events[0].Status != http.StatusInternalServerError {
		t.Errorf("events %+v; want one Internal with status 500", events)
	}
}
