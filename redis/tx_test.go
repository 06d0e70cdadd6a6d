package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestTxQueuesOnly: Exec is refused inside fn, Pipelined only queues, and
// the queued commands' results are there after Do.
func TestTxQueuesOnly(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var incr *goredis.IntCmd
	_, err = g.Do(ctx, idempotency.Key{ID: testkit.Name("q-")}, "fp", func(tx *Tx) (idempotency.Response, error) {
		if _, err := tx.Exec(ctx); !errors.Is(err, errExec) {
			return idempotency.Response{}, fmt.Errorf("Exec: got %v, want errExec", err)
		}
		cmds, err := tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			incr = p.IncrBy(ctx, tx.Key("n"), 5)
			return nil
		})
		if err != nil || len(cmds) != 1 {
			return idempotency.Response{}, fmt.Errorf("TxPipelined: %v, %d cmds", err, len(cmds))
		}
		if n, _ := f.client.Exists(ctx, tx.Key("n")).Result(); n != 0 {
			return idempotency.Response{}, errors.New("a queued command ran before completion")
		}
		return idempotency.Response{Status: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if incr.Val() != 5 || incr.Err() != nil {
		t.Fatalf("queued INCRBY after Do: got %d, %v; want 5", incr.Val(), incr.Err())
	}
}

// TestQueuedCommandErrors: a command Redis refuses when it is queued aborts
// the whole transaction (nothing applied, key free); one that fails when it
// runs does not stop the others, and Complete reports it.
func TestQueuedCommandErrors(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	f := newFixture(t, singleClient(t), 0, nil)
	g, err := idempotency.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}

	key := idempotency.Key{ID: testkit.Name("abort-")}
	_, err = g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "abort")
		tx.Do(ctx, "incr") // wrong arity: refused when queued
		return idempotency.Response{Status: 201}, nil
	})
	if !goredis.IsExecAbortError(err) {
		t.Fatalf("a command refused when queued: got %v, want EXECABORT", err)
	}
	if n, err := f.count(ctx, "abort"); err != nil || n != 0 {
		t.Fatalf("effects after EXECABORT: got %d, %v; want 0", n, err)
	}
	r, err := g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		_ = f.effect(ctx, tx, "abort")
		return idempotency.Response{Status: 201}, nil
	})
	if err != nil || r.Replayed {
		t.Fatalf("after EXECABORT the key must be free: got %+v, %v", r, err)
	}

	key = idempotency.Key{ID: testkit.Name("runtime-")}
	notNumber := f.prefix + "not-a-number"
	if err := f.client.Set(ctx, notNumber, "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(ctx, key, "fp", func(tx *Tx) (idempotency.Response, error) {
		tx.Incr(ctx, notNumber) // fails when EXEC runs it
		_ = f.effect(ctx, tx, "runtime")
		return idempotency.Response{Status: 201, Body: []byte("stored")}, nil
	})
	if err == nil {
		t.Fatal("a command failing inside EXEC: got nil, want its error")
	}
	t.Logf("run-time failure reported as: %v", err)
	if n, err := f.count(ctx, "runtime"); err != nil || n != 1 {
		t.Fatalf("the other queued command: got %d, %v; want 1 (Redis does not roll back)", n, err)
	}
	r, err = g.Do(ctx, key, "fp", func(*Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("must replay")
	})
	if err != nil || !r.Replayed || string(r.Body) != "stored" {
		t.Fatalf("the key is completed despite the failed command: got %+v, %v", r, err)
	}
}

// interfere runs touch once, just before the first MULTI/EXEC that the
// client sends, i.e. after Complete's WATCH and token check.
type interfere struct {
	once  sync.Once
	touch func()
}

func (h *interfere) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *interfere) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return next
}

func (h *interfere) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			h.once.Do(h.touch)
		}
		return next(ctx, cmds)
	}
}

// TestWatchRace: a write to the record between Complete's check and its
// EXEC aborts the EXEC. A touch that leaves the caller the owner (a late
// renewal) is retried and succeeds; a takeover gives ErrLeaseLost and
// applies nothing.
func TestWatchRace(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	addr := testenv.RedisAddr(t)
	other := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = other.Close() })
	for _, tc := range []struct {
		name     string
		touch    func(s *Store, rec string)
		wantErr  error
		wantRuns int
	}{
		{"LateRenewal", func(s *Store, rec string) {
			other.PExpire(ctx, rec, time.Minute)
		}, nil, 1},
		{"Takeover", func(s *Store, rec string) {
			other.HSet(ctx, rec, "owner", "someone-else")
		}, backend.ErrLeaseLost, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &interfere{}
			f := newFixture(t, hooked(addr, h), 0, nil)
			key := idempotency.Key{ID: testkit.Name("race-")}
			h.touch = func() { tc.touch(f.store, f.store.keysFor(key).rec) }
			txn, _, err := f.store.Reserve(ctx, reservation(key, "fp", 0))
			if err != nil || txn == nil {
				t.Fatal(err)
			}
			_ = f.effect(ctx, txn.Tx(), "race")
			err = txn.Complete(ctx, idempotency.Response{Status: 201})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Complete: got %v, want %v", err, tc.wantErr)
			}
			if n, err := f.count(ctx, "race"); err != nil || n != tc.wantRuns {
				t.Fatalf("effects: got %d, %v; want %d", n, err, tc.wantRuns)
			}
		})
	}
}
