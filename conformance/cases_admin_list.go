package conformance

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// lister returns the fixture's store as a KeyLister, or skips the case.
func (e *env[Tx]) lister() backend.KeyLister {
	e.t.Helper()
	ls, ok := e.f.Store.(backend.KeyLister)
	if !ok {
		e.lacking("KeyLister")
	}
	return ls
}

// listIDs are the completed keys of AdminList: byte order (A < B < _ < a <
// b) differs from any case-insensitive or accent-aware collation's.
var listIDs = []string{"b", "a", "_", "B", "A"}

// adminList: pages of a scope's keys, unfinished and held first, each
// part in byte order of ID, every key once, with cursors; other scopes'
// keys never listed.
func (s *suite[Tx]) adminList(t *testing.T) {
	s.need(t, "KeyLister")
	e := s.setup(t, Options{})
	ls := e.lister()
	scope := uniq("list")
	g := e.guard(nil)
	resp := adminResp(50)
	for _, id := range listIDs {
		e.complete(g, idempotency.Key{Scope: scope, ID: id}, "list", resp)
	}
	for _, id := range append([]string{"0", "C", "y"}, listIDs...) {
		e.complete(g, idempotency.Key{Scope: scope + "-other", ID: id}, "other", resp)
		e.complete(g, idempotency.Key{Scope: strings.ToUpper(scope), ID: id}, "other", resp)
	}
	want := []string{"A", "B", "_", "a", "b"}
	first := 0 // how many keys are in the first part
	states := map[string]backend.KeyState{}
	for _, id := range want {
		states[id] = backend.KeyCompleted
	}
	if st, ok := e.f.Store.(backend.Stepper[Tx]); ok {
		p := e.phase(st, stepAcq(idempotency.Key{Scope: scope, ID: "y"}, "owner-a"), "a new key")
		if err := p.Release(e.ctx, []byte("y")); err != nil {
			t.Fatalf("Release: %v", err)
		}
		p = e.phase(st, stepAcq(idempotency.Key{Scope: scope, ID: "C"}, "owner-a"), "a new key")
		if err := p.Save(e.ctx, []byte("C")); err != nil {
			t.Fatalf("Save: %v", err)
		}
		want, first = append([]string{"C", "y"}, want...), 2
		states["C"], states["y"] = backend.KeyInProgress, backend.KeyUnfinished
	}
	list := func(q backend.ListQuery) backend.KeyPage {
		t.Helper()
		var (
			page backend.KeyPage
			err  error
		)
		within(t, 10*time.Second, "List", func() { page, err = ls.List(e.ctx, q) })
		if err != nil {
			t.Fatalf("List(limit %d, after %+v): %v", q.Limit, q.After, err)
		}
		return page
	}
	for _, limit := range []int{3, 2, 1, len(want), 1000} {
		var got []string
		q := backend.ListQuery{Scope: scope, Limit: limit}
		for pages := 0; ; pages++ {
			if pages > len(want) {
				t.Fatalf("List with limit %d: more than %d pages for %d keys", limit, len(want), len(want))
			}
			page := list(q)
			if len(page.Keys) > limit {
				t.Fatalf("List with limit %d: a page of %d keys", limit, len(page.Keys))
			}
			for _, k := range page.Keys {
				id := k.Key.ID
				got = append(got, id)
				switch {
				case k.Key.Scope != scope:
					t.Fatalf("List of scope %q gave a key of scope %q", scope, k.Key.Scope)
				case k.State != states[id]:
					t.Fatalf("List: key %q is %v, want %v", id, k.State, states[id])
				case len(k.Body) != 0:
					t.Fatalf("List: key %q came with its body: bodies are not read", id)
				case k.State == backend.KeyCompleted && (k.Status != resp.Status || k.Fingerprint != "fp-admin"):
					t.Fatalf("List: completed key %q: status %d, fingerprint %q", id, k.Status, k.Fingerprint)
				case k.State != backend.KeyCompleted && !bytes.Equal(k.Progress, []byte(id)):
					t.Fatalf("List: unfinished key %q: progress %s", id, showBytes(k.Progress))
				}
			}
			last := len(got) == len(want)
			switch {
			case len(got) > len(want):
				t.Fatalf("List with limit %d gave %q, want %q", limit, got, want)
			case last && page.Next != nil:
				t.Fatalf("List with limit %d: the last page (%q) has Next %+v, want nil", limit, got, page.Next)
			case !last && page.Next == nil:
				t.Fatalf("List with limit %d: Next is nil after %q, want the rest of %q", limit, got, want)
			case !last && (len(page.Keys) != limit || *page.Next != backend.ListCursor{Unfinished: len(got) <= first, ID: got[len(got)-1]}):
				t.Fatalf("List with limit %d: a page of %d keys ending at %q with Next %+v", limit, len(page.Keys), got[len(got)-1], page.Next)
			}
			if last {
				break
			}
			q.After = page.Next
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("List with limit %d: %q, want %q (unfinished and held first, then byte order of ID)", limit, got, want)
		}
	}
	// A cursor at a key no longer there (forgotten between two pages).
	for _, c := range []struct {
		after backend.ListCursor
		want  []string
	}{
		{backend.ListCursor{ID: "AA"}, []string{"B", "_", "a", "b"}},
		{backend.ListCursor{ID: "b"}, nil},
		{backend.ListCursor{Unfinished: true, ID: "D"}, want[first-min(first, 1):]},
	} {
		page := list(backend.ListQuery{Scope: scope, Limit: 1000, After: &c.after})
		var got []string
		for _, k := range page.Keys {
			got = append(got, k.Key.ID)
		}
		if strings.Join(got, " ") != strings.Join(c.want, " ") || page.Next != nil {
			t.Fatalf("List after %+v: %q (Next %+v), want %q", c.after, got, page.Next, c.want)
		}
	}
	if page := list(backend.ListQuery{Scope: uniq("empty"), Limit: 10}); len(page.Keys) != 0 || page.Next != nil {
		t.Fatalf("List of a scope with no keys: %+v", page)
	}
	for _, limit := range []int{0, -1, 1001} {
		var err error
		within(t, 10*time.Second, "List", func() { _, err = ls.List(e.ctx, backend.ListQuery{Scope: scope, Limit: limit}) })
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Fatalf("List with Limit %d: got %v, want an error wrapping ErrInvalidConfig", limit, err)
		}
	}
}

