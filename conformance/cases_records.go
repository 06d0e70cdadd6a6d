package conformance

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func (s *suite[Tx]) largeBody(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	body := make([]byte, 1<<20)
	_, _ = rand.Read(body)
	body[0], body[1], body[len(body)-1] = 0, 0xff, 0
	header := http.Header{
		"Content-Type": {"application/octet-stream"},
		"X-Multi":      {"one", "two"},
		"X-Utf8":       {"çé ✓"},
	}
	cases := []struct {
		name string
		body []byte
	}{{"1MiB", body}, {"empty", []byte{}}}
	for _, c := range cases {
		key := idempotency.Key{ID: uniq("k")}
		fn := func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, c.name); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusOK, Header: header, Body: c.body}, nil
		}
		first, err := g.Do(e.ctx, key, "fp", fn)
		if err != nil || first.Replayed || !bytes.Equal(first.Body, c.body) {
			t.Fatalf("%s body, first call: %v", c.name, err)
		}
		again, err := g.Do(e.ctx, key, "fp", fn)
		if err != nil || !again.Replayed {
			t.Fatalf("%s body, replay: got replayed=%v, %v", c.name, again.Replayed, err)
		}
		if !bytes.Equal(again.Body, c.body) {
			t.Fatalf("%s body must replay byte-exact: got %d bytes, want %d", c.name, len(again.Body), len(c.body))
		}
		if again.Status != http.StatusOK || !reflect.DeepEqual(again.Header, header) {
			t.Fatalf("%s replay: got status %d header %v, want 200 %v", c.name, again.Status, again.Header, header)
		}
		e.count(c.name, 1, c.name+" body")
	}
}

// arbitraryHeader has names and values that are not UTF-8, NUL bytes,
// empty values and many values per name, in an order to keep.
func arbitraryHeader() http.Header {
	many := make([]string, 40)
	for i := range many {
		many[i] = string(rune('z' - i%26))
	}
	many[7] = ""
	long := make([]byte, 8<<10)
	_, _ = rand.Read(long)
	return http.Header{
		"Content-Type":    {"application/json"},
		"X-Latin1":        {"caf\xe9"},
		"X-Nul":           {"a\x00b", "\x00"},
		"X-Ff":            {"\xff\xfe\xfd", "\xc3\x28"},
		"X-Empty":         {""},
		"X-Many":          many,
		"X-Crlf":          {"a\r\nb: c"},
		"x-not-canon":     {"lower"},
		"X-Name-\xe9\xff": {"name bytes"},
		"X-Binary":        {string(long)},
	}
}

func (s *suite[Tx]) headerBytes(t *testing.T) {
	e := s.setup(t, Options{})
	header := arbitraryHeader()
	sent := header.Clone()
	body := []byte("caf\xe9\x00\xff")
	key := idempotency.Key{ID: uniq("k")}
	// The answer reaches a caller waiting on another Guard, then a later
	// caller (read back).
	release := make(chan struct{})
	held := make(chan struct{})
	signal := closer(held) // fn may run again after a retried conflict
	hout := make(chan result, 1)
	go func() {
		r, err := e.guard(nil).Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			if err := e.f.Effect(e.ctx, tx, "hdr"); err != nil {
				return idempotency.Response{}, err
			}
			signal()
			<-release
			return idempotency.Response{Status: 599, Header: sent, Body: body}, nil
		})
		hout <- result{r, err}
	}()
	<-held
	wout := make(chan result, 1)
	go func() {
		r, err := e.guard(nil).Do(e.ctx, key, "fp", mustNotRun[Tx])
		wout <- result{r, err}
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	var h, w result
	within(t, 20*time.Second, "holder and waiter", func() { h, w = <-hout, <-wout })
	if h.err != nil {
		t.Fatalf("holder: %v", h.err)
	}
	later, err := e.guard(nil).Do(e.ctx, key, "fp", mustNotRun[Tx])
	for _, c := range []struct {
		name string
		r    result
	}{{"a caller waiting on another Guard", w}, {"a later caller", result{later, err}}} {
		if c.r.err != nil || !c.r.resp.Replayed {
			t.Fatalf("%s: got %v, replayed %v; want a replay", c.name, c.r.err, c.r.resp.Replayed)
		}
		if c.r.resp.Status != 599 || !bytes.Equal(c.r.resp.Body, body) {
			t.Fatalf("%s: got %d %q, want 599 %q", c.name, c.r.resp.Status, c.r.resp.Body, body)
		}
		if !reflect.DeepEqual(c.r.resp.Header, header) {
			for name, vs := range header {
				if got := c.r.resp.Header[name]; !reflect.DeepEqual(got, vs) {
					t.Fatalf("%s: header %q came back as %s, want %s byte-exact", c.name, name, short(got), short(vs))
				}
			}
			t.Fatalf("%s: header came back with names %s, want %s", c.name, short(slices.Sorted(maps.Keys(c.r.resp.Header))), short(slices.Sorted(maps.Keys(header))))
		}
	}
	e.count("hdr", 1, "one effect")
}

