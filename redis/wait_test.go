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
			wake := f.store.keysFor(key).wake()
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
	testkit.WaitUntil(t, 10*time.Second, "the first waiter", func() bool { return remote.waiting.Load() == 1 })
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
