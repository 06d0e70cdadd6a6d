package sealed_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sealed"
)

// FuzzOpen: Open of any stored record, by the AES-GCM codec, the
// reference codec and their chain, never panics and fails only with the
// package's typed errors; what opens seals and opens again to the same
// answer.
func FuzzOpen(f *testing.F) {
	ctx := context.Background()
	aead := mustNew(f, sealed.Keyring{Keys: map[string][]byte{"k1": key32(1), "k2": key32(2)}, Current: "k1"})
	ref, err := sealed.NewReference(sealed.Reference{
		Headers:    []string{"Location"},
		ResourceID: func(r idempotency.Response) (string, error) { return r.Header.Get("Location"), nil },
		Render: func(_ context.Context, _ idempotency.Key, id string) (idempotency.Response, error) {
			return idempotency.Response{Body: []byte(id)}, nil
		},
	})
	if err != nil {
		f.Fatal(err)
	}
	chain := sealed.Chain(ref, aead)
	key := idempotency.Key{Scope: "s", ID: "i"}
	resp := idempotency.Response{Status: 201, Header: http.Header{"Location": {"/r/1"}, "X": {"a", "b"}}, Body: []byte("body")}
	for _, c := range []idempotency.Codec{aead, ref, chain} {
		st, err := c.Seal(ctx, key, resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(st.Body, st.Status)
	}
	f.Add([]byte("\x00ISA\x02k3"+"............................"), 200)
	f.Add([]byte("\x00ISR\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), 200)
	f.Add([]byte("plain"), 200)
	f.Fuzz(func(t *testing.T, body []byte, status int) {
		stored := idempotency.Response{Status: status, Body: body}
		for i, c := range []idempotency.Codec{aead, ref, chain} {
			r, err := c.Open(ctx, key, stored)
			if err != nil {
				if !errors.Is(err, sealed.ErrCorrupt) && !errors.Is(err, sealed.ErrUnknownKey) && !errors.Is(err, sealed.ErrNotSealed) {
					t.Fatalf("codec %d: untyped error %v", i, err)
				}
				continue
			}
			if i != 0 || r.Status < 100 || r.Status > 599 {
				continue // a reference renders; only the AES-GCM codec round-trips
			}
			st, err := aead.Seal(ctx, key, r)
			if err != nil {
				t.Fatal(err)
			}
			r2, err := aead.Open(ctx, key, st)
			if err != nil || !reflect.DeepEqual(r, r2) {
				t.Fatalf("round trip %+v -> %+v, %v", r, r2, err)
			}
		}
	})
}
