package idemhttp_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// quotaClock is the test clock of both instances: half past an hour, so
// an hour's window has 1800 s left and no test meets its end.
var quotaClock = func() func() time.Time {
	at := time.Now().Truncate(time.Hour).Add(30 * time.Minute)
	return func() time.Time { return at }
}()

// quotaEnv is two instances of one service: two Guards on two store
// values, each with a pool of its own, on one database.
type quotaEnv[Tx any] struct {
	guards [2]*idempotency.Guard[Tx]
	// effect writes one row of the handler's effect through tx.
	effect func(ctx context.Context, tx Tx, id string) error
	// rows counts the effect rows and the rows of the keys table.
	rows func(ctx context.Context) (effects, keys int)
}

func sqliteQuotaEnv(t *testing.T) quotaEnv[*sql.Tx] {
	ctx := testkit.Context(t, 20*time.Second)
	path := filepath.Join(t.TempDir(), "quota.db")
	var e quotaEnv[*sql.Tx]
	var db0 *sql.DB
	for i := range 2 {
		db, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := sqlite.New(db, &sqlite.Config{Clock: quotaClock})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		e.guards[i] = guardOn[*sql.Tx](t, s)(nil)
		if i == 0 {
			db0 = db
		}
	}
	if _, err := db0.ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.effect = func(ctx context.Context, tx *sql.Tx, id string) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, id)
		return err
	}
	e.rows = func(ctx context.Context) (effects, keys int) {
		err := db0.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM effects), (SELECT count(*) FROM `+sqlite.DefaultTable+`)`).Scan(&effects, &keys)
		if err != nil {
			t.Fatal(err)
		}
		return effects, keys
	}
	return e
}

func postgresQuotaEnv(t *testing.T) quotaEnv[pgx.Tx] {
	ctx := testkit.Context(t, 20*time.Second)
	dsn := testenv.PostgresDSN(t)
	table := testkit.Name("idemquota_")
	effects := table + "_effects"
	pgkit.DropAtCleanup(t, dsn, "TABLE", table, table+"_quota", effects)
	var e quotaEnv[pgx.Tx]
	var pool0 *pgxpool.Pool
	for i := range 2 {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := postgres.New(pool, &postgres.Config{Table: table, Clock: quotaClock})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		e.guards[i] = guardOn[pgx.Tx](t, s)(nil)
		if i == 0 {
			pool0 = pool
		}
	}
	if _, err := pool0.Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.effect = func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, id)
		return err
	}
	e.rows = func(ctx context.Context) (effects_, keys int) {
		err := pool0.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+effects+`), (SELECT count(*) FROM `+table+`)`).Scan(&effects_, &keys)
		if err != nil {
			t.Fatal(err)
		}
		return effects_, keys
	}
	return e
}

func TestQuotaSQLite(t *testing.T) {
	t.Parallel()
	runQuotaTests(t, sqliteQuotaEnv, false)
}

func TestQuotaPostgres(t *testing.T) {
	t.Parallel()
	runQuotaTests(t, postgresQuotaEnv, true)
}

// runQuotaTests runs the cases over real HTTP. concurrentWriters: the
// store lets two handlers run their transactions at once. SQLite does not
// (one writer: a request's transaction holds the write lock while its
// handler runs, and a quota check, itself a write, waits for it), so its
// in-flight limit is checked by the counter cases of package sqlite.
func runQuotaTests[Tx any](t *testing.T, newEnv func(*testing.T) quotaEnv[Tx], concurrentWriters bool) {
	t.Run("keys_two_instances", func(t *testing.T) { testQuotaKeys(t, newEnv(t)) })
	if concurrentWriters {
		t.Run("in_flight", func(t *testing.T) { testQuotaInFlight(t, newEnv(t)) })
	}
	t.Run("bytes", func(t *testing.T) { testQuotaBytes(t, newEnv(t)) })
}

// quotaAnswer is the body every handler writes: 11 bytes.
const quotaAnswer = `{"ok":true}`

// quotaServers mounts the middleware of each instance with q, on a
// handler that writes one effect row and answers 201; hold, if not nil,
// runs in the handler first. The accounts are the scope.
func quotaServers[Tx any](t *testing.T, e quotaEnv[Tx], q *idempotency.Quota, hold func(), events chan<- idemhttp.RequestEvent) [2]*httptest.Server {
	var servers [2]*httptest.Server
	for i, g := range e.guards {
		cfg := &idemhttp.Options{
			Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
			Quota: q,
			Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
				if events != nil {
					events <- ev
				}
			},
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, _ := idempotency.TxFrom[Tx](r.Context())
			key, _ := idempotency.KeyFrom(r.Context())
			if hold != nil {
				hold()
			}
			if err := e.effect(r.Context(), tx, key.ID); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, quotaAnswer)
		})
		servers[i] = httptest.NewServer(idemhttp.Middleware(g, cfg)(h))
		t.Cleanup(servers[i].Close)
	}
	return servers
}

// quotaPost posts to srv with key in account and returns the status, the
// Retry-After and the body.
func quotaPost(t *testing.T, srv *httptest.Server, account, key string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":5}`))
	if err != nil {
		t.Error(err)
		return 0, "", ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account", account)
	req.Header.Set(idemhttp.DefaultKeyHeader, key)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Error(err)
		return 0, "", ""
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Error(err)
	}
	return res.StatusCode, res.Header.Get("Retry-After"), string(body)
}

