package sealed_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/sealed"
	"github.com/go-idempotency/idempotency/sqlite"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres, testenv.MySQL) }

// backend is a key store with an orders table, and SQL to read its rows.
type backend[Tx any] struct {
	store idempotency.KeyStore[Tx]
	// row reads the stored status, header and body of key id as raw bytes.
	row func(ctx context.Context, id string) (status int, header, body []byte, err error)
	// progress reads the stored progress of key id as raw bytes.
	progress func(ctx context.Context, id string) ([]byte, error)
	// insert writes an order through tx; setStatus and order read and
	// change it outside any request.
	insert    func(ctx context.Context, tx Tx, id, status string) error
	setStatus func(ctx context.Context, id, status string) error
	order     func(ctx context.Context, id string) (status string, err error)
	orders    func(ctx context.Context) (int, error)
}

// openSQLite returns a migrated SQLite store on a new file, and its
// database.
func openSQLite(t *testing.T, ctx context.Context) (*sql.DB, *sqlite.Store) {
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "sealed.db"))
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
	return db, s
}

func sqliteBackend(t *testing.T, ctx context.Context) backend[*sql.Tx] {
	db, s := openSQLite(t, ctx)
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return backend[*sql.Tx]{
		store: s,
		row: func(ctx context.Context, id string) (status int, header, body []byte, err error) {
			err = db.QueryRowContext(ctx, `SELECT status, COALESCE(header, x''), COALESCE(body, x'') FROM idempotency_keys WHERE id = ?`, id).Scan(&status, &header, &body)
			return
		},
		progress: func(ctx context.Context, id string) (p []byte, err error) {
			err = db.QueryRowContext(ctx, `SELECT COALESCE(progress, x'') FROM idempotency_keys WHERE id = ?`, id).Scan(&p)
			return
		},
		insert: func(ctx context.Context, tx *sql.Tx, id, status string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (?, ?)`, id, status)
			return err
		},
		setStatus: func(ctx context.Context, id, status string) error {
			_, err := db.ExecContext(ctx, `UPDATE orders SET status = ? WHERE id = ?`, status, id)
			return err
		},
		order: func(ctx context.Context, id string) (status string, err error) {
			err = db.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = ?`, id).Scan(&status)
			return
		},
		orders: func(ctx context.Context) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return
		},
	}
}

