package clusters

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
)

// streaming is the DSN suffix that turns on Galera's streaming replication
// for the store's sessions, one statement per fragment: the reservation's
// INSERT is replicated, certified and applied (its row locked) on every
// node before Reserve returns, so callers on other nodes wait for it as on
// one server.
const streaming = "&wsrep_trx_fragment_unit=%27statements%27&wsrep_trx_fragment_size=1"

// certStats sums the certification failures and brute-force aborts of the
// nodes in alive.
func certStats(t testing.TB, g *Galera, alive ...int) (certFailures, bfAborts int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, i := range alive {
		for name, dst := range map[string]*int{"wsrep_local_cert_failures": &certFailures, "wsrep_local_bf_aborts": &bfAborts} {
			v, err := g.Status(ctx, i, name)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := strconv.Atoi(v)
			*dst += n
		}
	}
	return certFailures, bfAborts
}

func TestGalera(t *testing.T) {
	start := time.Now()
	g := StartGalera(t)
	reapOnExit(t, g.nodes...)
	t.Logf("3-node Galera cluster up in %v", time.Since(start).Round(100*time.Millisecond))

	t.Run("Conformance", func(t *testing.T) {
		// Multi-writer with causal reads: the cases that need a caller
		// to wait for a key held on another node run on one node.
		t.Run("CausalReads", func(t *testing.T) { galeraConformance(t, g, causalReads, pinMultiWriter, true) })
		// Streaming replication: every caller spread, but for the cases
		// that call with no wait right after another node ended the key's
		// transaction.
		t.Run("Streaming", func(t *testing.T) { galeraConformance(t, g, streaming, pinStreaming, false) })
	})
	t.Run("SameKeyAcrossNodes", func(t *testing.T) {
		t.Run("Default", func(t *testing.T) { galeraSameKey(t, g, "") })
		t.Run("Streaming", func(t *testing.T) { galeraSameKey(t, g, streaming) })
	})
	t.Run("StreamingFirstTry", func(t *testing.T) { galeraFirstTry(t, g) })
	t.Run("StreamingWaits", func(t *testing.T) { galeraStreamingWaits(t, g) })
	t.Run("Latency", func(t *testing.T) { galeraLatency(t, g) })
	t.Run("CertificationFailureRetried", func(t *testing.T) { galeraCertification(t, g) })
	t.Run("Operations", func(t *testing.T) { galeraOperations(t, g) })
	t.Run("NodeKilled", func(t *testing.T) { galeraNodeKilled(t, g) })
}

// galeraLatency measures sequential calls with new keys on node 1, with
// and without streaming replication: what the cross-node locks cost.
func galeraLatency(t *testing.T, g *Galera) {
	const n = 200
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var per [2]time.Duration
	for m, extra := range []string{"", streaming} {
		f := newGaleraFixture(t, g, 0, extra, nil)
		gd, err := idempotency.New[*sql.Tx](f.spread(0), nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for i := range n {
			key := idempotency.Key{Scope: "lat", ID: fmt.Sprintf("lat-%d-%s", i, rand.Text()[:6])}
			if _, err := gd.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201}, f.fx.Effect(ctx, tx, key.ID)
			}); err != nil {
				t.Fatal(err)
			}
		}
		per[m] = time.Since(start) / n
	}
	t.Logf("sequential new keys on node 1: %v per call with default settings, %v with streaming replication (one statement per fragment)",
		per[0].Round(time.Microsecond), per[1].Round(time.Microsecond))
}