// testQuotaKeys: 20 new keys of one account over two instances against
// MaxKeys 7: exactly 7 run and are stored, 13 are refused with 429 and
// nothing written for them; the 7 still replay, on either instance, while
// the quota is used up; another account has its own quota.
func testQuotaKeys[Tx any](t *testing.T, e quotaEnv[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	events := make(chan idemhttp.RequestEvent, 100)
	srv := quotaServers(t, e, &idempotency.Quota{Window: time.Hour, MaxKeys: 7}, nil, events)
	const n = 20
	status := make([]int, n)
	retry := make([]string, n)
	bodies := make([]string, n)
	testkit.Together(n, func(i int) {
		status[i], retry[i], bodies[i] = quotaPost(t, srv[i%2], "acct-a", fmt.Sprintf("key-%02d", i))
	})
	var created []int
	for i := range n {
		switch status[i] {
		case http.StatusCreated:
			created = append(created, i)
			if bodies[i] != quotaAnswer {
				t.Errorf("201 body %q, want %q", bodies[i], quotaAnswer)
			}
		case http.StatusTooManyRequests:
			if retry[i] != "1800" || !strings.Contains(bodies[i], idemhttp.ProblemOverQuota) || !strings.Contains(bodies[i], "7 new keys per 1h0m0s") {
				t.Errorf("429 with Retry-After %q, body %s; want 1800 and the problem", retry[i], bodies[i])
			}
		default:
			t.Errorf("request %d: status %d, body %s", i, status[i], bodies[i])
		}
	}
	if len(created) != 7 {
		t.Fatalf("%d created of 20 over two instances, want exactly 7 (statuses %v)", len(created), status)
	}
	if effects, keys := e.rows(ctx); effects != 7 || keys != 7 {
		t.Fatalf("%d effect rows and %d keys stored, want 7 and 7: nothing written for a refusal", effects, keys)
	}
	over := 0
	for range n {
		ev := <-events
		if ev.Outcome == observe.OverQuota {
			over++
			if ev.QuotaLimit != "keys" || !errors.Is(ev.Err, idempotency.ErrOverQuota) || ev.Status != http.StatusTooManyRequests {
				t.Errorf("refusal event %+v, want limit keys, ErrOverQuota, 429", ev)
			}
		}
	}
	if over != 13 {
		t.Errorf("%d OverQuota events, want 13", over)
	}
	// A retry of a charge made is answered, on either instance, though the
	// quota is used up; it counts nothing and writes nothing.
	for j, i := range created {
		st, _, body := quotaPost(t, srv[j%2], "acct-a", fmt.Sprintf("key-%02d", i))
		if st != http.StatusCreated || body != quotaAnswer {
			t.Errorf("replay of key-%02d: %d %s, want the stored 201", i, st, body)
		}
	}
	if st, _, _ := quotaPost(t, srv[0], "acct-a", "key-new"); st != http.StatusTooManyRequests {
		t.Errorf("a new key after the replays: %d, want 429", st)
	}
	// A refused key stays unused: the same id in another account runs.
	if st, _, _ := quotaPost(t, srv[1], "acct-b", "key-new"); st != http.StatusCreated {
		t.Errorf("another account: %d, want 201", st)
	}
	if effects, keys := e.rows(ctx); effects != 8 || keys != 8 {
		t.Fatalf("%d effect rows and %d keys, want 8 and 8", effects, keys)
	}
}

// testQuotaInFlight: with MaxInFlight 2, a third request while two run is
// refused on either instance; once they end, a new one runs.
func testQuotaInFlight[Tx any](t *testing.T, e quotaEnv[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	gate := testkit.NewGate(t)
	entered := make(chan struct{}, 2)
	events := make(chan idemhttp.RequestEvent, 100)
	srv := quotaServers(t, e, &idempotency.Quota{Window: time.Hour, MaxInFlight: 2}, func() {
		entered <- struct{}{}
		<-gate.Opened()
	}, events)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if st, _, body := quotaPost(t, srv[i], "acct", fmt.Sprintf("slow-%d", i)); st != http.StatusCreated {
				t.Errorf("slow request %d: %d %s", i, st, body)
			}
		})
	}
	for range 2 {
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the two slow requests did not reach their handlers")
		}
	}
	// Two run, one on each instance: a third is refused on both.
	for i := range 2 {
		st, retry, body := quotaPost(t, srv[i], "acct", "third")
		if st != http.StatusTooManyRequests || retry != "1800" || !strings.Contains(body, "2 requests in progress") {
			gate.Open()
			wg.Wait()
			t.Fatalf("third request on instance %d: %d %q %s, want 429 while two run", i, st, retry, body)
		}
	}
	gate.Open()
	wg.Wait()
	if st, _, body := quotaPost(t, srv[1], "acct", "third"); st != http.StatusCreated {
		t.Fatalf("third request after the two ended: %d %s, want 201", st, body)
	}
	if effects, keys := e.rows(ctx); effects != 3 || keys != 3 {
		t.Fatalf("%d effect rows and %d keys, want 3 and 3", effects, keys)
	}
	close(events)
	for ev := range events {
		if ev.Outcome == observe.OverQuota && ev.QuotaLimit != "in_flight" {
			t.Errorf("refusal event limit %v, want in_flight", ev.QuotaLimit)
		}
	}
}

