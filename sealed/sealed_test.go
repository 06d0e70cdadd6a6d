package sealed_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sealed"
)

// key32 is a 32-byte key made of b.
func key32(b byte) []byte { return bytes.Repeat([]byte{b}, sealed.KeySize) }

func mustNew(t testing.TB, kr sealed.Keyring) *sealed.Codec {
	t.Helper()
	c, err := sealed.New(kr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewValidates(t *testing.T) {
	for name, kr := range map[string]sealed.Keyring{
		"no keys":         {Current: "k1"},
		"short key":       {Keys: map[string][]byte{"k1": key32(1)[:16]}, Current: "k1"},
		"long key":        {Keys: map[string][]byte{"k1": append(key32(1), 0)}, Current: "k1"},
		"empty id":        {Keys: map[string][]byte{"": key32(1)}, Current: ""},
		"id with space":   {Keys: map[string][]byte{"k 1": key32(1)}, Current: "k 1"},
		"id not ASCII":    {Keys: map[string][]byte{"clé": key32(1)}, Current: "clé"},
		"id too long":     {Keys: map[string][]byte{strings.Repeat("k", 65): key32(1)}, Current: strings.Repeat("k", 65)},
		"current missing": {Keys: map[string][]byte{"k1": key32(1)}, Current: "k2"},
		"no current":      {Keys: map[string][]byte{"k1": key32(1)}},
	} {
		if _, err := sealed.New(kr); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		} else if strings.Contains(err.Error(), string(key32(1))) {
			t.Errorf("%s: the error shows the key: %v", name, err)
		}
	}
	id := func(idempotency.Response) (string, error) { return "1", nil }
	render := func(context.Context, idempotency.Key, string) (idempotency.Response, error) {
		return idempotency.Response{}, nil
	}
	for name, cfg := range map[string]sealed.Reference{
		"no ResourceID": {Render: render},
		"no Render":     {ResourceID: id},
		"bad header":    {ResourceID: id, Render: render, Headers: []string{"Location", "Bad Name"}},
		"empty header":  {ResourceID: id, Render: render, Headers: []string{""}},
	} {
		if _, err := sealed.NewReference(cfg); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("reference %s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestNewCopiesKeys: changing the caller's key bytes after New changes
// nothing.
func TestNewCopiesKeys(t *testing.T) {
	k := key32(7)
	c := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"k1": k}, Current: "k1"})
	key := idempotency.Key{Scope: "s", ID: "i"}
	st, err := c.Seal(context.Background(), key, idempotency.Response{Status: 200, Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	k[0] ^= 0xff
	if r, err := c.Open(context.Background(), key, st); err != nil || string(r.Body) != "x" {
		t.Fatalf("Open after the caller changed its key bytes: %+v, %v", r, err)
	}
}

func TestSealOpen(t *testing.T) {
	ctx := context.Background()
	c := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"k1": key32(1)}, Current: "k1"})
	key := idempotency.Key{Scope: "acct_1", ID: "order-42"}
	resp := idempotency.Response{Status: 201,
		Header: http.Header{"Location": {"/keys/9"}, "X-Secret": {"v1", "", "v\x00\xff"}},
		Body:   []byte("{\"apiKey\":\"sk_live_abcdef\"}\x00\xff")}
	st, err := c.Seal(ctx, key, resp)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != 201 || st.Header != nil {
		t.Errorf("sealed record: status %d, header %v; want 201 in clear and no header", st.Status, st.Header)
	}
	for _, clear := range []string{"sk_live_abcdef", "/keys/9", "Location", "X-Secret", "v1"} {
		if bytes.Contains(st.Body, []byte(clear)) {
			t.Errorf("the sealed body contains %q", clear)
		}
	}
	if id, err := sealed.KeyID(st.Body); err != nil || id != "k1" {
		t.Errorf("KeyID: %q, %v", id, err)
	}
	got, err := c.Open(ctx, key, st)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, resp) {
		t.Errorf("opened %+v, want %+v", got, resp)
	}
	again, _ := c.Seal(ctx, key, resp)
	if bytes.Equal(again.Body, st.Body) {
		t.Error("two seals of one answer are equal: the nonce is not fresh")
	}
	// Empty answer.
	st0, err := c.Seal(ctx, key, idempotency.Response{Status: 204})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.Open(ctx, key, st0); err != nil || r.Status != 204 || r.Header != nil || r.Body != nil {
		t.Errorf("empty answer opened as %+v, %v", r, err)
	}

	for name, tc := range map[string]struct {
		key    idempotency.Key
		stored func() idempotency.Response
		want   error
	}{
		"other id":    {idempotency.Key{Scope: "acct_1", ID: "order-43"}, func() idempotency.Response { return st }, sealed.ErrCorrupt},
		"other scope": {idempotency.Key{Scope: "acct_2", ID: "order-42"}, func() idempotency.Response { return st }, sealed.ErrCorrupt},
		"status changed": {key, func() idempotency.Response {
			s := st
			s.Status = 200
			return s
		}, sealed.ErrCorrupt},
		"a byte flipped": {key, func() idempotency.Response {
			s := st
			s.Body = bytes.Clone(st.Body)
			s.Body[len(s.Body)-20] ^= 1
			return s
		}, sealed.ErrCorrupt},
		"truncated": {key, func() idempotency.Response {
			s := st
			s.Body = st.Body[:10]
			return s
		}, sealed.ErrCorrupt},
		"key id renamed": {key, func() idempotency.Response {
			s := st
			s.Body = bytes.Replace(bytes.Clone(st.Body), []byte("k1"), []byte("k2"), 1)
			return s
		}, sealed.ErrUnknownKey},
		"plain": {key, func() idempotency.Response { return resp }, sealed.ErrNotSealed},
	} {
		if _, err := c.Open(ctx, tc.key, tc.stored()); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// Another key under the same id does not open it.
	other := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"k1": key32(2)}, Current: "k1"})
	if _, err := other.Open(ctx, key, st); !errors.Is(err, sealed.ErrCorrupt) {
		t.Errorf("another key under the same id: %v, want ErrCorrupt", err)
	}
	// AcceptPlain returns a plain record as it is, never a sealed one
	// that fails.
	plain := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"k1": key32(2)}, Current: "k1", AcceptPlain: true})
	if r, err := plain.Open(ctx, key, resp); err != nil || !reflect.DeepEqual(r, resp) {
		t.Errorf("AcceptPlain: %+v, %v", r, err)
	}
	if _, err := plain.Open(ctx, key, st); !errors.Is(err, sealed.ErrCorrupt) {
		t.Errorf("AcceptPlain on a record sealed with another key: %v, want ErrCorrupt", err)
	}
}

