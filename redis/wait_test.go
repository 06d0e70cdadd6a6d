package redis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestWaitersWokenPromptly measures how soon waiters return after the
// holder completes; with a 30s lease the fallback poll is 1s, so only the
// wake-up makes them fast. Waiters on the holder's Store wait on the holder
// itself and take its record (each its own copy); waiters on another Store
// (another process) wait on the key's pub/sub channel. It logs, it does not
// assert speed.
func TestWaitersWokenPromptly(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := "Local"
		if remote {
			name = "Remote"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testkit.Context(t, 30*time.Second)
			f := newFixture(t, singleClient(t), 0, nil)
			s := f.store
			if remote {
				other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t)})
				t.Cleanup(func() { _ = other.Close() })
				var err error
				if s, err = New(other, &Config{Prefix: f.prefix}); err != nil {
					t.Fatal(err)
				}
			}
			const waiters = 5
			gs := guards(t, s, waiters, &idempotency.Config{WaitTimeout: 20 * time.Second})
			key := idempotency.Key{ID: testkit.Name("wake-")}
			holder, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
			if err != nil || holder == nil {
				t.Fatalf("holder: %v, %v", holder, err)
			}
			returned := make([]time.Time, waiters)
			resps := make([]idempotency.Response, waiters)
			errs := make([]error, waiters)
			var wg sync.WaitGroup
			for i := range waiters {
				wg.Go(func() {
					resps[i], errs[i] = gs[i].Do(ctx, key, "fp", func(*Tx) (idempotency.Response, error) {
						return idempotency.Response{}, errors.New("a waiter must not run fn")
					})
					returned[i] = time.Now()
				})
			}
			wake := f.store.keysFor(key).wake
			testkit.WaitUntil(t, 10*time.Second, "the waiters", func() bool {
				n, err := f.client.PubSubNumSub(ctx, wake).Result()
				if remote {
					return err == nil && n[wake] == waiters
				}
				return err == nil && n[wake] == 0 && holder.(*txn).hold.waiters.Load() == waiters
			})
			_ = f.effect(ctx, holder.Tx(), "wake")
			hdr := http.Header{"X-A": {"1", "2"}, "x-raw": {""}, "Empty": {}}
			before := time.Now()
			if err := holder.Complete(ctx, idempotency.Response{Status: 201, Header: hdr, Body: []byte("done")}); err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			hdr.Set("X-A", "changed by the holder's caller")
			wg.Wait()
			_, stored, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
			if err != nil || stored == nil {
				t.Fatalf("the stored record: %v, %v", stored, err)
			}
			for i := range waiters {
				r := resps[i]
				if errs[i] != nil || !r.Replayed || r.Status != 201 || string(r.Body) != "done" ||
					fmt.Sprintf("%#v", r.Header) != fmt.Sprintf("%#v", stored.Header) {
					t.Fatalf("waiter %d: got %+v, %v; want the replay of %+v", i, r, errs[i], stored)
				}
				t.Logf("waiter %d returned %v after Complete started (%v after it returned)",
					i, returned[i].Sub(before), returned[i].Sub(after))
			}
			// Each waiter owns what it got.
			resps[0].Header.Set("X-A", "mine")
			resps[0].Body[0] = 'D'
			if resps[1].Header.Get("X-A") != "1" || string(resps[1].Body) != "done" {
				t.Fatalf("waiters share their response: %+v", resps[1])
			}
			if c, err := f.count(ctx, "wake"); err != nil || c != 1 {
				t.Fatalf("effects: got %d, %v; want 1", c, err)
			}
		})
	}
}

// scriptCalls counts the reservation scripts run on one record and, once
// armed, holds the next one back (before it is sent, or after its reply
// with afterReply) until release is closed.
type scriptCalls struct {
	rec        string
	afterReply bool
	n          atomic.Int64
	armed      atomic.Bool
	held       chan struct{} // closed when a call is held back
	release    chan struct{}
}

func newScriptCalls() *scriptCalls {
	return &scriptCalls{held: make(chan struct{}), release: make(chan struct{})}
}

func (h *scriptCalls) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *scriptCalls) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return h.around(cmd, func() error { return next(ctx, cmd) })
	}
}

// ProcessPipelineHook catches the script sent in a pipeline (the
// reservation that arms WATCH, see tryWatched).
func (h *scriptCalls) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 0 {
			return next(ctx, cmds)
		}
		return h.around(cmds[0], func() error { return next(ctx, cmds) })
	}
}

