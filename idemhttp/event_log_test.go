package idemhttp_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/observe"
)

// TestRequestEventLogValue: slog logs a RequestEvent, with the JSON and
// the text handlers, by its key's hash and its safe fields, never the
// key's scope or id.
func TestRequestEventLogValue(t *testing.T) {
	const scope, id = "acct_42_scope_secret", "secret-key-id-9f2c"
	key := idempotency.Key{Scope: scope, ID: id}
	ev := idemhttp.RequestEvent{
		Key: key, Method: "POST", Route: "/orders", Outcome: observe.Replayed, Status: 201,
		Duration: 3 * time.Millisecond, Waited: time.Millisecond, RecordAge: 2 * time.Second,
		Err: errors.New("boom"),
	}
	for name, newHandler := range map[string]func(*bytes.Buffer) slog.Handler{
		"json": func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		"text": func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var buf bytes.Buffer
		slog.New(newHandler(&buf)).Info("request", "event", ev)
		out := buf.String()
		if !strings.Contains(out, key.Hash()) {
			t.Errorf("%s: no key hash %q in %s", name, key.Hash(), out)
		}
		for _, s := range []string{scope, id, "acct_42", "secret-key-id"} {
			if strings.Contains(out, s) {
				t.Errorf("%s: the log shows %q of the key: %s", name, s, out)
			}
		}
		for _, s := range []string{"key_hash", "POST", "/orders", "replayed", "201", "record_age", "boom"} {
			if !strings.Contains(out, s) {
				t.Errorf("%s: no %q in %s", name, s, out)
			}
		}
	}
}
