package testkit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// QuotaRig is what [QuotaCounter] runs its cases on: two instances of one
// store (two pools or clients on the same tables), and a way to complete a
// key on them.
type QuotaRig struct {
	A, B backend.QuotaCounter
	// Complete stores a completed record for key (through a Guard on A).
	Complete func(ctx context.Context, key idempotency.Key) error
	// SelfExpiring: the store's counters expire by themselves (Redis) and
	// PurgeQuota deletes nothing.
	SelfExpiring bool
}

// QuotaCounter runs the cases every [backend.QuotaCounter] must pass:
// 20 callers over two instances against MaxKeys 7 (exactly 7 counted),
// EndQuota giving back a key not created, MaxInFlight, MaxBytes, a
// replay that is neither counted nor refused, and PurgeQuota.
func QuotaCounter(t *testing.T, rig QuotaRig) {
	t.Run("keys_two_instances", func(t *testing.T) { quotaKeys(t, rig) })
	t.Run("end_gives_back", func(t *testing.T) { quotaEnd(t, rig) })
	t.Run("in_flight", func(t *testing.T) { quotaInFlight(t, rig) })
	t.Run("bytes", func(t *testing.T) { quotaBytes(t, rig) })
	t.Run("replay", func(t *testing.T) { quotaReplay(t, rig) })
	t.Run("purge", func(t *testing.T) { quotaPurge(t, rig) })
}

const quotaWindow = time.Hour

// admit admits key on c and fails t on an error.
func admit(t *testing.T, ctx context.Context, c backend.QuotaCounter, key idempotency.Key, q backend.Quota) backend.QuotaAdmission {
	t.Helper()
	adm, err := c.AdmitQuota(ctx, backend.QuotaCheck{Key: key, Quota: q})
	if err != nil {
		t.Fatalf("AdmitQuota: %v", err)
	}
	return adm
}

func end(t *testing.T, ctx context.Context, c backend.QuotaCounter, key idempotency.Key, q backend.Quota, adm backend.QuotaAdmission, created bool, bytes int64) {
	t.Helper()
	err := c.EndQuota(ctx, backend.QuotaEnd{Scope: key.Scope, Window: q.Window, WindowStart: adm.WindowStart, Created: created, Bytes: bytes})
	if err != nil {
		t.Fatalf("EndQuota: %v", err)
	}
}

func wantOver(t *testing.T, adm backend.QuotaAdmission, limit backend.QuotaLimit, window time.Duration) {
	t.Helper()
	if adm.Counted || adm.Replay || adm.Over != limit {
		t.Fatalf("admission %+v, want refused by %v", adm, limit)
	}
	if adm.RetryAfter <= 0 || adm.RetryAfter > window {
		t.Fatalf("RetryAfter %v, want in (0, %v]", adm.RetryAfter, window)
	}
}

