package redis

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// The tests below lose the reply (or hold back the request) of a
// reservation script past the caller's deadline, through a proxy between
// the store and the real server. The caller may then have taken the key
// under a token that nobody will release: a retry must not find the key
// held for a whole lease (30s by default) by that gone owner.

const (
	callerDeadline = 200 * time.Millisecond // the caller's own timeout
	networkStall   = time.Second            // how late the held bytes arrive
)

// lostReply is a store on a client behind a stallProxy (with the go-redis
// option that bounds socket I/O by the caller's context), plus a store on
// the same prefix reached directly, as another process would.
type lostReply struct {
	*fixture
	proxy *stallProxy
	other *Store
}

func newLostReply(t *testing.T, hook goredis.Hook) *lostReply {
	t.Helper()
	p := startStallProxy(t, testenv.RedisAddr(t))
	f := newFixture(t, func(int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
		if hook != nil {
			c.AddHook(hook)
		}
		return c
	}, 0, nil)
	direct := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = direct.Close() })
	other, err := New(direct, &Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	// Load the scripts and dial: the stall must hit the reservation itself.
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Do(testkit.Context(t, 10*time.Second), idempotency.Key{ID: testkit.Name("warm-")}, "fp", okFn); err != nil {
		t.Fatal(err)
	}
	warm, _, err := f.store.Reserve(testkit.Context(t, 10*time.Second), reservation(idempotency.Key{ID: testkit.Name("warm-")}, "fp", 0))
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.Rollback(context.Background())
	return &lostReply{fixture: f, proxy: p, other: other}
}

func okFn(*Tx) (idempotency.Response, error) { return idempotency.Response{Status: http.StatusOK}, nil }

// reserveLate runs Reserve on key under a short deadline while the proxy
// holds back the next chunk (arm says which direction), and waits until
// the held chunk has been passed on. Reserve must fail, and return soon.
func (l *lostReply) reserveLate(t *testing.T, key idempotency.Key, arm func(time.Duration)) {
	t.Helper()
	stalls := l.proxy.stalls.Load()
	arm(networkStall)
	ctx, cancel := context.WithTimeout(context.Background(), callerDeadline)
	defer cancel()
	start := time.Now()
	txn, rec, err := l.store.Reserve(ctx, reservation(key, "fp", 0))
	took := time.Since(start)
	if err == nil {
		t.Fatalf("Reserve past its deadline: got %v, %v; want an error", txn, rec)
	}
	if took > callerDeadline+abandonTimeout+2*time.Second {
		t.Fatalf("Reserve returned %v after its deadline of %v", took, callerDeadline)
	}
	testkit.WaitUntil(t, 10*time.Second, "the held bytes to reach their peer", func() bool { return l.proxy.stalls.Load() > stalls })
	t.Logf("Reserve failed after %v: %v", took, err)
}

// TestLostReservationReply: the reservation script ran on the server but
// its reply came after the caller's deadline (Reply), or the script reached
// the server only after it (Request). Either way another process, and this
// one, find the key free at once.
func TestLostReservationReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		arm  func(p *stallProxy) func(time.Duration)
	}{
		{"Reply", func(p *stallProxy) func(time.Duration) { return p.stallReply }},
		{"Request", func(p *stallProxy) func(time.Duration) { return p.stallRequest }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testkit.Context(t, 30*time.Second)
			l := newLostReply(t, nil)
			key := idempotency.Key{Scope: "s", ID: testkit.Name("lost-")}
			l.reserveLate(t, key, tc.arm(l.proxy))
			for _, s := range []struct {
				who   string
				store *Store
			}{{"another process", l.other}, {"the same store", l.store}} {
				txn, rec, err := s.store.Reserve(ctx, reservation(key, "fp", 0))
				if err != nil || txn == nil {
					t.Fatalf("%s reserves after the lost reply, without waiting: got %v, %+v, %v; want the key",
						s.who, txn, rec, err)
				}
				if err := txn.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestRetryAfterLostReply: a Do whose reservation reply is lost fails with
// its deadline in the chain; the client's retry, here
// through another process with NoWait, runs fn at once, and only once.
func TestRetryAfterLostReply(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	l := newLostReply(t, nil)
	g, err := idempotency.New(l.store, &idempotency.Config{MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := idempotency.New(l.other, &idempotency.Config{WaitTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.Key{ID: testkit.Name("retry-")}
	var calls atomic.Int64
	fn := func(tx *Tx) (idempotency.Response, error) {
		calls.Add(1)
		_ = l.effect(ctx, tx, "retry")
		return idempotency.Response{Status: http.StatusCreated, Body: []byte("paid")}, nil
	}
	l.proxy.stallReply(networkStall)
	dctx, cancel := context.WithTimeout(ctx, callerDeadline)
	_, err = g.Do(dctx, key, "fp", fn)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do whose reply is lost: got %v, want context.DeadlineExceeded", err)
	}
	r, err := other.Do(ctx, key, "fp", fn)
	if err != nil || r.Replayed || string(r.Body) != "paid" {
		t.Fatalf("retry with NoWait: got %+v, %v; want fn run", r, err)
	}
	if n, err := l.count(ctx, "retry"); err != nil || n != 1 || calls.Load() != 1 {
		t.Fatalf("effects %d (%v), fn calls %d; want 1 and 1", n, err, calls.Load())
	}
}

// failScript makes every call of one script fail without reaching the
// server.
type failScript struct{ sha string }

var errInjected = errors.New("injected: the network is down")

func (h *failScript) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *failScript) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") &&
			(args[1] == h.sha || args[1] == abandonLua) {
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}
func (h *failScript) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestLostReplyNotReleased: when the clean-up after a lost reply fails too,
// the key stays pending under the lost token: another process waits for
// the lease (it cannot tell), but the callers of the store that lost the
// reply know that token is over and take the key over at once.
func TestLostReplyNotReleased(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	h := &failScript{sha: goredis.NewScript(abandonLua).Hash()}
	l := newLostReply(t, h)
	key := idempotency.Key{ID: testkit.Name("kept-")}
	l.reserveLate(t, key, l.proxy.stallReply)

	if txn, rec, err := l.other.Reserve(ctx, reservation(key, "fp", 0)); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("another process: got %v, %+v, %v; want ErrInProgress (the lost token holds the key)", txn, rec, err)
	}
	g, err := idempotency.New(l.store, &idempotency.Config{WaitTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	r, err := g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		calls.Add(1)
		_ = l.effect(ctx, tx, "kept")
		return idempotency.Response{Status: http.StatusCreated, Body: []byte("taken over")}, nil
	})
	if err != nil || r.Replayed || string(r.Body) != "taken over" {
		t.Fatalf("the same store with NoWait: got %+v, %v; want fn run at once", r, err)
	}
	if n, err := l.count(ctx, "kept"); err != nil || n != 1 || calls.Load() != 1 {
		t.Fatalf("effects %d (%v), fn calls %d; want 1 and 1", n, err, calls.Load())
	}
	if _, rec, err := l.other.Reserve(ctx, reservation(key, "fp", 0)); err != nil || rec == nil || string(rec.Body) != "taken over" {
		t.Fatalf("another process after the takeover: got %+v, %v; want the record", rec, err)
	}
}