// adminStats: exact counts by state, by the store's clock, on a fixture
// of the case's own.
func (s *suite[Tx]) adminStats(t *testing.T) {
	s.need(t, "KeyLister")
	clk := newClock()
	e := s.setupClock(t, Options{}, clk)
	ls := e.lister()
	stats := func(want backend.Stats, what string) {
		t.Helper()
		var (
			got backend.Stats
			err error
		)
		within(t, 10*time.Second, "Stats", func() { got, err = ls.Stats(e.ctx) })
		if err != nil {
			t.Fatalf("Stats, %s: %v", what, err)
		}
		if got.OldestUnfinished.Equal(want.OldestUnfinished) {
			got.OldestUnfinished = want.OldestUnfinished
		}
		if got != want {
			t.Fatalf("Stats, %s:\n got %+v\nwant %+v", what, got, want)
		}
	}
	stats(backend.Stats{}, "of an empty store")
	t0 := clk.Now()
	short := e.guard(&idempotency.Config{TTL: time.Minute})
	long := e.guard(&idempotency.Config{TTL: time.Hour})
	e.complete(short, idempotency.Key{ID: uniq("expired")}, "stats", adminResp(7))
	for _, n := range []int{10, 0, 100} {
		e.complete(long, idempotency.Key{ID: uniq("done")}, "stats", adminResp(n))
	}
	stats(backend.Stats{Completed: 4, BodyBytes: 117}, "4 completed keys")
	clk.Add(2 * time.Minute)
	want := backend.Stats{Completed: 3, Expired: 1, BodyBytes: 110}
	stats(want, "3 completed keys and 1 expired")
	st, ok := e.f.Store.(backend.Stepper[Tx])
	if !ok {
		return
	}
	// failing: released once at t0+2m; held: its lease lives; idle: its
	// lease ran out, never released.
	failing, held, idle := idempotency.Key{ID: uniq("failing")}, idempotency.Key{ID: uniq("held")}, idempotency.Key{ID: uniq("idle")}
	p := e.phase(st, stepAcq(failing, "owner-a"), "a new key")
	if err := p.Release(e.ctx, []byte("failing")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	clk.Add(time.Minute)
	p = e.phase(st, stepAcq(idle, "owner-a"), "a new key")
	if err := p.Save(e.ctx, []byte("idle")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	clk.Add(stepLease)
	p = e.phase(st, stepAcq(held, "owner-a"), "a new key")
	if err := p.Save(e.ctx, []byte("held")); err != nil {
		t.Fatalf("Save: %v", err)
	}
	want.InProgress, want.Unfinished, want.Failing, want.OldestUnfinished = 1, 2, 1, t0.Add(2*time.Minute)
	stats(want, "with 1 key held by its lease and 2 unfinished, 1 of them failing")
	clk.Set(t0.Add(time.Hour))
	want.InProgress, want.Unfinished, want.Completed, want.Expired, want.BodyBytes = 0, 3, 0, 4, 0
	stats(want, "an hour on: every lease ended, every completed key expired")
}
