package postgres_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// complete stores a completed record for key with body through Do, and
// fails t unless fn ran.
func (f *stepFixture) complete(t testing.TB, ctx context.Context, ttl time.Duration, key idempotency.Key, body string) {
	t.Helper()
	g := f.guard(t, &idempotency.Config{TTL: ttl})
	r, err := g.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Header: http.Header{"X-H": {"v"}}, Body: []byte(body)}, f.effect(ctx, tx, "done:"+key.ID)
	})
	if err != nil || r.Replayed {
		t.Fatalf("Do(%v): %+v, %v; want a run", key, r, err)
	}
}

// reserve holds key in an open transaction of Reserve, rolled back at
// cleanup unless the test rolls it back first.
func reserve(t testing.TB, ctx context.Context, s *postgres.Store, key idempotency.Key) backend.Txn[pgx.Tx] {
	t.Helper()
	txn, rec, err := s.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour})
	if err != nil || rec != nil || txn == nil {
		t.Fatalf("Reserve(%v): %v, %v, %v; want a reservation", key, txn, rec, err)
	}
	t.Cleanup(func() { _ = txn.Rollback(context.Background()) })
	return txn
}

// mustInfo fails t unless got is want.
func mustInfo(t testing.TB, what string, got *backend.KeyInfo, err error, want backend.KeyInfo) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(got.Header) == 0 && len(want.Header) == 0 {
		got.Header = want.Header
	}
	if !reflect.DeepEqual(*got, want) || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, *got, want)
	}
}

// utc puts every time of in in UTC, as the wanted values are.
func utc(in *backend.KeyInfo) *backend.KeyInfo {
	if in == nil {
		return nil
	}
	for _, p := range []*time.Time{&in.CreatedAt, &in.ExpiresAt, &in.LeaseEnds} {
		if !p.IsZero() {
			*p = p.UTC()
		}
	}
	return in
}

// TestInspect reports every state of a key, with its body only when
// asked, and a key held by an open transaction (a new one included, whose
// row does not exist yet) as held, without waiting for it.
func TestInspect(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  postgres.Config
	}{
		{"ReadCommitted", postgres.Config{}},
		{"Serializable", postgres.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			f := newStepFixture(t, c.cfg, 4)
			s := f.store
			key := func(id string) idempotency.Key { return idempotency.Key{Scope: "s", ID: id} }
			if _, err := s.Inspect(ctx, key("absent"), true); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("Inspect of an absent key: %v, want ErrNotFound", err)
			}

			f.complete(t, ctx, time.Hour, key("c"), "hello")
			completed := backend.KeyInfo{Key: key("c"), State: backend.KeyCompleted, Fingerprint: "fp", Status: 201,
				Header: http.Header{"X-H": {"v"}}, BodyLen: 5, CreatedAt: at(0), ExpiresAt: at(time.Hour)}
			in, err := s.Inspect(ctx, key("c"), false)
			mustInfo(t, "completed, no body", utc(in), err, completed)
			in, err = s.Inspect(ctx, key("c"), true)
			completed.Body = []byte("hello")
			mustInfo(t, "completed, body", utc(in), err, completed)

			if err := mustPhase(t, ctx, s, acq("u", "o")).Save(ctx, []byte("p1")); err != nil {
				t.Fatal(err)
			}
			unfinished := backend.KeyInfo{Key: key("u"), State: backend.KeyInProgress, Fingerprint: "fp",
				CreatedAt: at(0), ExpiresAt: maxExpiry, Progress: []byte("p1"), LeaseEnds: at(10 * time.Second)}
			in, err = s.Inspect(ctx, key("u"), true)
			mustInfo(t, "live lease", utc(in), err, unfinished)

			f.set(20 * time.Second)
			unfinished.State = backend.KeyUnfinished
			in, err = s.Inspect(ctx, key("u"), true)
			mustInfo(t, "lease ended", utc(in), err, unfinished)

			// A phase open on it (its lease not yet written): held.
			p := mustPhase(t, ctx, s, acq("u", "o2"))
			unfinished.State = backend.KeyInProgress
			in, err = s.Inspect(ctx, key("u"), false)
			mustInfo(t, "phase open", utc(in), err, unfinished)
			if err := p.Release(ctx, []byte("p2")); err != nil {
				t.Fatal(err)
			}
			unfinished.State, unfinished.Progress, unfinished.Tries, unfinished.LeaseEnds = backend.KeyUnfinished, []byte("p2"), 1, at(20*time.Second)
			in, err = s.Inspect(ctx, key("u"), false)
			mustInfo(t, "released", utc(in), err, unfinished)

			// A new key held by Reserve's open transaction, told at once.
			txn := reserve(t, ctx, s, key("n"))
			start := time.Now()
			in, err = s.Inspect(ctx, key("n"), true)
			mustInfo(t, "new key held", in, err, backend.KeyInfo{Key: key("n"), State: backend.KeyInProgress})
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("Inspect of a held key took %v", d)
			}
			if err := txn.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Inspect(ctx, key("n"), true); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("Inspect after the rollback: %v, want ErrNotFound", err)
			}

			// Expired, then taken over by an open transaction.
			f.set(2 * time.Hour)
			completed.State = backend.KeyExpired
			in, err = s.Inspect(ctx, key("c"), true)
			mustInfo(t, "expired", utc(in), err, completed)
			reserve(t, ctx, s, key("c"))
			in, err = s.Inspect(ctx, key("c"), true)
			mustInfo(t, "expired, taken over", in, err, backend.KeyInfo{Key: key("c"), State: backend.KeyInProgress})
		})
	}
}