func postgresBackend(t *testing.T, ctx context.Context) backend[pgx.Tx] {
	rig := pgkit.NewRig(t, ctx, testenv.PostgresDSN(t), "sealed_", "orders", "id TEXT PRIMARY KEY, status TEXT NOT NULL")
	pool, s, table, orders := rig.Pool, rig.Store, rig.Keys, rig.Rows
	return backend[pgx.Tx]{
		store: s,
		row: func(ctx context.Context, id string) (status int, header, body []byte, err error) {
			err = pool.QueryRow(ctx, `SELECT status, COALESCE(header, ''::bytea), COALESCE(body, ''::bytea) FROM `+table+` WHERE id = $1`, id).Scan(&status, &header, &body)
			return
		},
		progress: func(ctx context.Context, id string) (p []byte, err error) {
			err = pool.QueryRow(ctx, `SELECT COALESCE(progress, ''::bytea) FROM `+table+` WHERE id = $1`, id).Scan(&p)
			return
		},
		insert: func(ctx context.Context, tx pgx.Tx, id, status string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES ($1, $2)`, id, status)
			return err
		},
		setStatus: func(ctx context.Context, id, status string) error {
			_, err := pool.Exec(ctx, `UPDATE `+orders+` SET status = $1 WHERE id = $2`, status, id)
			return err
		},
		order: func(ctx context.Context, id string) (status string, err error) {
			err = pool.QueryRow(ctx, `SELECT status FROM `+orders+` WHERE id = $1`, id).Scan(&status)
			return
		},
		orders: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+orders).Scan(&n)
			return
		},
	}
}

func TestSealedHTTPSQLite(t *testing.T) {
	t.Parallel()
	t.Run("encrypted", func(t *testing.T) { testEncryptedHTTP(t, sqliteBackend) })
	t.Run("reference", func(t *testing.T) { testReferenceHTTP(t, sqliteBackend) })
}

func TestSealedHTTPPostgres(t *testing.T) {
	t.Parallel()
	t.Run("encrypted", func(t *testing.T) { testEncryptedHTTP(t, postgresBackend) })
	t.Run("reference", func(t *testing.T) { testReferenceHTTP(t, postgresBackend) })
}

// answer is what a client read: status, the headers a replay carries,
// and the body.
type answer struct {
	status   int
	header   http.Header
	body     []byte
	replayed bool
}

// comparable returns a's status, headers and body, without the headers
// that differ between a first answer and its replay by design (Date,
// Idempotent-Replayed).
func (a answer) comparable() string {
	h := a.header.Clone()
	h.Del("Date")
	h.Del(idemhttp.HeaderReplayed)
	h.Del(idemhttp.HeaderKeyExpires) // the key's lifetime, checked by idemhttp's tests
	var b bytes.Buffer
	_ = h.Write(&b)
	return fmt.Sprintf("%d\n%s\n%q", a.status, b.String(), a.body)
}

// server serves h behind the middleware of g, on a loopback port.
type server struct {
	t   *testing.T
	ctx context.Context
	url string
	c   *http.Client
}

func serve[Tx any](t *testing.T, ctx context.Context, g *idempotency.Guard[Tx], h http.Handler) *server {
	srv := httptest.NewServer(idemhttp.Middleware(g, &idemhttp.Options{Scope: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Account"), nil
	}})(h))
	t.Cleanup(srv.Close)
	return &server{t: t, ctx: ctx, url: srv.URL, c: srv.Client()}
}

func (s *server) post(key, body string) answer {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, s.url+"/api-keys", strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Account", "acct_1")
	req.Header.Set(idemhttp.DefaultKeyHeader, key)
	res, err := s.c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: b, replayed: res.Header.Get(idemhttp.HeaderReplayed) == "true"}
}

func ring(current string, ids ...string) *sealed.Codec {
	keys := map[string][]byte{}
	for _, id := range ids {
		keys[id] = key32(id[len(id)-1])
	}
	c, err := sealed.New(sealed.Keyring{Keys: keys, Current: current})
	if err != nil {
		panic(err)
	}
	return c
}

// testEncryptedHTTP: an answer carrying a secret, sealed under a
// rotating keyring: the raw row shows none of it; the replay is
// byte-exact with the key, fails closed (503, the handler not run) without
// it, and survives a rotation while the old key stays in the ring.
func testEncryptedHTTP[Tx any](t *testing.T, open func(*testing.T, context.Context) backend[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	b := open(t, ctx)
	var calls atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[Tx](r.Context())
		if !ok {
			http.Error(w, "no tx", http.StatusInternalServerError)
			return
		}
		n := calls.Add(1)
		var secret [12]byte
		_, _ = rand.Read(secret[:])
		id := fmt.Sprintf("key-%d", n)
		if err := b.insert(r.Context(), tx, id, "active"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/api-keys/"+id+"-loc")
		w.Header().Set("Etag", `"etag-`+hex.EncodeToString(secret[:4])+`"`)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"secret":"sk_live_%x"}`, id, secret)
	})
	guard := func(c idempotency.Codec) *idempotency.Guard[Tx] {
		g, err := idempotency.New(b.store, &idempotency.Config{Codec: c})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	k1 := serve(t, ctx, guard(ring("2026-1", "2026-1")), handler)
	first := k1.post("order-a", `{"name":"ci"}`)
	replay := k1.post("order-a", `{"name":"ci"}`)
	if first.status != http.StatusCreated || first.replayed || !replay.replayed {
		t.Fatalf("first %d (replayed %v), replay %d (replayed %v)", first.status, first.replayed, replay.status, replay.replayed)
	}
	if first.comparable() != replay.comparable() {
		t.Fatalf("replay differs:\n%s\nwant:\n%s", replay.comparable(), first.comparable())
	}
	status, header, body, err := b.row(ctx, "order-a")
	if err != nil {
		t.Fatal(err)
	}
	raw := append(header, body...)
	secret := first.body[bytes.Index(first.body, []byte("sk_live_")):]
	secret = secret[:len(secret)-2] // the secret, without `"}`
	for _, plain := range [][]byte{secret, []byte("sk_live_"), []byte("key-1-loc"), []byte(first.header.Get("Etag")), []byte("Location"), []byte("application/json")} {
		if bytes.Contains(raw, plain) {
			t.Errorf("the stored row contains %q in clear", plain)
		}
	}
	if status != http.StatusCreated {
		t.Errorf("stored status %d, want 201 in clear", status)
	}
	if id, err := sealed.KeyID(body); err != nil || id != "2026-1" {
		t.Errorf("stored row sealed with %q (%v), want 2026-1", id, err)
	}

	// Without its key: 503, the handler does not run, the typed error.
	gOther := guard(ring("2026-2", "2026-2"))
	if a := serve(t, ctx, gOther, handler).post("order-a", `{"name":"ci"}`); a.status != http.StatusServiceUnavailable {
		t.Errorf("replay without the key: %d %s, want 503", a.status, a.body)
	}
	direct := idempotency.Key{Scope: "acct_1", ID: "direct"}
	if _, err := guard(ring("2026-1", "2026-1")).Do(ctx, direct, "fp", func(Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 200, Body: []byte("sealed")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err = gOther.Do(ctx, direct, "fp", func(Tx) (idempotency.Response, error) {
		t.Error("fn ran for a key whose record could not be opened")
		return idempotency.Response{Status: 200}, nil
	})
	if !errors.Is(err, idempotency.ErrCodec) || !errors.Is(err, sealed.ErrUnknownKey) || errors.Is(err, idempotency.ErrStore) {
		t.Fatalf("Do without the key: %v, want ErrCodec and ErrUnknownKey", err)
	}
	if strings.Contains(err.Error(), "direct") || strings.Contains(err.Error(), "acct_1") {
		t.Errorf("the error names the key: %v", err)
	}

	// Rotation: both keys, the new one current.
	both := serve(t, ctx, guard(ring("2026-2", "2026-1", "2026-2")), handler)
	if a := both.post("order-a", `{"name":"ci"}`); !a.replayed || a.comparable() != first.comparable() {
		t.Errorf("old record after the rotation: %s", a.comparable())
	}
	second := both.post("order-b", `{"name":"cd"}`)
	if second.status != http.StatusCreated || second.replayed {
		t.Fatalf("new key after the rotation: %d", second.status)
	}
	if _, _, body, err := b.row(ctx, "order-b"); err != nil {
		t.Fatal(err)
	} else if id, _ := sealed.KeyID(body); id != "2026-2" {
		t.Errorf("new record sealed with %q, want 2026-2", id)
	}
	// The old key removed: its records fail closed, the new ones replay.
	onlyNew := serve(t, ctx, guard(ring("2026-2", "2026-2")), handler)
	if a := onlyNew.post("order-b", `{"name":"cd"}`); !a.replayed || a.comparable() != second.comparable() {
		t.Errorf("new record, new ring: %s", a.comparable())
	}
	if a := onlyNew.post("order-a", `{"name":"ci"}`); a.status != http.StatusServiceUnavailable {
		t.Errorf("old record, old key removed: %d, want 503", a.status)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2", n)
	}
	if n, err := b.orders(ctx); err != nil || n != 2 {
		t.Errorf("%d orders (%v), want 2", n, err)
	}
}

// testReferenceHTTP: the no-body mode stores the status, Location and the
// resource id only, and a replay renders the resource's current state.
func testReferenceHTTP[Tx any](t *testing.T, open func(*testing.T, context.Context) backend[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	b := open(t, ctx)
	var calls atomic.Int64
	render := func(ctx context.Context, key idempotency.Key, id string) (idempotency.Response, error) {
		status, err := b.order(ctx, id)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Header: http.Header{"Content-Type": {"application/json"}},
			Body: fmt.Appendf(nil, `{"id":%q,"status":%q}`, id, status)}, nil
	}
	ref, err := sealed.NewReference(sealed.Reference{
		Headers: []string{"Location"},
		ResourceID: func(r idempotency.Response) (string, error) {
			id, ok := strings.CutPrefix(r.Header.Get("Location"), "/orders/")
			if !ok {
				return "", errors.New("the answer has no /orders/ Location")
			}
			return id, nil
		},
		Render: render,
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(b.store, &idempotency.Config{Codec: ref})
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, ctx, g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[Tx](r.Context())
		if !ok {
			http.Error(w, "no tx", http.StatusInternalServerError)
			return
		}
		id := fmt.Sprintf("ord-%d", calls.Add(1))
		if err := b.insert(r.Context(), tx, id, "pending"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+id)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"status":"pending","card":"4242"}`, id)
	}))
	first := s.post("ref-1", `{"item":1}`)
	if first.status != http.StatusCreated || string(first.body) != `{"id":"ord-1","status":"pending","card":"4242"}` {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	status, header, body, err := b.row(ctx, "ref-1")
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusCreated || !bytes.Equal(body, []byte("\x00ISR\x05ord-1")) ||
		!bytes.Contains(header, []byte("/orders/ord-1")) || bytes.Contains(header, []byte("application/json")) || bytes.Contains(append(header, body...), []byte("4242")) {
		t.Errorf("stored row: %d %q %q; want 201, Location only, and the resource id", status, header, body)
	}
	if err := b.setStatus(ctx, "ord-1", "shipped"); err != nil {
		t.Fatal(err)
	}
	replay := s.post("ref-1", `{"item":1}`)
	want := answer{status: http.StatusCreated, header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/ord-1"},
		"Content-Length": {"33"}}, body: []byte(`{"id":"ord-1","status":"shipped"}`)}
	if !replay.replayed || replay.comparable() != want.comparable() {
		t.Errorf("replay:\n%s\nwant:\n%s", replay.comparable(), want.comparable())
	}
	if calls.Load() != 1 {
		t.Errorf("the handler ran %d times, want 1", calls.Load())
	}
	if n, err := b.orders(ctx); err != nil || n != 1 {
		t.Errorf("%d orders (%v), want 1", n, err)
	}
}
