package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// The rig of the pool starvation tests: a service on PostgreSQL with a pool of 4
// connections, a guarded route whose handler can be held on a key (the
// slow key), and an unguarded route that queries the same pool.

// poolSize is the pool of the rig: pgxpool's default on a small machine.
const poolSize = 4

// holds lets a test keep a key's handler running until it releases it.
type holds struct {
	mu sync.Mutex
	m  map[string]*hold
}

type hold struct {
	entered, release chan struct{}
	enterOnce, once  sync.Once
}

// add makes the handler of tag (scope/id) wait for the release.
func (hs *holds) add(tag string) *hold {
	h := &hold{entered: make(chan struct{}), release: make(chan struct{})}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.m == nil {
		hs.m = map[string]*hold{}
	}
	hs.m[tag] = h
	return h
}

// free releases the handler (idempotent).
func (h *hold) free() { h.once.Do(func() { close(h.release) }) }

// await waits until the handler entered, within a generous bound.
func (h *hold) await(tb testing.TB) {
	tb.Helper()
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		tb.Fatal("the slow key's handler never started")
	}
}

// wait blocks the handler of tag, if it is held, until it is released.
func (hs *holds) wait(ctx context.Context, tag string) {
	hs.mu.Lock()
	h := hs.m[tag]
	hs.mu.Unlock()
	if h == nil {
		return
	}
	h.enterOnce.Do(func() { close(h.entered) })
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

// poolDB is a pair of fresh tables (keys, effects) in the test database.
type poolDB struct {
	dsn, table, effects string
}

func newPoolDB(tb testing.TB) *poolDB {
	tb.Helper()
	dsn := testenv.PostgresDSN(tb)
	d := &poolDB{dsn: dsn, table: testkit.Name("idempool_")}
	d.effects = d.table + "_effects"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	pgkit.DropAtCleanup(tb, dsn, "TABLE", d.table, d.effects)
	if _, err := conn.Exec(ctx, `CREATE TABLE `+d.effects+` (tag TEXT NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	return d
}

// poolService is one process of the service: its own pool, store, guard
// and HTTP server.
type poolService struct {
	url      string
	pool     *pgxpool.Pool
	guard    *idempotency.Guard[pgx.Tx]
	inflight atomic.Int64 // guarded requests being served
}

// newPoolService starts a service on d with a pool of size connections.
// POST /pay is guarded (scope: the X-Tenant header): its handler inserts
// one effect through the transaction, waits while its key is held in hs,
// and answers 201 with a body unique to the run. GET /unguarded counts the
// effects on the same pool, outside the middleware.
func newPoolService(tb testing.TB, d *poolDB, size int32, cfg *idempotency.Config, hs *holds) *poolService {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		tb.Fatal(err)
	}
	pcfg.MaxConns = size
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	store, err := postgres.New(pool, &postgres.Config{Table: d.table})
	if err != nil {
		tb.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	g, err := idempotency.New(store, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	s := &poolService{pool: pool, guard: g}
	var runs atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[pgx.Tx](r.Context())
		key, _ := idempotency.KeyFrom(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		tag := key.Scope + "/" + key.ID
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+d.effects+` (tag) VALUES ($1)`, tag); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		hs.wait(r.Context(), tag)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"tag":%q,"run":%d}`, tag, runs.Add(1))
	})
	mw := idemhttp.Middleware(g, &idemhttp.Options{Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }})
	mux := http.NewServeMux()
	guarded := mw(pay)
	mux.Handle("POST /pay", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inflight.Add(1)
		defer s.inflight.Add(-1)
		guarded.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /unguarded", func(w http.ResponseWriter, r *http.Request) {
		var n int
		if err := pool.QueryRow(r.Context(), `SELECT count(*) FROM `+d.effects).Scan(&n); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "%d", n)
	})
	srv := httptest.NewServer(mux)
	tb.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// count counts the committed effects of tag.
func (d *poolDB) count(tb testing.TB, pool *pgxpool.Pool, tag string) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+d.effects+` WHERE tag = $1`, tag).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// newClient returns a client that keeps enough connections for 50
// waiters and the probes, closed at cleanup.
func newClient(tb testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// reply is one answer read off the wire, or the error that stopped it.
type reply struct {
	status int
	header http.Header
	body   string
	err    error
	took   time.Duration
}

// call sends one request bounded by limit; tenant and key are left out
// when empty.
func call(hc *http.Client, method, url, tenant, key string, limit time.Duration) reply {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"amount":100}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return reply{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	if key != "" {
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return reply{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err, took: time.Since(start)}
}

// launch sends n requests of one key at once and returns their answers
// once all have come back.
func launch(hc *http.Client, n int, url, tenant, key string, limit time.Duration) <-chan []reply {
	out := make(chan []reply, 1)
	go func() {
		replies := make([]reply, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { replies[i] = call(hc, http.MethodPost, url, tenant, key, limit) })
		}
		wg.Wait()
		out <- replies
	}()
	return out
}

// maxAcquired samples pool's acquired connections every millisecond for
// the window and returns the highest count seen.
func maxAcquired(pool *pgxpool.Pool, window time.Duration) int32 {
	var most int32
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(time.Millisecond) {
		most = max(most, pool.Stat().AcquiredConns())
	}
	return most
}
