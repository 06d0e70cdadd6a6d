package clusters

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// galeraOperations runs operations (Guard.Run) with callers on several
// nodes of a multi-writer cluster, where a phase's lease and a new key's
// row are certified only at COMMIT.
func galeraOperations(t *testing.T, g *Galera) {
	t.Run("LocalStepConflictRetried", func(t *testing.T) { galeraOpLocalConflict(t, g) })
	t.Run("ForeignUnderOneLease", func(t *testing.T) { galeraOpForeignOnce(t, g) })
}

// galeraOpLocalConflict is CertificationFailureRetried/InFnStatement for
// an operation's Local step: node 1's run is in the first Local step of a
// new key when node 2's run of that key completes; node 1's next statement
// is aborted by the applier (1213). As Do does for fn, Run must retry the
// conflict and answer node 2's response as a replay.
func galeraOpLocalConflict(t *testing.T, g *Galera) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, "", nil)
	g1, err := idempotency.New[*sql.Tx](f.spread(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := idempotency.New[*sql.Tx](f.spread(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	inStep, otherDone := make(chan struct{}), make(chan struct{})
	var runs1 atomic.Int64
	op := func(node int) *idempotency.Operation[*sql.Tx] {
		return &idempotency.Operation[*sql.Tx]{
			Name: "order",
			Steps: []idempotency.Step[*sql.Tx]{{Name: "write", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
				if err := f.fx.Effect(ctx, tx, fmt.Sprint("node", node)); err != nil || node != 1 || runs1.Add(1) != 1 {
					return err
				}
				close(inStep)
				<-otherDone
				time.Sleep(300 * time.Millisecond) // node 2's write set reaches node 1
				return f.fx.Effect(ctx, tx, "node1-again")
			}}},
			Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"node":%d}`, node)}, nil
			},
		}
	}
	key := idempotency.Key{Scope: "galera", ID: testkit.Name("op-cert-")}
	type res struct {
		resp idempotency.Response
		err  error
	}
	first := make(chan res, 1)
	go func() {
		r, err := g1.Run(ctx, key, "fp", nil, op(1))
		first <- res{r, err}
	}()
	select {
	case <-inStep:
	case r := <-first:
		t.Fatalf("node 1 returned before its Local step: %+v", r)
	}
	r2, err := g2.Run(ctx, key, "fp", nil, op(2))
	close(otherDone)
	if err != nil || r2.Replayed {
		t.Fatalf("node 2 while node 1's phase is open: %+v, %v; want executed (no lock across nodes)", r2, err)
	}
	r1 := <-first
	if r1.err != nil || !r1.resp.Replayed || string(r1.resp.Body) != `{"node":2}` {
		t.Fatalf("node 1, whose Local step the applier aborted: %+v %s, %v; want node 2's answer replayed (the conflict retried, as Do retries fn's)", r1.resp, r1.resp.Body, r1.err)
	}
	for tag, want := range map[string]int{"node1": 0, "node1-again": 0, "node2": 1} {
		if n, err := f.fx.Count(ctx, tag); err != nil || n != want {
			t.Fatalf("effects %q: %d (%v), want %d", tag, n, err, want)
		}
	}
}

// galeraOpForeignOnce: a key left unfinished before its Foreign step, its
// lease released; 9 callers, 3 per node, resume it at once. Runs on
// several nodes may each take the lease in an open phase, certification
// letting one commit; only the run whose lease committed may call the
// other system ("While it lasts, other processes wait for the run or get
// ErrInProgress"), so the Foreign step runs once per round.
func galeraOpForeignOnce(t *testing.T, g *Galera) {
	const rounds, callers = 5, 9
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, causalReads, nil)
	guards := make([]*idempotency.Guard[*sql.Tx], GaleraNodes)
	for i := range guards {
		gd, err := idempotency.New[*sql.Tx](f.spread(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = gd
	}
	for round := range rounds {
		tag := testkit.Name(fmt.Sprintf("op-foreign-%d-", round))
		var calls, inFlight, most atomic.Int64
		var down atomic.Bool
		down.Store(true)
		op := &idempotency.Operation[*sql.Tx]{
			Name: "checkout",
			Steps: []idempotency.Step[*sql.Tx]{
				{Name: "order", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
					return f.fx.Effect(ctx, tx, tag+"-order")
				}},
				{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
					if down.CompareAndSwap(true, false) {
						return errors.New("the processor is down once")
					}
					calls.Add(1)
					n := inFlight.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(50 * time.Millisecond)
					inFlight.Add(-1)
					s.Set("charge", s.Key().Derive("charge")[:8])
					return nil
				}},
			},
			Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Body: []byte(s.Get("charge"))}, f.fx.Effect(ctx, tx, tag+"-finish")
			},
			Lease: 10 * time.Second,
		}
		key := idempotency.Key{Scope: "galera", ID: tag}
		if _, err := guards[0].Run(ctx, key, "fp", nil, op); !errors.Is(err, idempotency.ErrUnfinished) {
			t.Fatalf("round %d: first run: %v; want ErrUnfinished", round, err)
		}
		out := make([]idempotency.Response, callers)
		errs := make([]error, callers)
		testkit.Together(callers, func(c int) { out[c], errs[c] = guards[c%GaleraNodes].Run(ctx, key, "fp", nil, op) })
		for c := range callers {
			if errs[c] != nil || !bytes.Equal(out[c].Body, out[0].Body) {
				t.Fatalf("round %d: caller %d (node %d): %s, %v; want %s", round, c, c%GaleraNodes+1, out[c].Body, errs[c], out[0].Body)
			}
		}
		for _, s := range []string{"-order", "-finish"} {
			if n, err := f.fx.Count(ctx, tag+s); err != nil || n != 1 {
				t.Fatalf("round %d: effects %q: %d (%v), want 1", round, tag+s, n, err)
			}
		}
		if calls.Load() != 1 {
			t.Fatalf("round %d: the Foreign step ran %d times (%d at once) for %d callers on %d nodes; want once, by the run whose lease committed", round, calls.Load(), most.Load(), callers, GaleraNodes)
		}
	}
}
