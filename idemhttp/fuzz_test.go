package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/canonical"
	"github.com/go-idempotency/idempotency/observe"
)

// The fuzz targets of idemhttp's parsers, so that the next edge case is
// found by a machine. Their corpora are in testdata/fuzz/<target>; CI runs
// each for a bounded time:
//
//	go test -run '^$' -fuzz '^FuzzParseKey$' -fuzztime 20s ./idemhttp/
//	go test -run '^$' -fuzz '^FuzzKeyHeader$' -fuzztime 20s ./idemhttp/
//	go test -run '^$' -fuzz '^FuzzRetryAfter$' -fuzztime 20s ./idemhttp/
//	go test -run '^$' -fuzz '^FuzzIsInProgress$' -fuzztime 20s ./idemhttp/
//	go test -run '^$' -fuzz '^FuzzIgnoreFields$' -fuzztime 20s ./idemhttp/
//	go test -run '^$' -fuzz '^FuzzUUIDKey$' -fuzztime 20s ./idemhttp/
//
// A plain go test runs every corpus entry.

// sfStringRe is the sf-string grammar of RFC 8941 section 3.3.3.
var sfStringRe = regexp.MustCompile(`^"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"$`)

// unescapeSF reports whether s is an sf-string and returns its value, by
// the grammar rather than by parseKey's loop.
func unescapeSF(s string) (string, bool) {
	if !sfStringRe.MatchString(s) {
		return "", false
	}
	return strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(s[1 : len(s)-1]), true
}

// FuzzParseKey: parseKey never panics; a refused value gets an error
// wrapping idempotency.ErrInvalidKey; a quoted value is accepted exactly
// when it is an sf-string, with the sf-string's value; a bare value is
// taken as it is (spaces and tabs trimmed); an accepted id that is a valid
// key round-trips through quoteKey, the form the Client sends.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`abc`, `"abc"`, ` "a\"b\\c" `, `"abc`, `"abc"x`, `"a\nb"`, `"a\`, "\"a\x01\"", `"abc";p=1`, `""`, "", "\t\t", `"\\"`, `a"b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		id, err := parseKey(v)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidKey) {
				t.Fatalf("parseKey(%q): %v, does not wrap idempotency.ErrInvalidKey", v, err)
			}
			if id != "" {
				t.Fatalf("parseKey(%q) refused with an id %q", v, id)
			}
		}
		trimmed := strings.Trim(v, " \t")
		if strings.HasPrefix(trimmed, `"`) {
			want, ok := unescapeSF(trimmed)
			if ok != (err == nil) || id != want {
				t.Fatalf("parseKey(%q) = %q, %v; the sf-string grammar says %q, %v", v, id, err, want, ok)
			}
		} else if err != nil || id != trimmed {
			t.Fatalf("parseKey(%q) = %q, %v; want the bare value %q", v, id, err, trimmed)
		}
		if err != nil || (idempotency.Key{ID: id}).Validate() != nil {
			return
		}
		q := quoteKey(id)
		if _, ok := unescapeSF(q); !ok {
			t.Fatalf("quoteKey(%q) = %q, not an sf-string", id, q)
		}
		if back, err := parseKey(q); err != nil || back != id {
			t.Fatalf("parseKey(quoteKey(%q)) = %q, %v", id, back, err)
		}
	})
}