// TestRotation: a ring with a new current key still opens the records of
// the old one, seals with the new one; once the old key is removed, its
// records fail with ErrUnknownKey.
func TestRotation(t *testing.T) {
	ctx := context.Background()
	key := idempotency.Key{Scope: "s", ID: "k"}
	before := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"2026-01": key32(1)}, Current: "2026-01"})
	during := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"2026-01": key32(1), "2026-02": key32(2)}, Current: "2026-02"})
	after := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"2026-02": key32(2)}, Current: "2026-02"})
	old, _ := before.Seal(ctx, key, idempotency.Response{Status: 200, Body: []byte("old")})
	newer, _ := during.Seal(ctx, key, idempotency.Response{Status: 200, Body: []byte("new")})
	if id, _ := sealed.KeyID(newer.Body); id != "2026-02" {
		t.Errorf("sealed with %q after the rotation, want 2026-02", id)
	}
	for name, tc := range map[string]struct {
		c      *sealed.Codec
		stored idempotency.Response
		body   string
		err    error
	}{
		"old record, ring with both": {during, old, "old", nil},
		"new record, ring with both": {during, newer, "new", nil},
		"new record, new ring":       {after, newer, "new", nil},
		"old record, new ring":       {after, old, "", sealed.ErrUnknownKey},
		"new record, old ring":       {before, newer, "", sealed.ErrUnknownKey},
	} {
		r, err := tc.c.Open(ctx, key, tc.stored)
		if !errors.Is(err, tc.err) || string(r.Body) != tc.body {
			t.Errorf("%s: %q, %v; want %q, %v", name, r.Body, err, tc.body, tc.err)
		}
	}
}

