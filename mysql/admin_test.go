package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestInspect: every state, with exact fields, by the test clock; a new
// key held by an open Reserve is seen by the probe; the body only when
// asked for.
func TestInspect(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		s := f.store
		t0 := clock.Now()

		done := newKey("done")
		p := mustAcquire(t, ctx, s, acquisition(done, "o", 0))
		if err := p.Complete(ctx, idempotency.Response{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: []byte("body!")}); err != nil {
			t.Fatal(err)
		}
		unfinished(t, ctx, f, newKey("unfinished"), "u", false)
		unfinished(t, ctx, f, newKey("leased"), "l", true)

		for _, body := range []bool{false, true} {
			info, err := s.Inspect(ctx, done, body)
			if err != nil {
				t.Fatal(err)
			}
			wantBody := ""
			if body {
				wantBody = "body!"
			}
			if info.State != backend.KeyCompleted || info.Status != 201 || info.Header.Get("A") != "b" || info.BodyLen != 5 ||
				string(info.Body) != wantBody || !info.CreatedAt.Equal(t0) || !info.ExpiresAt.Equal(t0.Add(time.Hour)) || info.Fingerprint != "fp-done" || info.Progress != nil {
				t.Fatalf("body %v: %+v", body, info)
			}
		}
		info, err := s.Inspect(ctx, newKey("unfinished"), true)
		if err != nil || info.State != backend.KeyUnfinished || string(info.Progress) != "u" || info.Tries != 1 ||
			!info.LeaseEnds.Equal(t0) || !info.ExpiresAt.Equal(backend.MaxExpiry()) || info.Body != nil || info.Fingerprint != "fp-unfinished" {
			t.Fatalf("unfinished: %+v %v", info, err)
		}
		info, err = s.Inspect(ctx, newKey("leased"), false)
		if err != nil || info.State != backend.KeyInProgress || string(info.Progress) != "l" || info.Tries != 0 || !info.LeaseEnds.Equal(t0.Add(10*time.Second)) {
			t.Fatalf("leased: %+v %v", info, err)
		}
		// An unfinished key in an open phase: held, with its committed data.
		ph := mustAcquire(t, ctx, s, acquisition(newKey("unfinished"), "o", 0))
		info, err = s.Inspect(ctx, newKey("unfinished"), false)
		if err != nil || info.State != backend.KeyInProgress || string(info.Progress) != "u" {
			t.Fatalf("unfinished in a phase: %+v %v", info, err)
		}
		if err := ph.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// A new key held by an open Reserve: no committed row, seen by the
		// probe. On the MySQL path the probe first tries MySQL's syntax,
		// which MariaDB refuses: the refusal switches it.
		if v.dialect == dialectMySQL {
			s.shareSyntax.Store(true)
		}
		fresh := newKey("fresh")
		txn, _, err := s.Reserve(ctx, backend.Reservation{Key: fresh, Fingerprint: "fp", TTL: time.Hour})
		if err != nil || txn == nil {
			t.Fatalf("Reserve: %v", err)
		}
		info, err = s.Inspect(ctx, fresh, true)
		if err != nil || fmt.Sprint(*info) != fmt.Sprint(backend.KeyInfo{Key: fresh, State: backend.KeyInProgress}) {
			t.Fatalf("held by Reserve: %+v %v", info, err)
		}
		if s.shareSyntax.Load() {
			t.Fatal("the probe kept MySQL's syntax on MariaDB")
		}
		if err := txn.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inspect(ctx, fresh, false); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("after the Rollback: %v", err)
		}
		clock.Add(time.Hour)
		info, err = s.Inspect(ctx, done, false)
		if err != nil || info.State != backend.KeyExpired || info.BodyLen != 5 || info.Status != 201 {
			t.Fatalf("expired: %+v %v", info, err)
		}
	})
}

