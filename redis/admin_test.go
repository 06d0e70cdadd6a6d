package redis

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
)

// adminClock is a test clock (Config.Clock) that moves only when told.
type adminClock struct{ ms atomic.Int64 }

func newAdminClock(start time.Time) *adminClock {
	c := &adminClock{}
	c.ms.Store(start.UnixMilli())
	return c
}

func (c *adminClock) now() time.Time               { return time.UnixMilli(c.ms.Load()) }
func (c *adminClock) add(d time.Duration)          { c.ms.Add(d.Milliseconds()) }
func (c *adminClock) at(d time.Duration) time.Time { return c.now().Add(d) }

// adminSetup is a fixture on the single node with a test clock and a Guard
// whose observer records the Forgotten events.
type adminSetup struct {
	*fixture
	clock  *adminClock
	g      *idempotency.Guard[*Tx]
	mu     sync.Mutex
	events []observe.Event
}

const adminTTL = time.Hour

func newAdminSetup(t *testing.T, newClient func(int) goredis.UniversalClient) *adminSetup {
	t.Helper()
	a := &adminSetup{clock: newAdminClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	a.fixture = newFixture(t, newClient, 0, &Config{Clock: a.clock.now})
	g, err := idempotency.New(a.store, &idempotency.Config{TTL: adminTTL, Observer: func(_ context.Context, ev observe.Event) {
		if ev.Outcome == observe.Forgotten || ev.Err != nil && ev.Outcome != observe.Executed {
			a.mu.Lock()
			a.events = append(a.events, ev)
			a.mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	a.g = g
	return a
}

// do runs the guarded effect once for key; it reports whether fn ran.
func (a *adminSetup) do(t *testing.T, ctx context.Context, key idempotency.Key, body string) bool {
	t.Helper()
	resp, err := a.g.Do(ctx, key, "fp-"+key.ID, func(tx *Tx) (idempotency.Response, error) {
		if err := a.effect(ctx, tx, key.ID); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"X-Order": {"42", "b"}}, Body: []byte(body)}, nil
	})
	if err != nil {
		t.Fatalf("Do %v: %v", key, err)
	}
	return !resp.Replayed
}

// reserve takes key for the test with fingerprint fp, by the store alone.
func (a *adminSetup) reserve(t *testing.T, ctx context.Context, key idempotency.Key, fp string) backend.Txn[*Tx] {
	t.Helper()
	txn, _, err := a.store.Reserve(ctx, backend.Reservation{Key: key, Fingerprint: fp, TTL: adminTTL})
	if err != nil || txn == nil {
		t.Fatalf("Reserve: %v, %v", txn, err)
	}
	return txn
}

func (a *adminSetup) exists(t *testing.T, ctx context.Context, key idempotency.Key) bool {
	t.Helper()
	n, err := a.client.Exists(ctx, a.store.keysFor(key).rec).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestAdminInspect(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	a := newAdminSetup(t, singleClient(t))
	key := idempotency.Key{Scope: "orders", ID: "inspect-1"}
	created := a.clock.now()
	body := "{\"id\":7}\x00\xff"
	txn := a.reserve(t, ctx, key, "fp-inspect-1")
	a.clock.add(1500 * time.Millisecond) // completion: the expiry counts from it
	if err := txn.Complete(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{"X-Order": {"42", "b"}}, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	want := &idempotency.KeyInfo{Key: key, State: idempotency.KeyCompleted, Fingerprint: "fp-inspect-1", Status: http.StatusCreated,
		Header: http.Header{"X-Order": {"42", "b"}}, BodyLen: len(body), CreatedAt: created, ExpiresAt: a.clock.at(adminTTL)}

	t.Run("NoBody", func(t *testing.T) {
		got, err := a.g.Inspect(ctx, key, false)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got  %+v\nwant %+v", got, want)
		}
	})
	t.Run("Body", func(t *testing.T) {
		got, err := a.g.Inspect(ctx, key, true)
		if err != nil {
			t.Fatal(err)
		}
		w := *want
		w.Body = []byte(body)
		if !reflect.DeepEqual(got, &w) {
			t.Errorf("got  %+v\nwant %+v", got, &w)
		}
	})
	t.Run("NotFound", func(t *testing.T) {
		got, err := a.g.Inspect(ctx, idempotency.Key{Scope: "orders", ID: "never"}, false)
		if !errors.Is(err, idempotency.ErrNotFound) || got != nil {
			t.Errorf("got %+v, %v; want ErrNotFound", got, err)
		}
		// An abandoned marker (a lost reservation's) is no record.
		other := idempotency.Key{Scope: "orders", ID: "abandoned"}
		a.store.abandon(ctx, a.store.keysFor(other), "gone-token")
		if !a.exists(t, ctx, other) {
			t.Fatal("no abandoned marker written")
		}
		if _, err := a.g.Inspect(ctx, other, false); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("abandoned marker: %v, want ErrNotFound", err)
		}
	})
	t.Run("InvalidKey", func(t *testing.T) {
		for _, bad := range []idempotency.Key{{ID: ""}, {ID: "a\nb"}, {ID: string(make([]byte, backend.MaxIDLen+1))}} {
			if _, err := a.g.Inspect(ctx, bad, false); !errors.Is(err, idempotency.ErrInvalidKey) {
				t.Errorf("Inspect(%q): %v, want ErrInvalidKey", bad.ID, err)
			}
		}
	})
	t.Run("Expired", func(t *testing.T) {
		a.clock.add(adminTTL) // the expiry is now, by the store's clock
		got, err := a.g.Inspect(ctx, key, false)
		if err != nil {
			t.Fatal(err)
		}
		w := *want
		w.State = idempotency.KeyExpired
		if !reflect.DeepEqual(got, &w) {
			t.Errorf("got  %+v\nwant %+v", got, &w)
		}
	})
}

func TestAdminInspectHeld(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	a := newAdminSetup(t, singleClient(t))
	key := idempotency.Key{Scope: "orders", ID: "held-1"}
	txn := a.reserve(t, ctx, key, "fp-held")
	defer func() { _ = txn.Rollback(ctx) }()
	before := time.Now()
	got, err := a.store.Inspect(ctx, key, true)
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	// The lease is Redis's: DefaultLease from the reservation (renewed by
	// now at most once, every Lease/3), read by Redis's clock, which is
	// this machine's.
	lease := got.LeaseEnds
	if lease.Before(before.Add(DefaultLease-time.Second)) || lease.After(after.Add(DefaultLease+time.Second)) {
		t.Errorf("lease ends %v, want about %v after %v", lease, DefaultLease, before)
	}
	got.LeaseEnds = time.Time{}
	want := &backend.KeyInfo{Key: key, State: backend.KeyInProgress, Fingerprint: "fp-held",
		CreatedAt: a.clock.now(), ExpiresAt: a.clock.at(adminTTL)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestAdminForget(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	a := newAdminSetup(t, singleClient(t))

	t.Run("Completed", func(t *testing.T) {
		key := idempotency.Key{Scope: "orders", ID: "forget-1"}
		a.do(t, ctx, key, "first")
		if a.do(t, ctx, key, "second") {
			t.Fatal("a replay ran fn")
		}
		got, err := a.g.Forget(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != idempotency.KeyCompleted || got.BodyLen != len("first") || got.Body != nil || got.Fingerprint != "fp-forget-1" {
			t.Errorf("Forget returned %+v", got)
		}
		if a.exists(t, ctx, key) {
			t.Fatal("the record is still in Redis")
		}
		if _, err := a.g.Forget(ctx, key); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("second Forget: %v, want ErrNotFound", err)
		}
		if !a.do(t, ctx, key, "third") {
			t.Fatal("after Forget, fn did not run again")
		}
		testkit.MustCount(t, ctx, a.count, key.ID, 2)
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.events) != 2 || a.events[0].Outcome != observe.Forgotten || a.events[0].Key != key ||
			a.events[0].Err != nil || !errors.Is(a.events[1].Err, idempotency.ErrNotFound) {
			t.Errorf("events %+v, want Forgotten then a failure with ErrNotFound", a.events)
		}
	})

	t.Run("Expired", func(t *testing.T) {
		key := idempotency.Key{Scope: "orders", ID: "forget-expired"}
		a.do(t, ctx, key, "x")
		a.clock.add(2 * adminTTL)
		got, err := a.store.Forget(ctx, key)
		if err != nil || got.State != backend.KeyExpired {
			t.Fatalf("Forget: %+v, %v; want the expired record", got, err)
		}
		if a.exists(t, ctx, key) {
			t.Fatal("the record is still in Redis")
		}
	})

	t.Run("HeldRefused", func(t *testing.T) {
		key := idempotency.Key{Scope: "orders", ID: "forget-held"}
		txn := a.reserve(t, ctx, key, "fp")
		before, err := a.client.HGetAll(ctx, a.store.keysFor(key).rec).Result()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.store.Forget(ctx, key); !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("Forget of a held key: %v, want ErrInProgress", err)
		}
		after, err := a.client.HGetAll(ctx, a.store.keysFor(key).rec).Result()
		if err != nil || !reflect.DeepEqual(before, after) {
			t.Errorf("the held record changed: %v -> %v (%v)", before, after, err)
		}
		if err := a.effect(ctx, txn.Tx(), key.ID); err != nil {
			t.Fatal(err)
		}
		if err := txn.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatalf("the holder cannot complete after a refused Forget: %v", err)
		}
		testkit.MustCount(t, ctx, a.count, key.ID, 1)
	})

	t.Run("HeldByGuard", func(t *testing.T) {
		key := idempotency.Key{Scope: "orders", ID: "forget-guard"}
		inside, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := a.g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
				close(inside)
				<-release
				return idempotency.Response{Status: 200}, nil
			})
			done <- err
		}()
		<-inside
		_, err := a.g.Forget(ctx, key)
		close(release)
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("Forget during Do: %v, want ErrInProgress", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// TestAdminForgetConcurrent: Forget is one atomic step. Of 20 concurrent
// Forgets of one completed key exactly one deletes it; and a Forget racing
// the holder's Complete either refuses the pending record or deletes the
// completed one, never the reservation itself.
func TestAdminForgetConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 60*time.Second)
	a := newAdminSetup(t, singleClient(t))

	t.Run("ManyForgets", func(t *testing.T) {
		key := idempotency.Key{Scope: "orders", ID: "many"}
		a.do(t, ctx, key, "x")
		var deleted, notFound atomic.Int32
		testkit.Together(20, func(int) {
			_, err := a.store.Forget(ctx, key)
			switch {
			case err == nil:
				deleted.Add(1)
			case errors.Is(err, idempotency.ErrNotFound):
				notFound.Add(1)
			default:
				t.Error(err)
			}
		})
		if deleted.Load() != 1 || notFound.Load() != 19 {
			t.Errorf("deleted %d, not found %d; want 1 and 19", deleted.Load(), notFound.Load())
		}
	})

	t.Run("ForgetVersusComplete", func(t *testing.T) {
		for i := range 30 {
			key := keyN(i)
			txn := a.reserve(t, ctx, key, "fp")
			var forgot *backend.KeyInfo
			var ferr, cerr error
			testkit.Together(2, func(j int) {
				if j == 0 {
					cerr = txn.Complete(ctx, idempotency.Response{Status: 200})
				} else {
					forgot, ferr = a.store.Forget(ctx, key)
				}
			})
			if cerr != nil {
				t.Fatalf("Complete: %v", cerr)
			}
			switch {
			case ferr == nil && forgot.State == backend.KeyCompleted:
				if a.exists(t, ctx, key) {
					t.Fatalf("key %d: Forget deleted it, yet the record is there", i)
				}
			case errors.Is(ferr, idempotency.ErrInProgress):
				if got, err := a.store.Inspect(ctx, key, false); err != nil || got.State != backend.KeyCompleted {
					t.Fatalf("key %d: after a refused Forget: %+v, %v; want completed", i, got, err)
				}
			default:
				t.Fatalf("key %d: Forget: %+v, %v", i, forgot, ferr)
			}
		}
	})
}

// TestAdminUnsupported: Redis lists nothing and runs no operations; the
// Guard says so with errors.ErrUnsupported, and writes nothing.
func TestAdminUnsupported(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 30*time.Second)
	a := newAdminSetup(t, singleClient(t))
	if _, ok := any(a.store).(backend.KeyLister); ok {
		t.Error("the Redis store implements KeyLister")
	}
	if _, err := a.g.List(ctx, idempotency.ListQuery{Scope: "orders", Limit: 10}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("List: %v, want ErrUnsupported", err)
	}
	if _, err := a.g.Stats(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Stats: %v, want ErrUnsupported", err)
	}
	op := &idempotency.Operation[*Tx]{Name: "pay",
		Steps: []idempotency.Step[*Tx]{{Name: "one", Local: func(context.Context, *Tx, *idempotency.State) error { return nil }}},
		Finish: func(context.Context, *Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		}}
	key := idempotency.Key{Scope: "orders", ID: "op"}
	if _, err := a.g.Run(ctx, key, "fp", nil, op); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Run: %v, want ErrUnsupported", err)
	}
	if a.exists(t, ctx, key) {
		t.Error("Run wrote a record")
	}
}