func quotaKeys(t *testing.T, rig QuotaRig) {
	ctx := Context(t, 60*time.Second)
	q := backend.Quota{Window: quotaWindow, MaxKeys: 7}
	// A window boundary in the middle of the round splits it: try again.
	for range 3 {
		scope := Name("scope_")
		var counted, over atomic.Int64
		starts := make([]time.Time, 20)
		errs := make([]error, 20)
		Together(20, func(i int) {
			c := rig.A
			if i%2 == 1 {
				c = rig.B
			}
			adm, err := c.AdmitQuota(ctx, backend.QuotaCheck{Key: idempotency.Key{Scope: scope, ID: Name("k")}, Quota: q})
			errs[i], starts[i] = err, adm.WindowStart
			switch {
			case err != nil:
			case adm.Counted:
				counted.Add(1)
			case adm.Over == backend.QuotaKeys && adm.RetryAfter > 0 && adm.RetryAfter <= q.Window:
				over.Add(1)
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		same := true
		for _, s := range starts {
			same = same && s.Equal(starts[0])
		}
		if !same {
			continue
		}
		if counted.Load() != 7 || over.Load() != 13 {
			t.Fatalf("20 callers over two instances, MaxKeys 7: %d counted, %d refused by keys; want 7 and 13", counted.Load(), over.Load())
		}
		if s := starts[0]; s.UnixMilli()%q.Window.Milliseconds() != 0 || time.Since(s) > q.Window+time.Minute || time.Until(s) > time.Minute {
			t.Fatalf("WindowStart %v: want the start of the current hour", s)
		}
		return
	}
	t.Fatal("three rounds met a window boundary")
}

func quotaEnd(t *testing.T, rig QuotaRig) {
	ctx := Context(t, 60*time.Second)
	q := backend.Quota{Window: quotaWindow, MaxKeys: 2}
	scope := Name("scope_")
	k := func() idempotency.Key { return idempotency.Key{Scope: scope, ID: Name("k")} }
	k1, k2 := k(), k()
	a1, a2 := admit(t, ctx, rig.A, k1, q), admit(t, ctx, rig.B, k2, q)
	if !a1.Counted || !a2.Counted || !a1.WindowStart.Equal(a2.WindowStart) {
		t.Fatalf("two admissions %+v %+v, want both counted in one window", a1, a2)
	}
	wantOver(t, admit(t, ctx, rig.A, k(), q), backend.QuotaKeys, q.Window)
	end(t, ctx, rig.B, k1, q, a1, true, 0) // created: still counts
	wantOver(t, admit(t, ctx, rig.B, k(), q), backend.QuotaKeys, q.Window)
	end(t, ctx, rig.A, k2, q, a2, false, 0) // not created: given back
	if a := admit(t, ctx, rig.B, k(), q); !a.Counted {
		t.Fatalf("after a key not created: %+v, want counted", a)
	}
	wantOver(t, admit(t, ctx, rig.A, k(), q), backend.QuotaKeys, q.Window)
}

func quotaInFlight(t *testing.T, rig QuotaRig) {
	ctx := Context(t, 60*time.Second)
	q := backend.Quota{Window: quotaWindow, MaxInFlight: 2}
	scope := Name("scope_")
	k := func() idempotency.Key { return idempotency.Key{Scope: scope, ID: Name("k")} }
	k1 := k()
	a1 := admit(t, ctx, rig.A, k1, q)
	a2 := admit(t, ctx, rig.B, k(), q)
	if !a1.Counted || !a2.Counted {
		t.Fatalf("%+v %+v, want counted", a1, a2)
	}
	wantOver(t, admit(t, ctx, rig.A, k(), q), backend.QuotaInFlight, q.Window)
	end(t, ctx, rig.B, k1, q, a1, true, 0)
	if a := admit(t, ctx, rig.A, k(), q); !a.Counted {
		t.Fatalf("after one ended: %+v, want counted", a)
	}
	wantOver(t, admit(t, ctx, rig.B, k(), q), backend.QuotaInFlight, q.Window)
}

func quotaBytes(t *testing.T, rig QuotaRig) {
	ctx := Context(t, 60*time.Second)
	q := backend.Quota{Window: quotaWindow, MaxBytes: 10}
	scope := Name("scope_")
	k := func() idempotency.Key { return idempotency.Key{Scope: scope, ID: Name("k")} }
	k1 := k()
	a1 := admit(t, ctx, rig.A, k1, q)
	end(t, ctx, rig.A, k1, q, a1, true, 9)
	k2 := k()
	a2 := admit(t, ctx, rig.B, k2, q)
	if !a1.Counted || !a2.Counted {
		t.Fatalf("%+v %+v, want counted under 10 bytes", a1, a2)
	}
	end(t, ctx, rig.B, k2, q, a2, true, 1)
	wantOver(t, admit(t, ctx, rig.A, k(), q), backend.QuotaBytes, q.Window)
	wantOver(t, admit(t, ctx, rig.B, k(), q), backend.QuotaBytes, q.Window)
}

func quotaReplay(t *testing.T, rig QuotaRig) {
	ctx := Context(t, 60*time.Second)
	q := backend.Quota{Window: quotaWindow, MaxKeys: 1}
	scope := Name("scope_")
	done := idempotency.Key{Scope: scope, ID: Name("done")}
	if err := rig.Complete(ctx, done); err != nil {
		t.Fatal(err)
	}
	other := idempotency.Key{Scope: scope, ID: Name("other")}
	if a := admit(t, ctx, rig.A, other, q); !a.Counted {
		t.Fatalf("%+v, want counted", a)
	}
	// The quota is used up; the completed key replays on both instances,
	// again and again, and counts nothing.
	for _, c := range []backend.QuotaCounter{rig.A, rig.B, rig.A} {
		if a := admit(t, ctx, c, done, q); !a.Replay || a.Counted || a.Over != 0 {
			t.Fatalf("completed key: %+v, want a replay, not counted", a)
		}
	}
	wantOver(t, admit(t, ctx, rig.B, idempotency.Key{Scope: scope, ID: Name("new")}, q), backend.QuotaKeys, q.Window)
	// Same id in another scope is another key: counted there.
	if a := admit(t, ctx, rig.B, idempotency.Key{Scope: Name("scope_"), ID: done.ID}, q); !a.Counted {
		t.Fatalf("the id in another scope: %+v, want counted", a)
	}
}

func quotaPurge(t *testing.T, rig QuotaRig) {
	ctx := Context(t, 60*time.Second)
	q := backend.Quota{Window: time.Second, MaxKeys: 5}
	scope := Name("scope_")
	key := idempotency.Key{Scope: scope, ID: Name("k")}
	a := admit(t, ctx, rig.A, key, q)
	if !a.Counted {
		t.Fatalf("%+v, want counted", a)
	}
	want := 1
	if rig.SelfExpiring {
		want = 0
	}
	// Before the window ends nothing goes; after, its row does (the
	// other cases' windows are an hour long).
	if a.RetryAfter > 300*time.Millisecond {
		if n, err := rig.B.PurgeQuota(ctx, 1000); err != nil || n != 0 {
			t.Fatalf("PurgeQuota before the window ended: %d, %v; want 0, nil", n, err)
		}
	}
	time.Sleep(a.RetryAfter + 50*time.Millisecond)
	if n, err := rig.B.PurgeQuota(ctx, 1000); err != nil || n != want {
		t.Fatalf("PurgeQuota after the window ended: %d, %v; want %d, nil", n, err, want)
	}
	// The purged window is not recreated by a late end.
	end(t, ctx, rig.A, key, q, a, false, 5)
	if n, err := rig.B.PurgeQuota(ctx, 1000); err != nil || n != 0 {
		t.Fatalf("PurgeQuota again: %d, %v; want 0, nil", n, err)
	}
}