// testQuotaBytes: with MaxBytes 20, two answers of 11 bytes are stored (the
// second crosses the limit), then new keys are refused; a replay is not.
func testQuotaBytes[Tx any](t *testing.T, e quotaEnv[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	srv := quotaServers(t, e, &idempotency.Quota{Window: time.Hour, MaxBytes: 20}, nil, nil)
	for i := range 2 {
		if st, _, body := quotaPost(t, srv[i], "acct", fmt.Sprintf("b%d", i)); st != http.StatusCreated {
			t.Fatalf("answer %d: %d %s, want 201", i, st, body)
		}
	}
	st, retry, body := quotaPost(t, srv[0], "acct", "b2")
	if st != http.StatusTooManyRequests || retry != "1800" || !strings.Contains(body, "20 bytes of stored responses") {
		t.Fatalf("third answer: %d %q %s, want 429 for bytes", st, retry, body)
	}
	if st, _, body := quotaPost(t, srv[1], "acct", "b0"); st != http.StatusCreated || body != quotaAnswer {
		t.Fatalf("replay: %d %s", st, body)
	}
	if effects, keys := e.rows(ctx); effects != 2 || keys != 2 {
		t.Fatalf("%d effect rows and %d keys, want 2 and 2", effects, keys)
	}
}

// hiddenQuota hides a store's QuotaCounter: a store without one.
type hiddenQuota[Tx any] struct{ idempotency.KeyStore[Tx] }

// TestQuotaUncheckable: a quota that cannot be checked (invalid, or a
// store without a QuotaCounter) refuses every guarded request with 500
// before the handler runs, reported to OnError; Validate finds the
// invalid one at start-up.
func TestQuotaUncheckable(t *testing.T) {
	scope := idemhttp.SharedScope
	for _, q := range []idempotency.Quota{{Window: 1500 * time.Millisecond, MaxKeys: 1}, {Window: time.Hour}, {Window: 48 * time.Hour, MaxKeys: 1}, {Window: time.Hour, MaxBytes: -1}} {
		err := (&idemhttp.Options{Scope: scope, Quota: &q}).Validate()
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Validate of %+v: %v, want ErrInvalidConfig", q, err)
		}
	}
	e := sqliteQuotaEnv(t)
	ctx := testkit.Context(t, 20*time.Second)
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "plain.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	plain, err := idempotency.New[*sql.Tx](hiddenQuota[*sql.Tx]{s}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		g *idempotency.Guard[*sql.Tx]
		q idempotency.Quota
	}{
		"invalid":     {e.guards[0], idempotency.Quota{Window: time.Hour}},
		"unsupported": {plain, idempotency.Quota{Window: time.Hour, MaxKeys: 5}},
	} {
		var reported []error
		ran := 0
		h := idemhttp.Middleware(c.g, &idemhttp.Options{Scope: scope, Quota: &c.q, OnError: func(_ *http.Request, err error) { reported = append(reported, err) }})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++; w.WriteHeader(http.StatusCreated) }))
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/x", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.DefaultKeyHeader, "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), idemhttp.ProblemInternal) || ran != 0 {
			t.Errorf("%s: %d %s, handler ran %d times; want 500 ProblemInternal, not run", name, rec.Code, rec.Body, ran)
		}
		want := idempotency.ErrInvalidConfig
		if name == "unsupported" {
			want = errors.ErrUnsupported
		}
		if len(reported) != 1 || !errors.Is(reported[0], want) {
			t.Errorf("%s: OnError got %v, want one error wrapping %v", name, reported, want)
		}
	}
	if effects, keys := e.rows(ctx); effects != 0 || keys != 0 {
		t.Fatalf("%d effects, %d keys: want nothing written", effects, keys)
	}
}