// around runs send, counting it and holding it back if cmd is a script
// call on h.rec.
func (h *scriptCalls) around(cmd goredis.Cmder, send func() error) error {
	args := cmd.Args()
	if (cmd.Name() != "evalsha" && cmd.Name() != "eval") || len(args) < 4 || args[3] != h.rec {
		return send()
	}
	h.n.Add(1)
	hold := h.armed.CompareAndSwap(true, false)
	if hold && !h.afterReply {
		close(h.held)
		<-h.release
	}
	err := send()
	if hold && h.afterReply {
		close(h.held)
		<-h.release
	}
	return err
}

// TestConcurrentCallersShareOneLook: callers of one key in one Store that
// arrive while another runs the reservation script wait for its answer
// instead of running their own: for a completed key they each get their own
// copy of the record; for a new key they wait on the caller that reserved
// it and get its record when it completes. One script call in all. The
// first caller is a Do; the others call Reserve with a wait bound, as Do
// does once its first try (without waiting) finds the key held.
func TestConcurrentCallersShareOneLook(t *testing.T) {
	const n = 10
	for _, completed := range []bool{true, false} {
		name := "NewKey"
		if completed {
			name = "Completed"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testkit.Context(t, 30*time.Second)
			h := newScriptCalls()
			f := newFixture(t, hooked(testenv.RedisAddr(t), h), 0, nil)
			g := guards(t, f.store, 1, nil)[0]
			key := idempotency.Key{ID: testkit.Name("share-")}
			var calls atomic.Int64
			waiters := func() int32 {
				f.store.mu.Lock()
				defer f.store.mu.Unlock()
				w := int32(0)
				for _, hd := range f.store.holds {
					w += hd.waiters.Load()
				}
				return w
			}
			fn := func(tx *Tx) (idempotency.Response, error) {
				calls.Add(1)
				_ = f.effect(ctx, tx, "share")
				if !completed {
					// Every other caller waits on this one by now.
					testkit.WaitUntil(t, 10*time.Second, "the waiters", func() bool { return waiters() == n-1 })
				}
				return idempotency.Response{Status: 201, Header: http.Header{"X-A": {"a"}}, Body: []byte("shared")}, nil
			}
			if completed {
				if _, err := g.Do(ctx, key, "fp", fn); err != nil {
					t.Fatal(err)
				}
			}
			h.rec = f.store.keysFor(key).rec
			h.armed.Store(true)
			resps := make([]idempotency.Response, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			wg.Go(func() { resps[0], errs[0] = g.Do(ctx, key, "fp", fn) })
			<-h.held // the first caller's script is on its way
			for i := 1; i < n; i++ {
				wg.Go(func() {
					txn, rec, err := f.store.Reserve(ctx, reservation(key, "fp", 10*time.Second))
					switch {
					case err != nil:
						errs[i] = err
					case txn != nil:
						_ = txn.Rollback(ctx)
						errs[i] = errors.New("a joined caller got the key")
					default:
						resps[i] = rec.Response()
					}
				})
			}
			testkit.WaitUntil(t, 10*time.Second, "the callers to join", func() bool {
				f.store.mu.Lock()
				defer f.store.mu.Unlock()
				l := f.store.looking[h.rec]
				return l != nil && l.joined != nil && l.joined.n == n-1
			})
			close(h.release)
			wg.Wait()
			replayed := 0
			for i := range n {
				r := resps[i]
				if errs[i] != nil || r.Status != 201 || r.Header.Get("X-A") != "a" || string(r.Body) != "shared" {
					t.Fatalf("caller %d: got %+v, %v", i, r, errs[i])
				}
				if r.Replayed {
					replayed++
				}
			}
			if want := n - 1; completed && replayed != n || !completed && replayed != want {
				t.Fatalf("%d of %d callers replayed", replayed, n)
			}
			if got := h.n.Load(); got != 1 {
				t.Fatalf("reservation scripts run: got %d, want 1 for %d callers", got, n)
			}
			if c, err := f.count(ctx, "share"); err != nil || c != 1 || calls.Load() != 1 {
				t.Fatalf("effects %d (%v), fn calls %d; want 1 and 1", c, err, calls.Load())
			}
			// Each caller owns what it got.
			resps[1].Header.Set("X-A", "mine")
			resps[1].Body[0] = 'S'
			if resps[2].Header.Get("X-A") != "a" || string(resps[2].Body) != "shared" {
				t.Fatalf("callers share their response: %+v", resps[2])
			}
		})
	}
}

