package sealed_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/sealed"
)

// mysqlBackend is a MySQL/MariaDB store with an orders table.
func mysqlBackend(t *testing.T, ctx context.Context) backend[*sql.Tx] {
	db, err := mysql.Open(ctx, testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	table := testkit.Name("sealed_")
	orders := table + "_orders"
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+", "+orders)
	})
	s, err := mysql.New(db, &mysql.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+orders+` (id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return backend[*sql.Tx]{
		store: s,
		row: func(ctx context.Context, id string) (status int, header, body []byte, err error) {
			err = db.QueryRowContext(ctx, `SELECT COALESCE(status, 0), COALESCE(header, ''), COALESCE(body, '') FROM `+table+` WHERE id = ?`, id).Scan(&status, &header, &body)
			return
		},
		progress: func(ctx context.Context, id string) (p []byte, err error) {
			err = db.QueryRowContext(ctx, `SELECT COALESCE(progress, '') FROM `+table+` WHERE id = ?`, id).Scan(&p)
			return
		},
		insert: func(ctx context.Context, tx *sql.Tx, id, status string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+orders+` (id, status) VALUES (?, ?)`, id, status)
			return err
		},
		orders: func(ctx context.Context) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+orders).Scan(&n)
			return
		},
	}
}

func TestFailClosedSQLite(t *testing.T)   { testFailClosed(t, sqliteBackend) }
func TestFailClosedPostgres(t *testing.T) { testFailClosed(t, postgresBackend) }
func TestFailClosedMySQL(t *testing.T)    { testFailClosed(t, mysqlBackend) }

// testFailClosed: a sealed record says so in its row, and a Guard that
// cannot open it (no Codec, or a Codec without the record's key id) fails
// with ErrCodec (503 over HTTP) and never runs fn again; an unfinished
// operation's input and step data are sealed in the row too.
func testFailClosed[Tx any](t *testing.T, open func(*testing.T, context.Context) backend[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	b := open(t, ctx)
	guard := func(c idempotency.Codec) *idempotency.Guard[Tx] {
		g, err := idempotency.New(b.store, &idempotency.Config{Codec: c})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	sealedG, plainG, otherG := guard(ring("k1", "k1")), guard(nil), guard(ring("k2", "k2"))
	var runs atomic.Int64
	fn := func(tx Tx) (idempotency.Response, error) {
		runs.Add(1)
		if err := b.insert(ctx, tx, "order-1", "paid"); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"order-1"}`)}, nil
	}
	key := idempotency.Key{Scope: "acct", ID: "pay-1"}
	first, err := sealedG.Do(ctx, key, "fp", fn)
	if err != nil || first.Status != 201 {
		t.Fatalf("first call: %+v, %v", first, err)
	}
	for name, g := range map[string]*idempotency.Guard[Tx]{"no Codec": plainG, "Codec without the key id": otherG} {
		resp, err := g.Do(ctx, key, "fp", fn)
		if !errors.Is(err, idempotency.ErrCodec) || errors.Is(err, idempotency.ErrStore) || resp.Status != 0 {
			t.Errorf("%s: Do gave %d %q, %v; want ErrCodec and no answer", name, resp.Status, resp.Body, err)
		}
		if info, err := g.Inspect(ctx, key, true); !errors.Is(err, idempotency.ErrCodec) && (err != nil || !info.Sealed || info.Body != nil) {
			t.Errorf("%s: Inspect gave %+v, %v; want ErrCodec, or the key sealed without its bytes", name, info, err)
		}
		// Over HTTP: 503, the handler does not run.
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(201)
		})
		if a := serve(t, ctx, g, h).post("pay-http-"+strings.ReplaceAll(name, " ", "-"), `{}`); a.status != http.StatusCreated {
			t.Fatalf("%s: a new key over HTTP: %d", name, a.status)
		}
	}
	if n := runs.Load(); n != 3 { // fn once, the two handlers once each for their own new key
		t.Errorf("fn and the handlers ran %d times, want 3", n)
	}
	if n, err := b.orders(ctx); err != nil || n != 1 {
		t.Errorf("%d orders (%v), want 1", n, err)
	}
	httpSealed := serve(t, ctx, sealedG, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(201)
		_, _ = w.Write([]byte("sealed over HTTP"))
	}))
	if a := httpSealed.post("pay-sealed", `{}`); a.status != 201 {
		t.Fatalf("sealed HTTP call: %d", a.status)
	}
	a := serve(t, ctx, plainG, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran for a sealed record")
	})).post("pay-sealed", `{}`)
	if a.status != http.StatusServiceUnavailable || bytes.Contains(a.body, []byte("sealed over HTTP")) {
		t.Errorf("a sealed record without the Codec over HTTP: %d %q, want 503", a.status, a.body)
	}

	// Inspect: Sealed; the body only with the Codec.
	info, err := plainG.Inspect(ctx, key, true)
	if err != nil || !info.Sealed || info.Body != nil || info.Status != 201 {
		t.Errorf("Inspect without the Codec: %+v, %v; want Sealed, status 201, no body", info, err)
	}
	info, err = sealedG.Inspect(ctx, key, true)
	if err != nil || !info.Sealed || string(info.Body) != `{"id":"order-1"}` || info.Header.Get("Content-Type") != "application/json" {
		t.Errorf("Inspect with the Codec: %+v, %v; want the opened answer", info, err)
	}
	if _, err := otherG.Inspect(ctx, key, true); !errors.Is(err, idempotency.ErrCodec) {
		t.Errorf("Inspect with a Codec without the key id: %v, want ErrCodec", err)
	}

	// An operation: its input and step data are sealed in the row.
	const token = "tok_4242424242424242"
	var foreignOK atomic.Bool
	op := &idempotency.Operation[Tx]{
		Name: "charge",
		Steps: []idempotency.Step[Tx]{
			{Name: "order", Local: func(ctx context.Context, tx Tx, s *idempotency.State) error {
				s.Set("card", "card_"+string(s.Input()))
				return b.insert(ctx, tx, "order-2", "new")
			}},
			{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
				if !foreignOK.Load() {
					return errors.New("processor down")
				}
				if s.Get("card") != "card_"+token || string(s.Input()) != token {
					t.Errorf("the resumed run has input %q and card %q", s.Input(), s.Get("card"))
				}
				return nil
			}},
		},
		Finish: func(ctx context.Context, tx Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("charged")}, nil
		},
	}
	opKey := idempotency.Key{Scope: "acct", ID: "op-1"}
	if _, err := sealedG.Run(ctx, opKey, "fp", []byte(token), op); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("first run: %v, want ErrUnfinished", err)
	}
	raw, err := b.progress(ctx, "op-1")
	if err != nil || len(raw) == 0 {
		t.Fatalf("progress of the unfinished key: %q, %v", raw, err)
	}
	if bytes.Contains(raw, []byte("4242")) || bytes.Contains(raw, []byte("card_")) {
		t.Errorf("the stored progress holds the input or the step data in clear: %q", raw)
	}
	if !bytes.Contains(raw, []byte("charge")) {
		t.Errorf("the stored progress lost the operation's name and step: %q", raw)
	}
	if info, err := plainG.Inspect(ctx, opKey, true); err != nil || !info.Sealed || info.State != idempotency.KeyUnfinished || info.Step != "charge" {
		t.Errorf("Inspect of the unfinished key: %+v, %v", info, err)
	}
	foreignOK.Store(true)
	if _, err := plainG.Run(ctx, opKey, "fp", []byte(token), op); !errors.Is(err, idempotency.ErrCodec) {
		t.Errorf("a run without the Codec: %v, want ErrCodec", err)
	}
	resp, err := sealedG.Run(ctx, opKey, "fp", []byte(token), op)
	if err != nil || string(resp.Body) != "charged" {
		t.Fatalf("the resumed run: %q, %v", resp.Body, err)
	}
	if n, err := b.orders(ctx); err != nil || n != 2 {
		t.Errorf("%d orders (%v), want 2: the Local step committed once", n, err)
	}
	// A Codec that cannot seal data is refused before anything is written.
	ref, err := sealedReference()
	if err != nil {
		t.Fatal(err)
	}
	_, err = guard(ref).Run(ctx, idempotency.Key{Scope: "acct", ID: "op-2"}, "fp", []byte(token), op)
	if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), "SealData") {
		t.Errorf("Run with a Codec that cannot seal data: %v, want ErrInvalidConfig", err)
	}
	if _, err := plainG.Inspect(ctx, idempotency.Key{Scope: "acct", ID: "op-2"}, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("the refused run left a record: %v", err)
	}
}

// sealedReference is a ReferenceCodec alone: it stores no body, and
// cannot seal an operation's data.
func sealedReference() (idempotency.Codec, error) {
	return sealed.NewReference(sealed.Reference{
		ResourceID: func(resp idempotency.Response) (string, error) { return "r", nil },
		Render: func(ctx context.Context, key idempotency.Key, id string) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		},
	})
}