// FuzzKeyHeader sends one or two key header values (of the default header
// or X-Idempotency-Key, with or without UUIDKey) through Middleware on a nil
// Guard: the answer is 400 ProblemInvalidKey, with an RequestEvent whose Err
// wraps idempotency.ErrInvalidKey, exactly when the header is refused by
// parseKey, Key.Validate or the validator; otherwise the key got through
// to the guard (500 ProblemInternal, for the nil guard) with its parsed id
// in the RequestEvent. The handler never runs.
func FuzzKeyHeader(f *testing.F) {
	f.Add("abc", "", false, false)
	f.Add(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "", true, true)
	f.Add("a", "b", false, false)
	f.Add(`"x`, "", true, false)
	f.Add(strings.Repeat("k", 256), "", false, true)
	f.Fuzz(func(t *testing.T, v1, v2 string, otherHeader, uuid bool) {
		opts := &Options{Scope: SharedScope} // the key header is what is fuzzed
		name := DefaultKeyHeader
		if otherHeader {
			name, opts.KeyHeader = "X-Idempotency-Key", "x-idempotency-key"
		}
		if uuid {
			opts.ValidateKey = UUIDKey
		}
		var ev RequestEvent
		opts.Observer = func(_ context.Context, e RequestEvent) { ev = e }
		h := Middleware[any](nil, opts)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			t.Fatal("the handler ran on a nil guard")
		}))
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header[name] = []string{v1}
		if v2 != "" {
			req.Header[name] = append(req.Header[name], v2)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		id, err := parseKey(v1)
		if err == nil {
			err = idempotency.Key{ID: id}.Validate()
		}
		if err == nil && uuid {
			err = UUIDKey(id)
		}
		refused := v2 != "" || err != nil
		var p Problem
		if jerr := json.Unmarshal(rec.Body.Bytes(), &p); jerr != nil {
			t.Fatalf("answer %d %q is not a problem: %v", rec.Code, rec.Body.Bytes(), jerr)
		}
		if refused {
			if rec.Code != http.StatusBadRequest || p.Type != problemInvalidKey || ev.Outcome != observe.Rejected || !errors.Is(ev.Err, idempotency.ErrInvalidKey) {
				t.Fatalf("%q %q: %d %s, event %+v; want 400 %s with an error wrapping ErrInvalidKey", v1, v2, rec.Code, p.Type, ev, problemInvalidKey)
			}
			return
		}
		if rec.Code != http.StatusInternalServerError || p.Type != problemInternal || ev.Key.ID != id || ev.Outcome != observe.Internal {
			t.Fatalf("%q: %d %s, event %+v; want the key %q through to the (nil) guard", v1, rec.Code, p.Type, ev, id)
		}
	})
}

// FuzzRetryAfter: retryAfter never panics and never gives a negative wait;
// it accepts exactly delay-seconds (digits, surrounding spaces ignored)
// and HTTP-dates, with their meaning; the client's delay stays within
// MaxDelay whenever it allows a retry.
func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, s := range []string{"0", "7", " 120 ", "-1", "1.5", "soon", "", "99999999999999999999",
		now.Add(30 * time.Second).Format(http.TimeFormat), "Friday, 02-Jan-26 03:04:15 GMT", "Fri Jan  2 03:04:15 2026"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := retryAfter(v, now)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("retryAfter(%q) = %v, %v", v, d, ok)
		}
		s := strings.TrimSpace(v)
		n, nerr := strconv.ParseUint(s, 10, 63)
		_, terr := http.ParseTime(s)
		switch {
		case nerr == nil:
			if !ok || (n < 1<<32 && d != time.Duration(n)*time.Second) {
				t.Fatalf("retryAfter(%q) = %v, %v; want %d s", v, d, ok, n)
			}
		case terr == nil:
			if !ok {
				t.Fatalf("retryAfter(%q) refused an HTTP-date", v)
			}
		case ok:
			t.Fatalf("retryAfter(%q) = %v, accepted neither seconds nor an HTTP-date", v, d)
		}
		p := &Transport{BaseDelay: time.Millisecond, MaxDelay: time.Second}
		resp := &http.Response{Header: http.Header{"Retry-After": {v}}}
		if w, allowed := p.delay(3, resp, now); w < 0 || (allowed && w > time.Second) {
			t.Fatalf("delay with Retry-After %q = %v, %v; want 0..MaxDelay when allowed", v, w, allowed)
		}
	})
}

