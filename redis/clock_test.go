package redis

import (
	"context"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// clockHook is a go-redis hook that shows every command and its arguments
// to a testkit.ClockArgs.
type clockHook struct{ *testkit.ClockArgs }

func (c clockHook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (c clockHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.See(cmd.Name(), cmd.Args()...)
		return next(ctx, cmd)
	}
}

func (c clockHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			c.See(cmd.Name(), cmd.Args()...)
		}
		return next(ctx, cmds)
	}
}

// TestServerClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed) on Redis's
// clock: with the default Config, no command of two Stores on two clients
// carries a time of the application, so the instances' clocks cannot
// matter (testkit.ClockOnly; records expire on their own, so no Purge).
func TestServerClockOnly(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	ca := &testkit.ClockArgs{}
	addr := testenv.RedisAddr(t)
	newClient := func(poolSize int) goredis.UniversalClient {
		c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: poolSize})
		c.AddHook(clockHook{ca})
		return c
	}
	f := newFixture(t, newClient, 0, nil)
	store := func(cfg *Config) idempotency.KeyStore[*Tx] {
		s, err := New(newClient(0), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	testkit.ClockOnly(t, ctx, testkit.ClockOnlyCase[*Tx]{
		Store:   f.store,
		Other:   store(&Config{Prefix: f.prefix}),
		Clocked: func() idempotency.KeyStore[*Tx] { return store(&Config{Prefix: f.prefix, Clock: time.Now}) },
		Effect:  f.effect,
		Count:   f.count,
		Sent:    ca.Sent,
		NoPurge: true,
		Unit:    "commands",
	})
}