// TestClusterAdmin: on a three-master Cluster, with a prefix without a
// hash tag (so records spread over the nodes), Inspect and Forget reach
// each record on its node; a held one is refused there too.
func TestClusterAdmin(t *testing.T) {
	t.Parallel()
	addrs := startCluster(t)
	ctx := testkit.Context(t, 60*time.Second)
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	prefix := "admin:" + testkit.Name("p-") + ":"
	t.Cleanup(func() { dropPrefix(t, client, prefix); _ = client.Close() })
	s, err := New(client, &Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for i := range 12 {
		key := keyN(i)
		txn, _, err := s.Reserve(ctx, reservation(key, "fp", 0))
		if err != nil || txn == nil {
			t.Fatalf("reserve %d: %v, %v", i, txn, err)
		}
		if _, err := s.Forget(ctx, key); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("Forget of held key %d: %v, want ErrInProgress", i, err)
		}
		if err := txn.Complete(ctx, resp201(i)); err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		info, err := s.Inspect(ctx, key, true)
		if err != nil || info.State != backend.KeyCompleted || info.Status != 201 || string(info.Body) != string(resp201(i).Body) {
			t.Fatalf("Inspect %d: %+v, %v", i, info, err)
		}
		if _, err := s.Forget(ctx, key); err != nil {
			t.Fatalf("Forget %d: %v", i, err)
		}
		if _, err := s.Inspect(ctx, key, false); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Inspect %d after Forget: %v, want ErrNotFound", i, err)
		}
		c, err := client.MasterForKey(ctx, s.keysFor(key).rec)
		if err != nil {
			t.Fatal(err)
		}
		nodes[c.Options().Addr] = true
	}
	if len(nodes) < 2 {
		t.Errorf("12 keys landed on %d node(s), want several", len(nodes))
	}
}