// FuzzIsInProgress: IsInProgress never panics, leaves the body exactly as
// the server sent it for the caller to read, and says true only for a 409
// problem+json whose type is ProblemInProgress.
func FuzzIsInProgress(f *testing.F) {
	f.Add(problemContentType, []byte(`{"type":"`+ProblemInProgress+`","status":409}`))
	f.Add("application/problem+json; charset=utf-8", []byte(`{"type":"https://shop.example/captured"}`))
	f.Add("application/json", []byte(`{"type":"`+ProblemInProgress+`"}`))
	f.Add(problemContentType, []byte(`{"type":`))
	f.Add(problemContentType, bytes.Repeat([]byte(" "), 70<<10))
	f.Fuzz(func(t *testing.T, ctype string, body []byte) {
		resp := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{"Content-Type": {ctype}},
			Body: io.NopCloser(bytes.NewReader(body))}
		got := isInProgress(resp)
		rest, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(rest, body) {
			t.Fatalf("the body after isInProgress is %q (%v), want the %d bytes sent", rest, err, len(body))
		}
		if !got {
			return
		}
		var p struct {
			Type string `json:"type"`
		}
		head := body[:min(len(body), 64<<10)] // what isInProgress reads
		if json.Unmarshal(head, &p) != nil || p.Type != ProblemInProgress || !strings.Contains(strings.ToLower(ctype), problemContentType) {
			t.Fatalf("IsInProgress(%q, %q) = true", ctype, body)
		}
	})
}

// FuzzIgnoreFields: dropping fields from a canonical JSON value never
// panics, gives canonical JSON (or an error wrapping ErrInvalidJSON), is
// idempotent, and never changes a value that is not an object.
func FuzzIgnoreFields(f *testing.F) {
	f.Add([]byte(`{"amount":5,"sent_at":"10:00","meta":{"trace":"a","v":1}}`), "meta.trace")
	f.Add([]byte(`[1,{"a":2}]`), "a")
	f.Add([]byte(`{"a":{"b":{"c":1}}}`), "a.b.c")
	f.Add([]byte(`{"a":1e400}`), "b")
	f.Add([]byte(`{"":1}`), "")
	f.Fuzz(func(t *testing.T, body []byte, field string) {
		canon, err := canonical.JSON(body)
		if err != nil {
			return
		}
		paths := [][]string{strings.Split(field, ".")}
		out, err := dropFields(canon, paths)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidBody) {
				t.Fatalf("dropFields(%q, %q): %v, not ErrInvalidJSON", canon, field, err)
			}
			return
		}
		if again, err := canonical.JSON(out); err != nil || !bytes.Equal(again, out) {
			t.Fatalf("dropFields(%q, %q) = %q, not canonical (%v)", canon, field, out, err)
		}
		if twice, err := dropFields(out, paths); err != nil || !bytes.Equal(twice, out) {
			t.Fatalf("dropFields twice on %q: %q then %q (%v)", canon, out, twice, err)
		}
		if len(canon) > 0 && canon[0] != '{' && !bytes.Equal(out, canon) {
			t.Fatalf("dropFields changed the non-object %q into %q", canon, out)
		}
	})
}

// FuzzUUIDKey: UUIDKey never panics and accepts exactly the 8-4-4-4-12
// hexadecimal form; every NewKeyID is accepted.
func FuzzUUIDKey(f *testing.F) {
	f.Add("8e03978e-40d5-43e8-bc93-6894a57f9324")
	f.Add("8E03978E-40D5-43E8-BC93-6894A57F9324")
	f.Add("8e03978e-40d5-43e8-bc93-6894a57f932x")
	f.Add("8e03978e40d543e8bc936894a57f93240000")
	f.Add(NewKeyID())
	re := regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	f.Fuzz(func(t *testing.T, id string) {
		if err := UUIDKey(id); (err == nil) != re.MatchString(id) {
			t.Fatalf("UUIDKey(%q) = %v", id, err)
		}
		if err := UUIDKey(NewKeyID()); err != nil {
			t.Fatal(err)
		}
	})
}
