package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/observe"
)

// noQuota hides the in-memory store's QuotaCounter.
type noQuota struct {
	idempotency.KeyStore[*memstore.Tx]
}

func TestGuardAdmit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := memstore.New()
	g, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := &idempotency.Quota{Window: time.Minute, MaxKeys: 1}
	key := idempotency.Key{Scope: "acct", ID: "k1"}

	if _, err := g.AdmitQuota(ctx, idempotency.Key{Scope: "acct"}, q); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Errorf("empty id: %v, want ErrInvalidKey", err)
	}
	for _, bad := range []*idempotency.Quota{nil, {Window: time.Minute}, {Window: 999 * time.Millisecond, MaxKeys: 1},
		{Window: 25 * time.Hour, MaxKeys: 1}, {Window: 1500 * time.Millisecond, MaxKeys: 1}, {Window: time.Minute, MaxInFlight: -1}} {
		if _, err := g.AdmitQuota(ctx, key, bad); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("quota %+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
	plain, err := idempotency.New[*memstore.Tx](noQuota{s}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.AdmitQuota(ctx, key, q); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("a store without QuotaCounter: %v, want ErrUnsupported", err)
	}

	adm, err := g.AdmitQuota(ctx, key, q)
	if err != nil || !adm.Counted {
		t.Fatalf("first: %+v, %v", adm, err)
	}
	_, err = g.AdmitQuota(ctx, idempotency.Key{Scope: "acct", ID: "k2"}, q)
	qe, ok := errors.AsType[*idempotency.QuotaError](err)
	if !errors.Is(err, idempotency.ErrOverQuota) || !ok || qe.Limit != "keys" || qe.RetryAfter <= 0 || qe.RetryAfter > time.Minute {
		t.Fatalf("second: %v, want a QuotaError for keys", err)
	}
	if msg := err.Error(); strings.Contains(msg, "acct") || strings.Contains(msg, "k2") || !strings.Contains(msg, "#") {
		t.Errorf("error text %q names the key by scope or id", msg)
	}
	// The first key ends without an answer: given back, so k2 is counted.
	if err := g.EndQuota(ctx, key, q, adm, false, 0); err != nil {
		t.Fatal(err)
	}
	if adm, err := g.AdmitQuota(ctx, idempotency.Key{Scope: "acct", ID: "k2"}, q); err != nil || !adm.Counted {
		t.Fatalf("after the first ended unstored: %+v, %v", adm, err)
	}
	if err := g.EndQuota(ctx, key, q, idempotency.QuotaAdmission{Replay: true}, true, 5); err != nil {
		t.Errorf("ending a replay: %v, want nil (nothing to end)", err)
	}
	if n, err := g.PurgeQuota(ctx); err != nil || n != 0 {
		t.Errorf("PurgeQuota of live windows: %d, %v", n, err)
	}
	for l, want := range map[backend.QuotaLimit]string{backend.QuotaKeys: "keys", backend.QuotaInFlight: "in_flight", backend.QuotaBytes: "bytes", 9: "QuotaLimit(9)"} {
		if l.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(l), l.String(), want)
		}
	}
	if observe.OverQuota.String() != "over_quota" {
		t.Errorf("OverQuota.String() = %q", observe.OverQuota.String())
	}
}