// TestForget deletes a completed, expired or abandoned key and returns what
// it held; it refuses at once, changing nothing, a key held by an open
// transaction or a live lease.
func TestForget(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 4)
	s := f.store
	key := func(id string) idempotency.Key { return idempotency.Key{Scope: "s", ID: id} }
	if _, err := s.Forget(ctx, key("absent")); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Forget of an absent key: %v, want ErrNotFound", err)
	}

	// Completed: deleted, and Do runs fn again.
	f.complete(t, ctx, time.Hour, key("c"), "hello")
	in, err := s.Forget(ctx, key("c"))
	mustInfo(t, "Forget completed", utc(in), err, backend.KeyInfo{Key: key("c"), State: backend.KeyCompleted, Fingerprint: "fp",
		Status: 201, Header: http.Header{"X-H": {"v"}}, BodyLen: 5, CreatedAt: at(0), ExpiresAt: at(time.Hour)})
	if _, ok := f.row(t, ctx, "c"); ok {
		t.Fatal("forgotten key still has a row")
	}
	f.complete(t, ctx, time.Hour, key("c"), "again")
	testkit.MustCount(t, ctx, f.count, "done:c", 2)
	if _, err := s.Forget(ctx, key("absent")); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Forget of an absent key: %v, want ErrNotFound", err)
	}

	refused := func(id, what string) {
		t.Helper()
		before, had := f.row(t, ctx, id)
		start := time.Now()
		if in, err := s.Forget(ctx, key(id)); !errors.Is(err, idempotency.ErrInProgress) || in != nil {
			t.Fatalf("Forget of %s: %v, %v; want ErrInProgress", what, in, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Forget of %s took %v: it waited", what, d)
		}
		after, has := f.row(t, ctx, id)
		if had != has || !reflect.DeepEqual(before, after) {
			t.Fatalf("Forget of %s changed the row: %+v (%v) to %+v (%v)", what, before, had, after, has)
		}
	}

	// A new key held by Reserve's open transaction.
	txn := reserve(t, ctx, s, key("n"))
	refused("n", "a new key held by Reserve")
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// An expired key taken over by Reserve's open transaction.
	f.complete(t, ctx, time.Minute, key("e"), "old")
	f.set(2 * time.Minute)
	txn = reserve(t, ctx, s, key("e"))
	refused("e", "an expired key taken over by Reserve")
	if err := txn.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A live lease, then a phase open on it after its end.
	if err := mustPhase(t, ctx, s, acq("l", "o")).Save(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	refused("l", "a live lease")
	f.set(time.Hour)
	p := mustPhase(t, ctx, s, acq("l", "o2"))
	refused("l", "a key held by a phase")
	if err := p.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Its lease ended: deleted.
	in, err = s.Forget(ctx, key("l"))
	mustInfo(t, "Forget unfinished", utc(in), err, backend.KeyInfo{Key: key("l"), State: backend.KeyUnfinished, Fingerprint: "fp",
		CreatedAt: at(2 * time.Minute), ExpiresAt: maxExpiry, Progress: []byte("p"), LeaseEnds: at(2*time.Minute + 10*time.Second)})
	if _, ok := f.row(t, ctx, "l"); ok {
		t.Fatal("forgotten unfinished key still has a row")
	}
	p = mustPhase(t, ctx, s, acq("l", "o3"))
	if p.Progress() != nil {
		t.Fatalf("forgotten operation resumed at %q, want a new key", p.Progress())
	}
	_ = p.Rollback(ctx)

	// Expired: deleted.
	in, err = s.Forget(ctx, key("e"))
	if err != nil || in.State != backend.KeyExpired || in.BodyLen != 3 || in.Body != nil {
		t.Fatalf("Forget expired: %+v, %v", in, err)
	}
}

// TestList pages through a scope's keys, unfinished (and held) ones first,
// then the others, each in byte order of ID, with an exact cursor.
func TestList(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 3)
	s := f.store
	key := func(id string) idempotency.Key { return idempotency.Key{Scope: "L", ID: id} }
	op := func(id string, save bool) {
		a := acq(id, "o")
		a.Key.Scope = "L"
		p := mustPhase(t, ctx, s, a)
		var err error
		if save {
			err = p.Save(ctx, []byte("progress"))
		} else {
			err = p.Release(ctx, []byte("progress"))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "C", "~"} {
		f.complete(t, ctx, time.Hour, key(id), "body of "+id)
	}
	f.complete(t, ctx, time.Minute, key("b"), "b")
	f.complete(t, ctx, time.Hour, idempotency.Key{Scope: "other", ID: "0"}, "x")
	f.complete(t, ctx, time.Hour, idempotency.Key{Scope: "L2", ID: "0"}, "x")
	op("z", false)
	op("A", false)
	f.set(2 * time.Minute)
	op("m", true)

	type entry struct {
		id      string
		state   backend.KeyState
		bodyLen int
	}
	var got [][]entry
	var cursors []*backend.ListCursor
	var after *backend.ListCursor
	for range 4 {
		page, err := s.List(ctx, backend.ListQuery{Scope: "L", Limit: 3, After: after})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var es []entry
		for _, k := range page.Keys {
			if k.Key.Scope != "L" || k.Body != nil {
				t.Fatalf("listed key %+v: wrong scope or a body", k)
			}
			es = append(es, entry{k.Key.ID, k.State, k.BodyLen})
		}
		got = append(got, es)
		cursors = append(cursors, page.Next)
		if after = page.Next; after == nil {
			break
		}
	}
	want := [][]entry{
		{{"A", backend.KeyUnfinished, 0}, {"m", backend.KeyInProgress, 0}, {"z", backend.KeyUnfinished, 0}},
		{{"C", backend.KeyCompleted, 9}, {"a", backend.KeyCompleted, 9}, {"b", backend.KeyExpired, 1}},
		{{"~", backend.KeyCompleted, 9}},
	}
	wantCursors := []*backend.ListCursor{{Unfinished: true, ID: "z"}, {Unfinished: false, ID: "b"}, nil}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(cursors, wantCursors) {
		t.Fatalf("pages:\n got %v, cursors %v\nwant %v, cursors %v", got, cursors, want, wantCursors)
	}
	page, err := s.List(ctx, backend.ListQuery{Scope: "L", Limit: 7})
	if err != nil || len(page.Keys) != 7 || page.Next != nil {
		t.Fatalf("List of exactly 7: %d keys, next %v, %v", len(page.Keys), page.Next, err)
	}
	if page, err := s.List(ctx, backend.ListQuery{Scope: "none", Limit: 1}); err != nil || len(page.Keys) != 0 || page.Next != nil {
		t.Fatalf("List of an empty scope: %+v, %v", page, err)
	}
	for _, limit := range []int{0, -1, 1001} {
		if _, err := s.List(ctx, backend.ListQuery{Scope: "L", Limit: limit}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("List with limit %d: %v, want ErrInvalidConfig", limit, err)
		}
	}
	if page, err := s.List(ctx, backend.ListQuery{Scope: "L", Limit: 1000}); err != nil || len(page.Keys) != 7 {
		t.Fatalf("List with limit 1000: %d keys, %v", len(page.Keys), err)
	}
}

// TestStats counts the records by state, by the test clock.
func TestStats(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f := newStepFixture(t, postgres.Config{}, 3)
	s := f.store
	if st, err := s.Stats(ctx); err != nil || st != (backend.Stats{}) {
		t.Fatalf("Stats of an empty table: %+v, %v", st, err)
	}
	key := func(id string) idempotency.Key { return idempotency.Key{Scope: "s", ID: id} }
	f.complete(t, ctx, time.Hour, key("c1"), "12345")
	f.complete(t, ctx, time.Hour, key("c2"), "123")
	f.complete(t, ctx, time.Minute, key("x"), string(make([]byte, 100)))
	if err := mustPhase(t, ctx, s, acq("u2", "o")).Save(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	f.set(30 * time.Second)
	if err := mustPhase(t, ctx, s, acq("u1", "o")).Release(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	f.set(2 * time.Minute)
	if err := mustPhase(t, ctx, s, acq("h", "o")).Save(ctx, []byte("p")); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(ctx)
	want := backend.Stats{InProgress: 1, Unfinished: 2, Completed: 2, Expired: 1, Failing: 1, OldestUnfinished: at(0), BodyBytes: 8}
	if err != nil || st.OldestUnfinished.Equal(want.OldestUnfinished) {
		st.OldestUnfinished = want.OldestUnfinished
	}
	if err != nil || st != want {
		t.Fatalf("Stats: got %+v, %v; want %+v", st, err, want)
	}
	// Two hours later the completed records have expired too.
	f.set(2 * time.Hour)
	st, err = s.Stats(ctx)
	want = backend.Stats{InProgress: 0, Unfinished: 3, Completed: 0, Expired: 3, Failing: 1, OldestUnfinished: at(0), BodyBytes: 0}
	if err != nil || st.OldestUnfinished.Equal(want.OldestUnfinished) {
		st.OldestUnfinished = want.OldestUnfinished
	}
	if err != nil || st != want {
		t.Fatalf("Stats later: got %+v, %v; want %+v", st, err, want)
	}
}