func (s *suite[Tx]) emptyBody(t *testing.T) {
	e := s.setup(t, Options{})
	g := e.guard(nil)
	cases := []struct {
		name   string
		header http.Header
		body   []byte
	}{
		{"nil", nil, nil},
		{"empty", http.Header{}, []byte{}},
		{"nil body, header", http.Header{"X-A": {"1"}}, nil},
	}
	for _, c := range cases {
		key := idempotency.Key{ID: uniq("k")}
		want := idempotency.Response{Status: http.StatusNoContent, Header: c.header, Body: c.body}
		first, err := g.Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
			return want, e.f.Effect(e.ctx, tx, "empty")
		})
		if err != nil || first.Replayed {
			t.Fatalf("%s: first call: %+v, %v", c.name, first, err)
		}
		again, err := e.guard(nil).Do(e.ctx, key, "fp", mustNotRun[Tx])
		if err != nil || !again.Replayed || !sameResponse(again, want) {
			t.Fatalf("%s: replay: got %d header %q body %q (nil %v), %v; want %d, %q and a zero-length body",
				c.name, again.Status, again.Header, again.Body, again.Body == nil, err, want.Status, want.Header)
		}
	}
	e.count("empty", len(cases), "one effect per key")
}

// clockSlack is how far apart the store's clock (a server's) and the test's
// may be when a case compares a record's times with the test's clock.
const clockSlack = time.Minute

func (s *suite[Tx]) recordOwnership(t *testing.T) {
	e := s.setup(t, Options{})
	key := idempotency.Key{ID: uniq("k")}
	body := []byte("original body")
	header := func() http.Header { return http.Header{"X-A": {"a1", "a2"}} }
	sent := idempotency.Response{Status: 201, Header: header(), Body: bytes.Clone(body)}
	// The case's clock window: the store's clock (the server's) reserved
	// the key within it, give or take clockSlack.
	from := time.Now().Truncate(time.Millisecond).Add(-clockSlack)
	if _, err := e.guard(nil).Do(e.ctx, key, "fp", func(tx Tx) (idempotency.Response, error) {
		return sent, e.f.Effect(e.ctx, tx, "own")
	}); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(clockSlack)
	want := idempotency.Response{Status: 201, Header: header(), Body: body}
	mutate := func(r *idempotency.Response) {
		if len(r.Body) > 0 {
			r.Body[0] ^= 0xff
		}
		if vs := r.Header["X-A"]; len(vs) > 0 {
			vs[0] = "changed"
		}
		if r.Header != nil {
			r.Header["X-New"] = []string{"added"}
		}
	}
	// What fn answered is the caller's: the store copied it.
	mutate(&sent)
	check := func(what string) {
		t.Helper()
		_, rec, err := e.f.Store.Reserve(e.ctx, reservation(key, 0))
		if err != nil || rec == nil {
			t.Fatalf("%s: Reserve of a completed key: %+v, %v", what, rec, err)
		}
		if c := rec.CreatedAt; c.IsZero() || c.After(rec.ExpiresAt) || c.Before(from) || c.After(until) {
			t.Fatalf("%s: CreatedAt %v: want it set, not after ExpiresAt %v, and within %v .. %v", what, c, rec.ExpiresAt, from, until)
		}
		if got := rec.Response(); !sameResponse(got, want) {
			t.Fatalf("%s: the stored record changed: got %q %q, want %q %q", what, got.Header, got.Body, want.Header, want.Body)
		}
		got := rec.Response()
		mutate(&got) // the caller changes what it was given
	}
	check("after the caller changed the response fn returned")
	check("after a caller changed the record it was given")
	check("again")

	// Callers waiting on other Guards get copies of their own.
	hkey := idempotency.Key{ID: uniq("held")}
	release, done := e.hold(e.guard(nil), hkey, "own-held")
	outs := make(chan result, 2)
	for range 2 {
		go func() {
			r, err := e.guard(nil).Do(e.ctx, hkey, "fp", mustNotRun[Tx])
			outs <- result{r, err}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	release()
	h := <-done
	var a, b result
	within(t, 20*time.Second, "two waiters", func() { a, b = <-outs, <-outs })
	if h.err != nil || a.err != nil || b.err != nil {
		t.Fatalf("holder %v, waiters %v, %v", h.err, a.err, b.err)
	}
	mutate(&a.resp)
	if !sameResponse(b.resp, h.resp) {
		t.Fatalf("a waiter's answer changed when another waiter changed its own: got %q %q, want %q %q",
			b.resp.Header, b.resp.Body, h.resp.Header, h.resp.Body)
	}
}

// short quotes v for a failure message, cut to a readable length.
func short(v any) string {
	s := fmt.Sprintf("%q", v)
	if len(s) > 200 {
		return s[:200] + fmt.Sprintf("... (%d bytes quoted)", len(s))
	}
	return s
}
