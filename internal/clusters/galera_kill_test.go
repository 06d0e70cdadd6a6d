package clusters

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// galeraNodeKilled runs calls on all three nodes (two callers each, a new
// key per call), kills node 3 with SIGKILL, and goes on: callers whose node
// failed retry the same key on the next node, as a client retries through
// a load balancer. Calls continue on nodes 1 and 2, and every key ends with
// exactly one effect and, when it was answered, the answer it was given.
func galeraNodeKilled(t *testing.T, g *Galera) {
	const perNode, before, after = 2, 150, 150
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, "", nil)
	guards := make([]*idempotency.Guard[*sql.Tx], GaleraNodes)
	for i := range guards {
		gd, err := idempotency.New[*sql.Tx](f.spread(i), &idempotency.Config{WaitTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = gd
	}
	type keyCall struct {
		key      idempotency.Key
		body     []byte
		acked    bool
		failures int
	}
	var (
		mu       sync.Mutex
		calls    []*keyCall
		acks     atomic.Int64
		stop     atomic.Bool
		killed   atomic.Bool
		survAcks atomic.Int64 // answers on nodes 1-2 after the kill
		maxPause atomic.Int64 // longest call on nodes 1-2 around the kill, ns
		failover atomic.Int64 // calls that failed on a node and were retried on another
	)
	var wg sync.WaitGroup
	for node := range GaleraNodes {
		for w := range perNode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					c := &keyCall{key: idempotency.Key{Scope: "galera", ID: fmt.Sprintf("kill-%d-%d-%d", node, w, i)}}
					mu.Lock()
					calls = append(calls, c)
					mu.Unlock()
					fn := func(tx *sql.Tx) (idempotency.Response, error) {
						if err := f.fx.Effect(ctx, tx, c.key.ID); err != nil {
							return idempotency.Response{}, err
						}
						return idempotency.Response{Status: 201, Body: []byte(c.key.ID + "@" + rand.Text()[:8])}, nil
					}
					for try, n := 0, node; try < 20 && ctx.Err() == nil; try, n = try+1, (n+1)%GaleraNodes {
						if killed.Load() && n == 2 {
							continue // the load balancer has taken node 3 out
						}
						startCall := time.Now()
						resp, err := guards[n].Do(ctx, c.key, "fp", fn)
						if err != nil {
							c.failures++
							failover.Add(1)
							continue
						}
						if n != 2 && killed.Load() {
							survAcks.Add(1)
							if d := int64(time.Since(startCall)); d > maxPause.Load() {
								maxPause.Store(d)
							}
						}
						c.acked, c.body = true, resp.Body
						acks.Add(1)
						break
					}
				}
			}()
		}
	}
	waitAcks := func(n int64) {
		deadline := time.Now().Add(60 * time.Second)
		for acks.Load() < n {
			if time.Now().After(deadline) {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("only %d of %d calls answered:\n%s", acks.Load(), n, g.Log(0))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	start := time.Now()
	waitAcks(before)
	killedAt := time.Now()
	g.Kill(2)
	killed.Store(true)
	waitAcks(acks.Load() + after)
	stop.Store(true)
	wg.Wait()
	if n := survAcks.Load(); n < after/2 {
		t.Fatalf("only %d calls answered on nodes 1-2 after node 3 was killed", n)
	}
	g.AwaitSize(0, 1)

	// Every key: exactly one effect; an answered key replays its answer.
	check, err := idempotency.New[*sql.Tx](f.spread(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	unanswered := 0
	for _, c := range calls {
		resp, err := check.Do(ctx, c.key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			if err := f.fx.Effect(ctx, tx, c.key.ID); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: 201, Body: []byte(c.key.ID + "@check")}, nil
		})
		if err != nil {
			t.Fatalf("key %s after the kill: %v", c.key.ID, err)
		}
		if c.acked && (!resp.Replayed || !bytes.Equal(resp.Body, c.body)) {
			t.Fatalf("key %s: answered %s, now %s (replayed %v): a second effect", c.key.ID, c.body, resp.Body, resp.Replayed)
		}
		if !c.acked {
			unanswered++
		}
		if n, err := f.fx.Count(ctx, c.key.ID); err != nil || n != 1 {
			t.Fatalf("key %s: %d effects (%v), want 1", c.key.ID, n, err)
		}
	}
	t.Logf("%d calls, %d answered (%d on nodes 1-2 after node 3 was killed, %v after it started), %d unanswered; %d failed attempts retried on another node; longest call on a survivor after the kill: %v; 0 second effects",
		len(calls), acks.Load(), survAcks.Load(), killedAt.Sub(start).Round(time.Millisecond), unanswered, failover.Load(), time.Duration(maxPause.Load()).Round(time.Millisecond))
}