// galeraSameKey fires 21 callers of one key, 7 per node, released
// together, for several rounds (the winner failing in one): every round
// gives one effect and identical answers, no caller sees a conflict, and
// fn's runs on the nodes that lost are rolled back.
func galeraSameKey(t *testing.T, g *Galera, dsnExtra string) {
	const rounds, callers = 8, 21
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, dsnExtra, nil)
	cf0, bf0 := certStats(t, g, 0, 1, 2)
	guards := make([]*idempotency.Guard[*sql.Tx], GaleraNodes)
	var retried atomic.Int64
	for i := range guards {
		gd, err := idempotency.New[*sql.Tx](f.spread(i), &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) {
			if ev.Attempts > 1 {
				retried.Add(1)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = gd
	}
	var totalRuns int64
	winnerErrSeen := false
	for round := range rounds {
		key := idempotency.Key{Scope: "galera", ID: testkit.Name(fmt.Sprintf("same-%d-", round))}
		tag := key.ID
		failWinner := round == rounds-1
		var runs atomic.Int64
		type res struct {
			resp idempotency.Response
			err  error
		}
		out := make([]res, callers)
		errWinner := errors.New("the first run fails")
		testkit.Together(callers, func(c int) {
			out[c].resp, out[c].err = guards[c%GaleraNodes].Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				n := runs.Add(1)
				if err := f.fx.Effect(ctx, tx, tag); err != nil {
					return idempotency.Response{}, err
				}
				if failWinner && n == 1 {
					time.Sleep(200 * time.Millisecond)
					return idempotency.Response{}, errWinner
				}
				return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"run":%d,"node":%d}`, n, c%GaleraNodes+1)}, nil
			})
		})
		var first []byte
		executed, failed := 0, 0
		for c, r := range out {
			switch {
			case failWinner && errors.Is(r.err, errWinner):
				failed++
				continue
			case r.err != nil:
				t.Fatalf("round %d: caller %d (node %d) got %v; a certification conflict must be retried, never surfaced", round, c, c%GaleraNodes+1, r.err)
			}
			if !r.resp.Replayed {
				executed++
			}
			if first == nil {
				first = r.resp.Body
			} else if !bytes.Equal(first, r.resp.Body) {
				t.Fatalf("round %d: caller %d got %s, others %s", round, c, r.resp.Body, first)
			}
		}
		// The caller whose fn fails sees its error, unless a caller on
		// another node completed the key first: Galera has then already
		// aborted the failing transaction (its rollback reports 1213), Do
		// retries, and that caller gets the completed answer.
		if executed != 1 || failed > 1 {
			t.Fatalf("round %d: %d callers executed, %d saw the failing run's error; want 1 and at most 1", round, executed, failed)
		}
		if failWinner {
			winnerErrSeen = failed == 1
		}
		n, err := f.fx.Count(ctx, tag)
		if err != nil || n != 1 {
			t.Fatalf("round %d: %d effects committed (%v), want 1", round, n, err)
		}
		totalRuns += runs.Load()
	}
	cf1, bf1 := certStats(t, g, 0, 1, 2)
	if dsnExtra == streaming && (totalRuns != rounds+1 || !winnerErrSeen) {
		// With streaming replication the callers on other nodes wait for
		// the reservation: fn runs once per round, twice in the round
		// whose first run fails, and that caller sees its error.
		t.Fatalf("streaming replication: fn ran %d times over %d rounds, failing run's error seen: %v; want %d and true",
			totalRuns, rounds, winnerErrSeen, rounds+1)
	}
	t.Logf("%d rounds of %d callers (7 per node): 1 effect and identical answers each; fn ran %d times in all (%d runs rolled back), %d calls needed more than one attempt; cluster counters: %d certification failures, %d brute-force aborts; failing run's error seen by its caller: %v",
		rounds, callers, totalRuns, totalRuns-int64(rounds)-1, retried.Load(), cf1-cf0, bf1-bf0, winnerErrSeen)
}

// galeraCertification makes the conflict deterministic: a caller on node
// 1 reserves a key and runs fn, a caller on node 2 meanwhile runs the same
// key to completion (it does not wait: node 2 knows nothing of node 1's
// uncommitted row). Node 1's transaction is then rolled back by Galera,
// either at its COMMIT (1213, certification failure) or, once node 2's
// write set is applied on node 1, in fn's next statement (1213,
// brute-force abort). Either way Do retries and answers node 2's response
// as a replay; fn's first run leaves no effect.
func galeraCertification(t *testing.T, g *Galera) {
	for _, c := range []struct {
		name      string
		statement bool // fn runs a statement after the other node committed
	}{{"AtCommit", false}, {"InFnStatement", true}} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f := newGaleraFixture(t, g, 0, "", nil)
			var attempts1 atomic.Int64
			g1, err := idempotency.New[*sql.Tx](f.spread(0), &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) {
				attempts1.Store(int64(ev.Attempts))
			}})
			if err != nil {
				t.Fatal(err)
			}
			g2, err := idempotency.New[*sql.Tx](f.spread(1), nil)
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{Scope: "galera", ID: "cert-" + rand.Text()[:10]}
			inFn := make(chan struct{})
			otherDone := make(chan struct{})
			var runs1 atomic.Int64
			type res struct {
				resp idempotency.Response
				err  error
			}
			first := make(chan res, 1)
			go func() {
				resp, err := g1.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					n := runs1.Add(1)
					if err := f.fx.Effect(ctx, tx, "node1"); err != nil {
						return idempotency.Response{}, err
					}
					if n == 1 {
						close(inFn)
						<-otherDone
						if c.statement {
							if err := f.fx.Effect(ctx, tx, "node1-again"); err != nil {
								return idempotency.Response{}, err
							}
						}
					}
					return idempotency.Response{Status: 201, Body: []byte(`{"node":1}`)}, nil
				})
				first <- res{resp, err}
			}()
			select {
			case <-inFn:
			case r := <-first:
				t.Fatalf("node 1 returned before running fn: %+v", r)
			}
			r2, err := g2.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				if err := f.fx.Effect(ctx, tx, "node2"); err != nil {
					return idempotency.Response{}, err
				}
				return idempotency.Response{Status: 201, Body: []byte(`{"node":2}`)}, nil
			})
			if err != nil || r2.Replayed {
				t.Fatalf("node 2 while node 1 holds the key: %+v, %v; want executed (no lock across nodes)", r2, err)
			}
			if c.statement {
				// Let node 2's write set reach node 1 and abort its
				// transaction before fn's next statement.
				time.Sleep(300 * time.Millisecond)
			}
			close(otherDone)
			r1 := <-first
			if r1.err != nil {
				t.Fatalf("node 1 after losing certification: %v; want the conflict retried, never surfaced", r1.err)
			}
			if !r1.resp.Replayed || string(r1.resp.Body) != `{"node":2}` {
				t.Fatalf("node 1: got %+v %s, want node 2's answer replayed", r1.resp, r1.resp.Body)
			}
			if runs1.Load() != 1 || attempts1.Load() != 2 {
				t.Fatalf("node 1: fn ran %d times in %d attempts, want 1 run, rolled back, then a replay (2 attempts)", runs1.Load(), attempts1.Load())
			}
			for tag, want := range map[string]int{"node1": 0, "node1-again": 0, "node2": 1} {
				if n, err := f.fx.Count(ctx, tag); err != nil || n != want {
					t.Fatalf("effects %q: %d (%v), want %d", tag, n, err, want)
				}
			}
		})
	}
}
