package idemhttp_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/idemhttp"
)

// TestUUIDKeyMessage: a key UUIDKey refuses is answered 400
// ProblemInvalidKey whose detail says what is wrong and asks for a UUID,
// and nothing else: it said "want 36; send 1 to 255 printable ASCII
// characters", which contradicts itself.
func TestUUIDKeyMessage(t *testing.T) {
	t.Parallel()
	h := idemhttp.Middleware[any](nil, &idemhttp.Options{Scope: idemhttp.SharedScope, ValidateKey: idemhttp.UUIDKey})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }))
	const ask = "; send a UUID: 36 characters, 8-4-4-4-12 hexadecimal digits, such as 8e03978e-40d5-43e8-bc93-6894a57f9324."
	for key, why := range map[string]string{
		strings.Repeat("k", 54):                "The key is 54 bytes, not the 36 of a UUID",
		"1":                                    "The key is 1 byte, not the 36 of a UUID",
		"8e03978e-40d5-43e8-bc93-6894a57f932x": "The key has 'x' at byte 35, not a hexadecimal digit",
		"8e03978e+40d5-43e8-bc93-6894a57f9324": "The key has '+' at byte 8, where a UUID has '-'",
	} {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var p idemhttp.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%q: answer %d %q: %v", key, rec.Code, rec.Body.Bytes(), err)
		}
		if rec.Code != http.StatusBadRequest || p.Type != idemhttp.ProblemInvalidKey || p.Detail != why+ask {
			t.Errorf("%q: %d %s %q\nwant 400 %s %q", key, rec.Code, p.Type, p.Detail, idemhttp.ProblemInvalidKey, why+ask)
		}
		if strings.Contains(p.Detail, "255") {
			t.Errorf("%q: the detail offers any key: %q", key, p.Detail)
		}
	}
	err := idemhttp.UUIDKey("nope")
	var p *idemhttp.Problem
	if !errors.As(err, &p) || p.Status != http.StatusBadRequest {
		t.Errorf("UUIDKey(nope) = %v, want a 400 *Problem", err)
	}
	if err := idemhttp.UUIDKey(idemhttp.NewKeyID()); err != nil {
		t.Errorf("UUIDKey(NewKey()) = %v", err)
	}
}
