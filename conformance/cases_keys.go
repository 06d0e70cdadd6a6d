package conformance

import (
	"bytes"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func (s *suite[Tx]) scopes(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	id := uniq("shared-id")
	a, err := g.Do(e.ctx, idempotency.Key{Scope: "alice", ID: id}, "fp-a", e.effectFn("alice", new(atomic.Int64)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.Do(e.ctx, idempotency.Key{Scope: "bob", ID: id}, "fp-b", e.effectFn("bob", new(atomic.Int64)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Replayed || b.Replayed || bytes.Equal(a.Body, b.Body) {
		t.Fatalf("same id in two scopes must be two operations: got %q and %q", a.Body, b.Body)
	}
	e.count("alice", 1, "scope alice")
	e.count("bob", 1, "scope bob")
	// A UTF-8 scope and the empty scope are further distinct key spaces.
	for _, scope := range []string{"", "çliënt/ü"} {
		r, err := g.Do(e.ctx, idempotency.Key{Scope: scope, ID: id}, "fp-c", e.effectFn("other-"+scope, new(atomic.Int64)))
		if err != nil || r.Replayed {
			t.Fatalf("scope %q: got %+v, %v; want executed", scope, r, err)
		}
		r, err = g.Do(e.ctx, idempotency.Key{Scope: scope, ID: id}, "fp-c", e.effectFn("other-"+scope, new(atomic.Int64)))
		if err != nil || !r.Replayed {
			t.Fatalf("scope %q again: got %+v, %v; want replayed", scope, r, err)
		}
	}
}

func (s *suite[Tx]) byteExactKeys(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	base := uniq("abc")
	scope := uniq("acme")
	keys := []idempotency.Key{
		// IDs: case, trailing space, a neighbouring byte.
		{ID: base}, {ID: "ABC" + base[3:]}, {ID: "Abc" + base[3:]}, {ID: base + " "}, {ID: base + "~"},
		// Scopes: case, trailing space, Unicode normalisation (NFC é, NFD e + U+0301).
		{Scope: scope, ID: base}, {Scope: "ACME" + scope[4:], ID: base}, {Scope: scope + " ", ID: base},
		{Scope: "caf\u00e9" + scope, ID: base}, {Scope: "cafe\u0301" + scope, ID: base},
	}
	tag := func(i int) string { return "key" + strconv.Itoa(i) }
	first := make([]idempotency.Response, len(keys))
	for round := range 2 {
		for i, k := range keys {
			r, err := g.Do(e.ctx, k, "fp", e.effectFn(tag(i), new(atomic.Int64)))
			switch {
			case err != nil:
				t.Fatalf("round %d, key %+q: %v", round, k, err)
			case round == 0 && r.Replayed:
				t.Fatalf("key %+q must be distinct from the keys before it: got a replay of %q", k, r.Body)
			case round == 0:
				first[i] = r
			case !r.Replayed || !sameResponse(r, first[i]):
				t.Fatalf("key %+q again: got %q (replayed %v), want its own answer %q replayed", k, r.Body, r.Replayed, first[i].Body)
			}
		}
	}
	for i := range keys {
		e.count(tag(i), 1, "byte-exact keys")
	}
}

func (s *suite[Tx]) invalidInput(t *testing.T) {
	e := s.setup(t, Options{})
	cs := newSpy(e.f.Store)
	g, err := idempotency.New[Tx](cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	fn := e.effectFn("bad", new(atomic.Int64))
	long := string(bytes.Repeat([]byte("k"), 256))
	keys := []idempotency.Key{
		{ID: ""},
		{ID: long},
		{ID: "line\nbreak"},
		{ID: "tab\tkey"},
		{ID: "ünïcode"},
		{ID: "ok", Scope: "nul\x00scope"},
		{ID: "ok", Scope: "\xff\xfe"},
		{ID: "ok", Scope: long},
	}
	for _, k := range keys {
		if _, err := g.Do(e.ctx, k, "fp", fn); !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Fatalf("key %+q: got %v, want ErrInvalidKey", k, err)
		}
	}
	for _, fp := range []string{"", long, "bin\x01"} {
		if _, err := g.Do(e.ctx, idempotency.Key{ID: "ok"}, fp, fn); !errors.Is(err, idempotency.ErrInvalidFingerprint) {
			t.Fatalf("fingerprint %q: got %v, want ErrInvalidFingerprint", fp, err)
		}
	}
	if _, err := g.Do(e.ctx, idempotency.Key{ID: "ok"}, "fp", nil); !errors.Is(err, idempotency.ErrInvalidResponse) {
		t.Fatalf("nil fn: got %v, want ErrInvalidResponse", err)
	}
	if n := cs.reserves.Load(); n != 0 {
		t.Fatalf("invalid input reached the store %d times, want 0", n)
	}
	// The longest valid key and scope are accepted.
	maxKey := idempotency.Key{ID: string(bytes.Repeat([]byte("~"), 255)), Scope: string(bytes.Repeat([]byte("s"), 255))}
	if r, err := g.Do(e.ctx, maxKey, string(bytes.Repeat([]byte("f"), 255)), fn); err != nil || r.Replayed {
		t.Fatalf("255-byte id, scope and fingerprint: got %+v, %v; want executed", r, err)
	}
	e.count("bad", 1, "only the valid call")
	for _, cfg := range []idempotency.Config{{TTL: -time.Second}, {PurgeBatch: -1}, {RetryBackoff: -1}} {
		if _, err := idempotency.New(e.f.Store, &cfg); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("config %+v: got %v, want ErrInvalidConfig", cfg, err)
		}
	}
}