// TestForget: refused without waiting, and nothing changed, for a key held
// by an open Reserve, an open phase or a live lease; absent keys give
// ErrNotFound; a completed key forgotten runs fn again in Do; an
// unfinished key whose lease ended is deleted.
func TestForget(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		s := f.store
		refused := func(what string, k idempotency.Key) {
			t.Helper()
			before, _ := f.row(t, ctx, k)
			began := time.Now()
			info, err := s.Forget(ctx, k)
			if !errors.Is(err, idempotency.ErrInProgress) || info != nil {
				t.Fatalf("%s: %+v %v", what, info, err)
			}
			if d := time.Since(began); d > 500*time.Millisecond {
				t.Fatalf("%s: refused after %v", what, d)
			}
			if after, _ := f.row(t, ctx, k); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("%s: the row changed: %+v, was %+v", what, after, before)
			}
		}
		fresh := newKey("fresh")
		txn, _, err := s.Reserve(ctx, backend.Reservation{Key: fresh, Fingerprint: "fp", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		refused("open Reserve", fresh)
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatalf("Complete after the refused Forget: %v", err)
		}
		leased := newKey("leased")
		unfinished(t, ctx, f, leased, "l", true)
		refused("live lease", leased)
		open := newKey("open")
		unfinished(t, ctx, f, open, "o", false)
		ph := mustAcquire(t, ctx, s, acquisition(open, "o", 0))
		refused("open phase", open)
		if err := ph.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		info, err := s.Forget(ctx, open)
		if err != nil || info.State != backend.KeyUnfinished || string(info.Progress) != "o" || info.Tries != 1 {
			t.Fatalf("Forget of an unfinished key: %+v %v", info, err)
		}
		if _, ok := f.row(t, ctx, open); ok {
			t.Fatal("the unfinished row is still there")
		}
		if _, err := s.Forget(ctx, open); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Forget of a forgotten key: %v", err)
		}
		clock.Add(10 * time.Second) // the lease ends
		if info, err := s.Forget(ctx, leased); err != nil || info.State != backend.KeyUnfinished {
			t.Fatalf("Forget after the lease's end: %+v %v", info, err)
		}

		g, err := idempotency.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		k := newKey("do")
		do := func() idempotency.Response {
			t.Helper()
			resp, err := g.Do(ctx, k, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 200, Body: []byte("b")}, f.fx.Effect(ctx, tx, "do")
			})
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		do()
		if resp := do(); !resp.Replayed {
			t.Fatal("not replayed")
		}
		testkit.MustCount(t, ctx, f.fx.Count, "do", 1)
		info, err = s.Forget(ctx, k)
		if err != nil || info.State != backend.KeyCompleted || info.Status != 200 || info.BodyLen != 1 || info.Body != nil {
			t.Fatalf("Forget of a completed key: %+v %v", info, err)
		}
		if resp := do(); resp.Replayed {
			t.Fatal("replayed after Forget")
		}
		testkit.MustCount(t, ctx, f.fx.Count, "do", 2)
	})
}