// TestJoinedLookFails: when the caller whose reservation script others
// joined fails (here its context ends), the others look for themselves:
// one runs fn, the rest get its response.
func TestJoinedLookFails(t *testing.T) {
	const n = 6
	ctx := testkit.Context(t, 30*time.Second)
	h := newScriptCalls()
	f := newFixture(t, hooked(testenv.RedisAddr(t), h), 0, nil)
	gs := guards(t, f.store, n+1, nil) // the last one for the caller whose context ends
	key := idempotency.Key{ID: testkit.Name("fail-")}
	h.rec = f.store.keysFor(key).rec
	h.armed.Store(true)
	var calls atomic.Int64
	fn := func(tx *Tx) (idempotency.Response, error) {
		calls.Add(1)
		_ = f.effect(ctx, tx, "fail")
		return idempotency.Response{Status: 201, Body: []byte("ok")}, nil
	}
	lctx, cancel := context.WithCancel(ctx)
	leader := make(chan error, 1)
	go func() { _, err := gs[n].Do(lctx, key, "fp", fn); leader <- err }()
	<-h.held
	resps := make([]idempotency.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { resps[i], errs[i] = gs[i].Do(ctx, key, "fp", fn) })
	}
	testkit.WaitUntil(t, 10*time.Second, "the callers to join", func() bool {
		f.store.mu.Lock()
		defer f.store.mu.Unlock()
		l := f.store.looking[h.rec]
		return l != nil && l.joined != nil && l.joined.n == n
	})
	cancel()
	close(h.release)
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled caller: got %v, want context.Canceled", err)
	}
	wg.Wait()
	executed := 0
	for i := range n {
		if errs[i] != nil || string(resps[i].Body) != "ok" {
			t.Fatalf("caller %d: got %+v, %v", i, resps[i], errs[i])
		}
		if !resps[i].Replayed {
			executed++
		}
	}
	if c, err := f.count(ctx, "fail"); err != nil || c != 1 || executed != 1 || calls.Load() != 1 {
		t.Fatalf("effects %d (%v), executed %d, fn calls %d; want 1, 1, 1", c, err, executed, calls.Load())
	}
}

// TestWokenWaiterLooksAfresh: a waiter woken by the holder's message looks
// at the key with a script sent after the wake-up, never with the answer of
// one that ran before it (that answer says pending, and the waiter would
// sleep until its poll). Here another caller's script ran before the
// completion and its reply is held back: the woken waiter must not wait for
// it.
func TestWokenWaiterLooksAfresh(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	h := newScriptCalls()
	h.afterReply = true
	other := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t)})
	other.AddHook(h)
	t.Cleanup(func() { _ = other.Close() })
	remote, err := New(other, &Config{Prefix: f.prefix}) // another process, as far as f.store knows
	if err != nil {
		t.Fatal(err)
	}
	gs := guards(t, remote, 2, &idempotency.Config{WaitTimeout: 20 * time.Second})
	key := idempotency.Key{ID: testkit.Name("fresh-")}
	h.rec = remote.keysFor(key).rec
	holder, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
	if err != nil || holder == nil {
		t.Fatalf("holder: %v, %v", holder, err)
	}
	fn := func(*Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("a waiter must not run fn")
	}
	type result struct {
		r   idempotency.Response
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { r, err := gs[0].Do(ctx, key, "fp", fn); first <- result{r, err} }()
	// The first waiter looked, subscribed, looked again, and now waits.
	testkit.WaitUntil(t, 10*time.Second, "the first waiter", func() bool {
		remote.mu.Lock()
		defer remote.mu.Unlock()
		return remote.waiting.Load() == 1 && remote.looking[h.rec] == nil
	})
	h.armed.Store(true)
	go func() { r, err := gs[1].Do(ctx, key, "fp", fn); second <- result{r, err} }()
	<-h.held // the second caller's script ran (pending); its reply waits
	if err := holder.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("done")}); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-first:
		if res.err != nil || !res.r.Replayed || string(res.r.Body) != "done" {
			t.Fatalf("woken waiter: got %+v, %v; want the replay", res.r, res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the woken waiter waits for a script that ran before its wake-up")
	}
	close(h.release)
	if res := <-second; res.err != nil || !res.r.Replayed || string(res.r.Body) != "done" {
		t.Fatalf("second waiter: got %+v, %v; want the replay", res.r, res.err)
	}
}

// guards returns n Guards on s: callers of one key reach the Store only
// through different Guards (one Guard's callers of a key wait in memory
// for the one among them that is in the Store).
func guards(t *testing.T, s *Store, n int, cfg *idempotency.Config) []*idempotency.Guard[*Tx] {
	t.Helper()
	gs := make([]*idempotency.Guard[*Tx], n)
	for i := range gs {
		g, err := idempotency.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
	}
	return gs
}
