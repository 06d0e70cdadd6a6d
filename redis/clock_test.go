package redis

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// clockArgs is a go-redis hook that collects the command arguments that
// look like a reading of the application's clock: a time.Time, or an
// integer (or a string of digits) within a day of now in Unix seconds,
// milliseconds, microseconds or nanoseconds.
type clockArgs struct {
	mu   sync.Mutex
	n    atomic.Int64 // commands seen
	seen []string
}

func (c *clockArgs) see(cmd goredis.Cmder) {
	c.n.Add(1)
	now := time.Now()
	near := func(v, unit int64) bool {
		d := v - now.UnixNano()/unit
		return d < int64(24*time.Hour)/unit && d > -int64(24*time.Hour)/unit
	}
	for _, a := range cmd.Args() {
		var v int64
		switch a := a.(type) {
		case time.Time, time.Duration:
			c.add(cmd, a)
			continue
		case int64:
			v = a
		case int:
			v = int64(a)
		case string:
			n, err := strconv.ParseInt(a, 10, 64)
			if err != nil {
				continue
			}
			v = n
		default:
			continue
		}
		if near(v, 1) || near(v, 1e3) || near(v, 1e6) || near(v, 1e9) {
			c.add(cmd, a)
		}
	}
}

func (c *clockArgs) add(cmd goredis.Cmder, a any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, fmt.Sprintf("%s: %v", cmd.Name(), a))
}

func (c *clockArgs) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen...)
}

func (c *clockArgs) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (c *clockArgs) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.see(cmd)
		return next(ctx, cmd)
	}
}

func (c *clockArgs) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			c.see(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestRedisClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed) on Redis's
// clock: with the default Config, no command of two Stores on two clients
// carries a time of the application (new key, replay, a waiter on the
// other Store, an expired record taken over), so the instances' clocks
// cannot matter: the waiter replays the holder's answer, one effect. A
// Store with Config.Clock does send it (the check can fail).
func TestRedisClockOnly(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	ca := &clockArgs{}
	addr := testenv.RedisAddr(t)
	newClient := func(poolSize int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: poolSize})
		c.AddHook(ca)
		return c
	}
	f := newFixture(t, newClient, 0, nil)
	other, err := New(newClient(0), &Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &idempotency.Config{TTL: 10 * time.Minute}
	newGuard := func(s *Store, cfg *idempotency.Config) *idempotency.Guard[*Tx] {
		g, err := idempotency.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	holder, waiter := newGuard(f.store, cfg), newGuard(other, cfg)
	key := idempotency.Key{ID: "skew"}
	fn := func(tx *Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("paid")}, f.effect(ctx, tx, "pay")
	}
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := holder.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
			close(held)
			<-release
			return fn(tx)
		})
		done <- err
	}()
	<-held
	type result struct {
		r   idempotency.Response
		err error
	}
	wdone := make(chan result, 1)
	go func() {
		r, err := waiter.Do(ctx, key, "fp", fn)
		wdone <- result{r, err}
	}()
	time.Sleep(300 * time.Millisecond) // the waiter waits for the key
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if w := <-wdone; w.err != nil || !w.r.Replayed || string(w.r.Body) != "paid" {
		t.Fatalf("waiter on another Store: %+v, %v; want the holder's answer replayed", w.r, w.err)
	}
	if r, err := holder.Do(ctx, key, "fp", fn); err != nil || !r.Replayed {
		t.Fatalf("retry: %+v, %v; want replayed", r, err)
	}
	testkit.MustCount(t, ctx, f.count, "pay", 1)

	// An expired record, on Redis's clock: taken over.
	short := newGuard(f.store, &idempotency.Config{TTL: time.Millisecond})
	exp := idempotency.Key{ID: "short"}
	for i := range 2 {
		if r, err := short.Do(ctx, exp, "fp", fn); err != nil || r.Replayed {
			t.Fatalf("TTL 1ms, call %d 20ms apart: %+v, %v; want executed", i, r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sent := ca.list(); len(sent) != 0 || ca.n.Load() == 0 {
		t.Fatalf("%d commands, %d arguments like a time of the application, want none: %q", ca.n.Load(), len(sent), sent)
	}

	// The control: a test clock is sent.
	clocked, err := New(newClient(0), &Config{Prefix: f.prefix, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newGuard(clocked, nil).Do(ctx, idempotency.Key{ID: "clocked"}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if len(ca.list()) == 0 {
		t.Fatal("a Store with Config.Clock sent no time: the check sees nothing")
	}
}