// TestList: 7 keys of a scope (3 unfinished, one of them leased, 4
// completed or expired), pages of 3: the unfinished ones first, each part
// by id in byte order; other scopes are not listed.
func TestList(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		s := f.store
		complete := func(k idempotency.Key, ttl time.Duration) {
			a := acquisition(k, "o", 0)
			a.TTL = ttl
			p := mustAcquire(t, ctx, s, a)
			if err := p.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("body")}); err != nil {
				t.Fatal(err)
			}
		}
		complete(newKey("A"), time.Hour)
		complete(newKey("c"), time.Second) // expired below
		complete(newKey("e"), time.Hour)
		complete(newKey("g"), time.Hour)
		unfinished(t, ctx, f, newKey("b"), "pb", false)
		unfinished(t, ctx, f, newKey("d"), "pd", true)
		unfinished(t, ctx, f, newKey("f"), "pf", false)
		unfinished(t, ctx, f, idempotency.Key{Scope: "other", ID: "a"}, "x", false)
		complete(idempotency.Key{Scope: "other", ID: "z"}, time.Hour)
		clock.Add(time.Second)

		var pages []string
		var after *backend.ListCursor
		for range 5 {
			page, err := s.List(ctx, backend.ListQuery{Scope: "steps", Limit: 3, After: after})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, k := range page.Keys {
				ids = append(ids, fmt.Sprintf("%s:%v", k.Key.ID, k.State))
				if k.Body != nil || k.Key.Scope != "steps" {
					t.Errorf("key %+v", k)
				}
			}
			next := "end"
			if page.Next != nil {
				next = fmt.Sprintf("%v/%s", page.Next.Unfinished, page.Next.ID)
			}
			pages = append(pages, strings.Join(ids, " ")+" -> "+next)
			if after = page.Next; after == nil {
				break
			}
		}
		want := []string{
			"b:unfinished d:in_progress f:unfinished -> true/f",
			"A:completed c:expired e:completed -> false/e",
			"g:completed -> end",
		}
		if strings.Join(pages, "\n") != strings.Join(want, "\n") {
			t.Fatalf("pages:\n%s\nwant:\n%s", strings.Join(pages, "\n"), strings.Join(want, "\n"))
		}
		page, err := s.List(ctx, backend.ListQuery{Scope: "steps", Limit: 1000})
		if err != nil || len(page.Keys) != 7 || page.Next != nil {
			t.Fatalf("one page: %d keys, next %v, %v", len(page.Keys), page.Next, err)
		}
		if k := page.Keys[0]; string(k.Progress) != "pb" || k.Tries != 1 || k.Fingerprint != "fp-b" {
			t.Fatalf("first key %+v", k)
		}
		if k := page.Keys[3]; k.BodyLen != 4 || k.Status != 200 {
			t.Fatalf("a completed key %+v", k)
		}
		if page, err := s.List(ctx, backend.ListQuery{Scope: "none", Limit: 3}); err != nil || len(page.Keys) != 0 || page.Next != nil {
			t.Fatalf("empty scope: %+v %v", page, err)
		}
	})
}

// TestStats: exact counts by the test clock.
func TestStats(t *testing.T) {
	forVariants(t, func(t *testing.T, v stepVariant) {
		ctx := testkit.Context(t, 30*time.Second)
		clock := newStepClock()
		f := stepFixture(t, v, 0, clock)
		s := f.store
		if st, err := s.Stats(ctx); err != nil || st != (backend.Stats{}) {
			t.Fatalf("empty table: %+v %v", st, err)
		}
		t0 := clock.Now()
		unfinished(t, ctx, f, newKey("u1"), "p", false) // created t0, 1 try
		clock.Add(time.Minute)
		unfinished(t, ctx, f, newKey("h1"), "p", true) // held until t0+1m10s
		unfinished(t, ctx, f, newKey("h2"), "p", true)
		for i, ttl := range []time.Duration{time.Hour, time.Hour, time.Second} {
			a := acquisition(newKey(fmt.Sprint("c", i)), "o", 0)
			a.TTL = ttl
			p := mustAcquire(t, ctx, s, a)
			if err := p.Complete(ctx, idempotency.Response{Status: 200, Body: []byte(strings.Repeat("x", 10*(i+1)))}); err != nil {
				t.Fatal(err)
			}
		}
		clock.Add(5 * time.Second) // c2 expired, h1 and h2 still leased until t0+1m10s
		want := backend.Stats{InProgress: 2, Unfinished: 1, Completed: 2, Expired: 1, Failing: 1, OldestUnfinished: t0, BodyBytes: 30}
		if st, err := s.Stats(ctx); err != nil || st != want {
			t.Fatalf("stats %+v %v, want %+v", st, err, want)
		}
		clock.Add(5 * time.Second) // the leases end
		want.InProgress, want.Unfinished = 0, 3
		if st, err := s.Stats(ctx); err != nil || st != want {
			t.Fatalf("after the leases: %+v %v, want %+v", st, err, want)
		}
	})
}
