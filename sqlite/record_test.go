package sqlite_test

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestStoreRecord checks the stored record field by field: nanosecond
// times, nil versus empty body and header, binary bytes.
func TestStoreRecord(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	now := time.Unix(1_700_000_000, 123_456_789)
	f := openFixture(t, 1).clocked(t, func() time.Time { return now }) // a test clock: nanoseconds
	cases := []struct {
		name   string
		header http.Header
		body   []byte
	}{
		{"nil", nil, nil},
		{"empty", nil, []byte{}}, // an empty header is stored as none
		{"binary", http.Header{"X-A": {"1", "2"}}, []byte{0, 0xff, 0, 'a', 0}},
	}
	for _, c := range cases {
		key := idempotency.Key{Scope: "s", ID: c.name}
		txn, rec, err := f.store.Reserve(ctx, reservation(key, now, 0))
		if err != nil || txn == nil || rec != nil {
			t.Fatalf("%s: Reserve: %v, %v, %v; want a txn", c.name, txn, rec, err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 202, Header: c.header, Body: c.body}); err != nil {
			t.Fatalf("%s: Complete: %v", c.name, err)
		}
		if err := txn.Rollback(ctx); err == nil {
			t.Fatalf("%s: Rollback after Complete: got nil, want an error", c.name)
		}
		txn, rec, err = f.store.Reserve(ctx, reservation(key, now.Add(time.Minute), 0))
		if err != nil || txn != nil || rec == nil {
			t.Fatalf("%s: second Reserve: %v, %v, %v; want the record", c.name, txn, rec, err)
		}
		want := &backend.Record{Key: key, Fingerprint: "fp", Status: 202, Header: c.header, Body: c.body,
			CreatedAt: now.UTC(), ExpiresAt: now.Add(time.Hour).UTC()}
		if !reflect.DeepEqual(rec, want) {
			t.Fatalf("%s: record\n got %#v\nwant %#v", c.name, rec, want)
		}
	}
}
