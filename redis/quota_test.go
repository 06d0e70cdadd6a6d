package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// quotaRig is two Stores, each with a client of its own, on one prefix.
func quotaRig(t *testing.T, newClient func() goredis.UniversalClient, prefix string) testkit.QuotaRig {
	var stores [2]*Store
	for i := range stores {
		c := newClient()
		t.Cleanup(func() { _ = c.Close() })
		s, err := New(c, &Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	t.Cleanup(func() {
		c := newClient()
		defer c.Close()
		dropPrefix(t, c, prefix)
	})
	g, err := idempotency.New(stores[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	return testkit.QuotaRig{A: stores[0], B: stores[1], SelfExpiring: true, Complete: func(ctx context.Context, key idempotency.Key) error {
		_, err := g.Do(ctx, key, "fp", func(*Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("done")}, nil
		})
		return err
	}}
}

// TestQuotaCounter runs the counter cases over two Stores on one Redis.
func TestQuotaCounter(t *testing.T) {
	addr := testenv.RedisAddr(t)
	rig := quotaRig(t, func() goredis.UniversalClient { return goredis.NewClient(&goredis.Options{Addr: addr}) }, newPrefix())
	testkit.QuotaCounter(t, rig)
}

// TestQuotaCounterCluster runs them on a three-master Cluster with a prefix
// without a hash tag: the counters and the records are in different slots,
// and a check takes its two steps.
func TestQuotaCounterCluster(t *testing.T) {
	addrs := startCluster(t)
	prefix := "idemquota:" + testkit.Name("p-") + ":"
	rig := quotaRig(t, func() goredis.UniversalClient {
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	}, prefix)
	if s := rig.A.(*Store); s.sharedSlot() || strings.Contains(prefix, "{") {
		t.Fatal("the prefix must leave the counters and the records in different slots")
	}
	testkit.QuotaCounter(t, rig)
}

// TestQuotaHashBounded: a scope keeps one window's three fields.
func TestQuotaHashBounded(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ctx := testkit.Context(t, 30*time.Second)
	rig := quotaRig(t, func() goredis.UniversalClient { return goredis.NewClient(&goredis.Options{Addr: addr}) }, newPrefix())
	s := rig.A.(*Store)
	q := backend.Quota{Window: time.Second, MaxKeys: 100}
	for range 3 {
		adm, err := s.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: "s", ID: testkit.Name("k")}, Quota: q})
		if err != nil || !adm.Counted {
			t.Fatalf("%+v, %v", adm, err)
		}
		time.Sleep(adm.RetryAfter + 20*time.Millisecond)
		n, err := s.client.HLen(ctx, s.quotaKey("s", q.Window)).Result()
		if err != nil || n > 3 {
			t.Fatalf("HLEN %d, %v; want at most 3 fields", n, err)
		}
	}
	if _, err := s.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: "s", ID: "k"}, Quota: q}); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.client.PTTL(ctx, s.quotaKey("s", q.Window)).Result(); err != nil || ttl <= 0 || ttl > time.Second {
		t.Fatalf("PTTL %v, %v; want the rest of the 1s window", ttl, err)
	}
}