// TestReferenceCodec: the stored record holds the status, the allowed
// headers and the resource id; Open renders the resource's current state.
func TestReferenceCodec(t *testing.T) {
	ctx := context.Background()
	state := map[string]string{"42": `{"id":"42","status":"pending"}`}
	var renderedFor []string
	ref, err := sealed.NewReference(sealed.Reference{
		Headers: []string{"location"},
		ResourceID: func(r idempotency.Response) (string, error) {
			id, ok := strings.CutPrefix(r.Header.Get("Location"), "/orders/")
			if !ok {
				return "", errors.New("no Location")
			}
			return id, nil
		},
		Render: func(_ context.Context, key idempotency.Key, id string) (idempotency.Response, error) {
			renderedFor = append(renderedFor, key.Scope+"/"+id)
			body, ok := state[id]
			if !ok {
				return idempotency.Response{Status: http.StatusGone}, nil
			}
			return idempotency.Response{Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/wrong"}}, Body: []byte(body)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{Scope: "acct", ID: "k"}
	first := idempotency.Response{Status: 201, Header: http.Header{"Location": {"/orders/42"}, "X-Trace": {"t1"}, "Content-Type": {"application/json"}},
		Body: []byte(state["42"])}
	st, err := ref.Seal(ctx, key, first)
	if err != nil {
		t.Fatal(err)
	}
	if want := (http.Header{"Location": {"/orders/42"}}); !reflect.DeepEqual(st.Header, want) || st.Status != 201 {
		t.Errorf("stored status %d header %v, want 201 %v", st.Status, st.Header, want)
	}
	if !bytes.Equal(st.Body, []byte("\x00ISR\x0242")) {
		t.Errorf("stored body %q", st.Body)
	}
	state["42"] = `{"id":"42","status":"shipped"}`
	got, err := ref.Open(ctx, key, st)
	want := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/42"}}, Body: []byte(state["42"])}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("replay %+v, %v; want %+v", got, err, want)
	}
	delete(state, "42")
	if got, err := ref.Open(ctx, key, st); err != nil || got.Status != http.StatusGone {
		t.Errorf("deleted resource: %+v, %v; want 410", got, err)
	}
	if !reflect.DeepEqual(renderedFor, []string{"acct/42", "acct/42"}) {
		t.Errorf("Render called for %v", renderedFor)
	}
	if _, err := ref.Seal(ctx, key, idempotency.Response{Status: 201}); err == nil {
		t.Error("Seal without a resource id succeeded")
	}
	if _, err := ref.Open(ctx, key, first); !errors.Is(err, sealed.ErrNotSealed) {
		t.Errorf("plain record: %v, want ErrNotSealed", err)
	}
	// Chained with encryption: the id and the headers are sealed too.
	aead := mustNew(t, sealed.Keyring{Keys: map[string][]byte{"k1": key32(3)}, Current: "k1"})
	both := sealed.Chain(ref, aead)
	state["42"] = "now"
	st2, err := both.Seal(ctx, key, first)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Header != nil || bytes.Contains(st2.Body, []byte("/orders/42")) || bytes.Contains(st2.Body, []byte("ISR")) {
		t.Errorf("chained record shows the reference: %+v", st2)
	}
	if got, err := both.Open(ctx, key, st2); err != nil || string(got.Body) != "now" || got.Header.Get("Location") != "/orders/42" {
		t.Errorf("chained replay: %+v, %v", got, err)
	}
}
