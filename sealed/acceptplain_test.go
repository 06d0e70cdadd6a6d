package sealed_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sealed"
	"github.com/go-idempotency/idempotency/sqlite"
)

// plainRing is ring("k1", "k1") with AcceptPlain: the codec of a
// switch to sealing.
func plainRing(t *testing.T) *sealed.Codec {
	t.Helper()
	c, err := sealed.New(sealed.Keyring{Keys: map[string][]byte{"k1": key32('1')}, Current: "k1", AcceptPlain: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reversing is a Codec of someone else's: it stores the body reversed,
// without sealed's magic.
type reversing struct{}

func (reversing) Seal(_ context.Context, _ idempotency.Key, r idempotency.Response) (idempotency.Response, error) {
	r.Body = slices.Clone(r.Body)
	slices.Reverse(r.Body)
	return r, nil
}

func (c reversing) Open(ctx context.Context, k idempotency.Key, r idempotency.Response) (idempotency.Response, error) {
	return c.Seal(ctx, k, r)
}

// acceptPlainDB is a SQLite store, its database for tampering with rows,
// and the Guards of each codec.
type acceptPlainDB struct {
	db    *sql.DB
	store *sqlite.Store
	runs  atomic.Int64
}

func newAcceptPlainDB(t *testing.T, ctx context.Context) *acceptPlainDB {
	db, s := openSQLite(t, ctx)
	return &acceptPlainDB{db: db, store: s}
}

func (d *acceptPlainDB) guard(t *testing.T, c idempotency.Codec) *idempotency.Guard[*sql.Tx] {
	t.Helper()
	g, err := idempotency.New(d.store, &idempotency.Config{Codec: c})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (d *acceptPlainDB) fn(tx *sql.Tx) (idempotency.Response, error) {
	d.runs.Add(1)
	return idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"order-1"}`)}, nil
}

func (d *acceptPlainDB) exec(t *testing.T, ctx context.Context, query string, args ...any) {
	t.Helper()
	res, err := d.db.ExecContext(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("%s: %d rows, %v; want 1", query, n, err)
	}
}

// TestAcceptPlainNeverOpensMarked: with AcceptPlain, a record a Guard
// marked sealed is never served as a plain one, whether its bytes were
// damaged or another codec sealed it; Do and Inspect fail with ErrCodec
// and fn does not run again. Records stored in clear are still served
// with AcceptPlain, refused without it, by Do and Inspect alike, and an
// unmarked record sealed by sealed (as 0.1.0 stored them) is opened by
// Inspect as by Do.
func TestAcceptPlainNeverOpensMarked(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	d := newAcceptPlainDB(t, ctx)
	accepting, strict, plain, other := d.guard(t, plainRing(t)), d.guard(t, ring("k1", "k1")), d.guard(t, nil), d.guard(t, reversing{})
	ref, err := sealed.NewReference(sealed.Reference{
		ResourceID: func(idempotency.Response) (string, error) { return "r", nil },
		Render: func(context.Context, idempotency.Key, string) (idempotency.Response, error) {
			return idempotency.Response{Status: 200, Body: []byte("rendered")}, nil
		},
		AcceptPlain: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	referencing := d.guard(t, ref)
	do := func(g *idempotency.Guard[*sql.Tx], id string) (idempotency.Response, error) {
		return g.Do(ctx, idempotency.Key{Scope: "acct", ID: id}, "fp", d.fn)
	}
	inspect := func(g *idempotency.Guard[*sql.Tx], id string) (*idempotency.KeyInfo, error) {
		return g.Inspect(ctx, idempotency.Key{Scope: "acct", ID: id}, true)
	}
	refused := func(what string, resp idempotency.Response, err error) {
		t.Helper()
		if !errors.Is(err, idempotency.ErrCodec) || resp.Status != 0 || resp.Body != nil {
			t.Errorf("%s: %d %q, %v; want ErrCodec and no answer", what, resp.Status, resp.Body, err)
		}
	}
	for _, id := range []string{"damaged", "legacy"} {
		if _, err := do(accepting, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := do(other, "other-codec"); err != nil {
		t.Fatal(err)
	}
	if _, err := do(plain, "plain"); err != nil {
		t.Fatal(err)
	}
	// The sealed body's first byte damaged: no longer sealed's magic.
	d.exec(t, ctx, `UPDATE idempotency_keys SET body = x'01' || substr(body, 2) WHERE id = 'damaged'`)
	// Sealed before records were marked: the stored header is only the mark.
	d.exec(t, ctx, `UPDATE idempotency_keys SET header = NULL WHERE id = 'legacy'`)
	runs := d.runs.Load()

	for _, id := range []string{"damaged", "other-codec"} {
		for _, g := range []*idempotency.Guard[*sql.Tx]{accepting, referencing} {
			resp, err := do(g, id)
			refused(id+": Do", resp, err)
			info, err := inspect(g, id)
			if !errors.Is(err, idempotency.ErrCodec) {
				t.Errorf("%s: Inspect gave %+v, %v; want ErrCodec", id, info, err)
			}
		}
	}
	if resp, err := do(referencing, "plain"); err != nil || string(resp.Body) != `{"id":"order-1"}` {
		t.Errorf("plain record with a ReferenceCodec's AcceptPlain: %+v, %v; want the stored answer", resp, err)
	}

	resp, err := do(accepting, "plain")
	if err != nil || !resp.Replayed || string(resp.Body) != `{"id":"order-1"}` {
		t.Errorf("plain record with AcceptPlain: %+v, %v; want the stored answer", resp, err)
	}
	if info, err := inspect(accepting, "plain"); err != nil || string(info.Body) != `{"id":"order-1"}` || info.Sealed {
		t.Errorf("Inspect of a plain record with AcceptPlain: %+v, %v", info, err)
	}
	resp, err = do(strict, "plain")
	refused("plain record without AcceptPlain: Do", resp, err)
	if info, err := inspect(strict, "plain"); !errors.Is(err, idempotency.ErrCodec) {
		t.Errorf("Inspect of a plain record without AcceptPlain: %+v, %v; want ErrCodec, as Do", info, err)
	}

	for _, g := range []*idempotency.Guard[*sql.Tx]{accepting, strict} {
		resp, err := do(g, "legacy")
		if err != nil || string(resp.Body) != `{"id":"order-1"}` || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("an unmarked sealed record: Do gave %+v, %v; want it opened", resp, err)
		}
		info, err := inspect(g, "legacy")
		if err != nil || string(info.Body) != `{"id":"order-1"}` || info.Header.Get("Content-Type") != "application/json" {
			t.Errorf("an unmarked sealed record: Inspect gave %+v, %v; want it opened, as Do does", info, err)
		}
	}
	if n := d.runs.Load(); n != runs {
		t.Errorf("fn ran %d more times; want none", n-runs)
	}
	// An expired answer stored in clear is shown as it is: no replay
	// serves it (the status resource answers 404, not 503).
	d.exec(t, ctx, `UPDATE idempotency_keys SET expires_at = 1 WHERE id = 'plain'`)
	if info, err := inspect(strict, "plain"); err != nil || info.State != idempotency.KeyExpired || string(info.Body) != `{"id":"order-1"}` {
		t.Errorf("Inspect of an expired plain record without AcceptPlain: %+v, %v; want it expired, as stored", info, err)
	}
}

// TestAcceptPlainProgress: an operation left unfinished by a Guard
// without a Codec stored its input and data in clear. A Guard whose
// Keyring has no AcceptPlain refuses to resume it (ErrCodec, no step
// runs): OpenData is asked, as Open is for an answer. With AcceptPlain it
// resumes, and the next save seals them. Sealed progress whose bytes were
// damaged is refused even with AcceptPlain.
func TestAcceptPlainProgress(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	d := newAcceptPlainDB(t, ctx)
	accepting, strict, plain := d.guard(t, plainRing(t)), d.guard(t, ring("k1", "k1")), d.guard(t, nil)
	const token = "tok_4242424242424242"
	var up atomic.Bool
	var steps atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{
		Name: "charge",
		Steps: []idempotency.Step[*sql.Tx]{
			{Name: "order", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
				steps.Add(1)
				s.Set("card", "card_"+string(s.Input()))
				return nil
			}},
			{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
				steps.Add(1)
				if !up.Load() {
					return errors.New("processor down")
				}
				if s.Get("card") != "card_"+token || string(s.Input()) != token {
					t.Errorf("the resumed run has input %q and card %q", s.Input(), s.Get("card"))
				}
				return nil
			}},
		},
		Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("charged")}, nil
		},
	}
	run := func(g *idempotency.Guard[*sql.Tx], id string) (idempotency.Response, error) {
		return g.Run(ctx, idempotency.Key{Scope: "acct", ID: id}, "fp", []byte(token), op)
	}
	progress := func(id string) []byte {
		var p []byte
		if err := d.db.QueryRowContext(ctx, `SELECT progress FROM idempotency_keys WHERE id = ?`, id).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := run(plain, "clear"); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("first run: %v, want ErrUnfinished", err)
	}
	if !bytes.Contains(progress("clear"), []byte(token)) {
		t.Fatal("a Guard without a Codec stored the input sealed")
	}
	if _, err := run(accepting, "damaged"); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("first sealed run: %v, want ErrUnfinished", err)
	}
	raw := progress("damaged")
	i := bytes.Index(raw, []byte("\x00ISD"))
	if i < 0 {
		t.Fatalf("sealed progress without sealed's magic: %q", raw)
	}
	raw[i] = 1
	d.exec(t, ctx, `UPDATE idempotency_keys SET progress = ? WHERE id = 'damaged'`, raw)
	up.Store(true)
	before := steps.Load()

	resp, err := run(strict, "clear")
	if !errors.Is(err, idempotency.ErrCodec) || resp.Body != nil {
		t.Errorf("clear progress without AcceptPlain: %q, %v; want ErrCodec", resp.Body, err)
	}
	resp, err = run(accepting, "damaged")
	if !errors.Is(err, idempotency.ErrCodec) || resp.Body != nil {
		t.Errorf("damaged sealed progress with AcceptPlain: %q, %v; want ErrCodec", resp.Body, err)
	}
	if n := steps.Load() - before; n != 0 {
		t.Errorf("%d steps ran on progress that was refused", n)
	}
	resp, err = run(accepting, "clear")
	if err != nil || string(resp.Body) != "charged" {
		t.Errorf("clear progress with AcceptPlain: %q, %v; want the run to finish", resp.Body, err)
	}
	if n := steps.Load() - before; n != 1 {
		t.Errorf("the resumed run ran %d steps, want 1 (the Foreign one)", n)
	}
}
