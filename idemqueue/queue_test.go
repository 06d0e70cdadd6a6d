package idemqueue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

func newGuard(t *testing.T) (*idempotency.Guard[*memstore.Tx], *memstore.Store) {
	t.Helper()
	store := memstore.New()
	g, err := idempotency.New(store, &idempotency.Config{WaitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return g, store
}

func TestProcessAcksThenReplays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, store := newGuard(t)
	key := idempotency.Key{Scope: "billing", ID: "id:m1"}
	runs := 0
	handle := func(tx *memstore.Tx) ([]byte, error) {
		runs++
		tx.Effect("invoice")
		return []byte("invoiced\x00\xff"), nil
	}
	for i, wantReplayed := range []bool{false, true, true} {
		out, err := idemqueue.Process(ctx, g, key, "fp", handle)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		if out.Verdict != idemqueue.Ack || out.Replayed != wantReplayed || string(out.Body) != "invoiced\x00\xff" {
			t.Fatalf("delivery %d: got %+v, want ack, replayed %v, the first body", i, out, wantReplayed)
		}
	}
	if runs != 1 || store.Count("invoice") != 1 {
		t.Fatalf("handler runs %d, effects %d: want 1 and 1", runs, store.Count("invoice"))
	}
}

func TestProcessVerdicts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errFails := errors.New("handler fails")
	cases := []struct {
		name    string
		key     idempotency.Key
		fp      string
		err     error
		want    idemqueue.Verdict
		wantErr error
	}{
		{"handler error: retry", idempotency.Key{Scope: "s", ID: "a"}, "fp", errFails, idemqueue.Retry, errFails},
		{"permanent: drop", idempotency.Key{Scope: "s", ID: "b"}, "fp", idemqueue.Permanent(errFails), idemqueue.Drop, idemqueue.ErrPermanent},
		{"invalid key: drop", idempotency.Key{Scope: "s", ID: ""}, "fp", nil, idemqueue.Drop, idempotency.ErrInvalidKey},
		{"invalid fingerprint: drop", idempotency.Key{Scope: "s", ID: "c"}, "", nil, idemqueue.Drop, idempotency.ErrInvalidFingerprint},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, store := newGuard(t)
			out, err := idemqueue.Process(ctx, g, c.key, c.fp, func(tx *memstore.Tx) ([]byte, error) {
				tx.Effect("e")
				return []byte("x"), c.err
			})
			if out.Verdict != c.want || !errors.Is(err, c.wantErr) || out.Body != nil {
				t.Fatalf("got %v, %+v, %v; want %v and an error wrapping %v", out.Verdict, out, err, c.want, c.wantErr)
			}
			if n := store.Count("e"); n != 0 {
				t.Fatalf("%d effects committed, want 0", n)
			}
		})
	}
}

func TestProcessMismatchDrops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, _ := newGuard(t)
	key := idempotency.Key{Scope: "s", ID: "m"}
	ok := func(*memstore.Tx) ([]byte, error) { return []byte("first"), nil }
	if _, err := idemqueue.Process(ctx, g, key, "fp1", ok); err != nil {
		t.Fatal(err)
	}
	out, err := idemqueue.Process(ctx, g, key, "fp2", ok)
	if out.Verdict != idemqueue.Drop || !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("got %v, %v; want drop and ErrMismatch", out.Verdict, err)
	}
}

func TestPermanent(t *testing.T) {
	base := errors.New("bad payload")
	err := idemqueue.Permanent(base)
	if !errors.Is(err, base) || !errors.Is(err, idemqueue.ErrPermanent) || !idemqueue.IsPermanent(err) {
		t.Fatalf("Permanent(base) = %v: want both in the chain", err)
	}
	if idemqueue.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	if idemqueue.IsPermanent(base) || idemqueue.IsPermanent(idempotency.ErrStore) {
		t.Fatal("IsPermanent of a curable error")
	}
}

func TestKeyID(t *testing.T) {
	long := strings.Repeat("k", 256)
	for _, c := range []struct {
		raw    string
		hashed bool
	}{
		{"id:abc", false},
		{strings.Repeat("k", 255), false},
		{long, true},
		{"caf\xe9", true},
		{"", true},
	} {
		got := idemqueue.KeyID(c.raw)
		if (idempotency.Key{ID: got}).Validate() != nil {
			t.Errorf("KeyID(%q) = %q: not a valid key id", c.raw, got)
		}
		if hashed := got != c.raw; hashed != c.hashed || (hashed && !strings.HasPrefix(got, "sha256:")) {
			t.Errorf("KeyID(%q) = %q: hashed %v, want %v", c.raw, got, hashed, c.hashed)
		}
	}
	if got := idemqueue.KeyID(""); got != "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("KeyID(\"\") = %q: want the SHA-256 of nothing", got)
	}
	if idemqueue.KeyID(long) == idemqueue.KeyID(long+"x") {
		t.Error("two long identities share a key id")
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[idemqueue.Verdict]string{idemqueue.Ack: "ack", idemqueue.Retry: "retry", idemqueue.Drop: "drop", 0: "Verdict(0)"} {
		if got := v.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(v), got, want)
		}
	}
}
