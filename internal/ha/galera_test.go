package ha

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/mysql"
)

// spread is a KeyStore over the three nodes of a Galera cluster, one
// mysql.Store (and pool) per node, as three service instances behind a
// load balancer would be: each Reserve goes to the next node in turn, or
// always to node pin when pin >= 0.
type spread struct {
	stores []*mysql.Store
	pin    int
	next   atomic.Uint64
	// onNode counts the reservations sent to each node.
	onNode [GaleraNodes]atomic.Int64
}

var (
	_ idempotency.KeyStore[*sql.Tx]  = (*spread)(nil)
	_ idempotency.ConflictClassifier = (*spread)(nil)
)

func (s *spread) node() int {
	if s.pin >= 0 {
		return s.pin
	}
	return int(s.next.Add(1) % uint64(len(s.stores)))
}

func (s *spread) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*sql.Tx], *idempotency.Record, error) {
	i := s.node()
	s.onNode[i].Add(1)
	return s.stores[i].Reserve(ctx, r)
}

func (s *spread) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	return s.stores[s.node()].Purge(ctx, before, limit)
}

// IsConflict is the mysql store's: 1213 (a certification failure, or a
// brute-force abort by the replication applier, both reported as
// deadlocks) is retried.
func (s *spread) IsConflict(err error) bool { return s.stores[0].IsConflict(err) }

// galeraFixture is one keys table and one effects table on the cluster,
// with a pool and a Store per node.
type galeraFixture struct {
	table, effects string
	dbs            []*sql.DB
	stores         []*mysql.Store
	count          *sql.DB // node 1, reads wait for the cluster (wsrep_sync_wait)
}

func newGaleraFixture(t testing.TB, g *Galera, maxConns int, dsnExtra string) *galeraFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &galeraFixture{table: "ha_" + strings.ToLower(rand.Text()[:10])}
	f.effects = f.table + "_fx"
	for i := range GaleraNodes {
		db, err := mysql.Open(g.DSN(i, "test") + dsnExtra)
		if err != nil {
			t.Fatal(err)
		}
		if maxConns > 0 {
			db.SetMaxOpenConns(maxConns)
		}
		db.SetMaxIdleConns(max(maxConns, 16))
		t.Cleanup(func() { _ = db.Close() })
		s, err := mysql.New(db, &mysql.Config{Table: f.table})
		if err != nil {
			t.Fatal(err)
		}
		f.dbs = append(f.dbs, db)
		f.stores = append(f.stores, s)
	}
	count, err := sql.Open("mysql", g.DSN(0, "test")+"&wsrep_sync_wait=1")
	if err != nil {
		t.Fatal(err)
	}
	f.count = count
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, tb := range []string{f.table, f.effects} {
			_, _ = count.ExecContext(ctx, "DROP TABLE IF EXISTS `"+tb+"`")
		}
		_ = count.Close()
	})
	if err := f.stores[0].Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Galera wants a primary key on every replicated table.
	if _, err := f.dbs[0].ExecContext(ctx, "CREATE TABLE `"+f.effects+"` (n BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARBINARY(1024) NOT NULL, KEY (tag)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *galeraFixture) spread(pin int) *spread { return &spread{stores: f.stores, pin: pin} }

func (f *galeraFixture) effect(ctx context.Context, tx *sql.Tx, tag string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO `"+f.effects+"` (tag) VALUES (?)", []byte(tag))
	return err
}

func (f *galeraFixture) countOf(ctx context.Context, tag string) (int, error) {
	var n int
	err := f.count.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.effects+"` WHERE tag = ?", []byte(tag)).Scan(&n)
	return n, err
}

// nodeLocalCases are the conformance cases that hold a key on one caller
// and expect the others to wait for it (or that assert fn ran exactly
// once). Galera takes no lock across nodes: a caller on another node does
// not wait, runs fn too, and is rolled back by certification. These cases
// run with all their callers on one node (a different one per case); the
// cross-node behaviour is asserted by TestGalera's own subtests.
var nodeLocalCases = map[string]bool{
	"ConcurrentSameKey":          true,
	"WinnerFailsWhileOthersWait": true,
	"WaiterGetsReplay":           true,
	"WaitBound":                  true,
	"NoWait":                     true,
	"CancelWhileWaiting":         true,
	// Two purges on two nodes may delete the same expired rows; the
	// second fails certification at COMMIT (idempotency.ErrConflict),
	// which Guard.Purge does not retry.
	"Purge": true,
}

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
	t.Logf("3-node Galera cluster up in %v", time.Since(start).Round(100*time.Millisecond))

	t.Run("Conformance", func(t *testing.T) {
		// Default settings: the cases that need a caller to wait for a
		// key held on another node run on one node.
		t.Run("Default", func(t *testing.T) { galeraConformance(t, g, "", true) })
		// Streaming replication: every case, every caller spread.
		t.Run("Streaming", func(t *testing.T) { galeraConformance(t, g, streaming, false) })
	})
	t.Run("SameKeyAcrossNodes", func(t *testing.T) {
		t.Run("Default", func(t *testing.T) { galeraSameKey(t, g, "") })
		t.Run("Streaming", func(t *testing.T) { galeraSameKey(t, g, streaming) })
	})
	t.Run("Latency", func(t *testing.T) { galeraLatency(t, g) })
	t.Run("CertificationFailureRetried", func(t *testing.T) { galeraCertification(t, g) })
	t.Run("NodeKilled", func(t *testing.T) { galeraNodeKilled(t, g) })
}

// galeraSameKey fires 21 callers of one key, 7 per node, released
// together, for several rounds (the winner failing in one): every round
// gives one effect and identical answers, no caller sees a conflict, and
// fn's runs on the nodes that lost are rolled back.
func galeraConformance(t *testing.T, g *Galera, dsnExtra string, pinNodeLocal bool) {
	var pinned atomic.Int64
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			f := newGaleraFixture(t, g, opts.MaxConns, dsnExtra)
			pin := -1
			name := t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]
			if pinNodeLocal && nodeLocalCases[name] {
				pin = int(pinned.Add(1) % GaleraNodes)
			}
			return conformance.Fixture[*sql.Tx]{Store: f.spread(pin), Effect: f.effect, Count: f.countOf}
		},
	})
}

// galeraLatency measures sequential calls with new keys on node 1, with
// and without streaming replication: what the cross-node locks cost.
func galeraLatency(t *testing.T, g *Galera) {
	const n = 200
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var per [2]time.Duration
	for m, extra := range []string{"", streaming} {
		f := newGaleraFixture(t, g, 0, extra)
		gd, err := idempotency.New[*sql.Tx](f.spread(0), nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for i := range n {
			key := idempotency.Key{Scope: "lat", ID: fmt.Sprintf("lat-%d-%s", i, rand.Text()[:6])}
			if _, err := gd.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201}, f.effect(ctx, tx, key.ID)
			}); err != nil {
				t.Fatal(err)
			}
		}
		per[m] = time.Since(start) / n
	}
	t.Logf("sequential new keys on node 1: %v per call with default settings, %v with streaming replication (one statement per fragment)",
		per[0].Round(time.Microsecond), per[1].Round(time.Microsecond))
}

func galeraSameKey(t *testing.T, g *Galera, dsnExtra string) {
	const rounds, callers = 8, 21
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, dsnExtra)
	cf0, bf0 := certStats(t, g, 0, 1, 2)
	guards := make([]*idempotency.Guard[*sql.Tx], GaleraNodes)
	var retried atomic.Int64
	for i := range guards {
		gd, err := idempotency.New[*sql.Tx](f.spread(i), &idempotency.Config{Observer: func(_ context.Context, ev idempotency.Event) {
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
		key := idempotency.Key{Scope: "galera", ID: fmt.Sprintf("same-%d-%s", round, rand.Text()[:8])}
		tag := key.ID
		failWinner := round == rounds-1
		var runs atomic.Int64
		type res struct {
			resp idempotency.Response
			err  error
		}
		out := make([]res, callers)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		errWinner := errors.New("the first run fails")
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				out[c].resp, out[c].err = guards[c%GaleraNodes].Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					n := runs.Add(1)
					if err := f.effect(ctx, tx, tag); err != nil {
						return idempotency.Response{}, err
					}
					if failWinner && n == 1 {
						time.Sleep(200 * time.Millisecond)
						return idempotency.Response{}, errWinner
					}
					return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"run":%d,"node":%d}`, n, c%GaleraNodes+1)}, nil
				})
			}()
		}
		close(gate)
		wg.Wait()
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
		n, err := f.countOf(ctx, tag)
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
			f := newGaleraFixture(t, g, 0, "")
			var attempts1 atomic.Int64
			g1, err := idempotency.New[*sql.Tx](f.spread(0), &idempotency.Config{Observer: func(_ context.Context, ev idempotency.Event) {
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
					if err := f.effect(ctx, tx, "node1"); err != nil {
						return idempotency.Response{}, err
					}
					if n == 1 {
						close(inFn)
						<-otherDone
						if c.statement {
							if err := f.effect(ctx, tx, "node1-again"); err != nil {
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
				if err := f.effect(ctx, tx, "node2"); err != nil {
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
				if n, err := f.countOf(ctx, tag); err != nil || n != want {
					t.Fatalf("effects %q: %d (%v), want %d", tag, n, err, want)
				}
			}
		})
	}
}

// galeraNodeKilled runs calls on all three nodes (two callers each, a new
// key per call), kills node 3 with SIGKILL, and goes on: callers whose node
// failed retry the same key on the next node, as a client retries through
// a load balancer. Calls continue on nodes 1 and 2, and every key ends with
// exactly one effect and, when it was answered, the answer it was given.
func galeraNodeKilled(t *testing.T, g *Galera) {
	const perNode, before, after = 2, 150, 150
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, "")
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
						if err := f.effect(ctx, tx, c.key.ID); err != nil {
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
			if err := f.effect(ctx, tx, c.key.ID); err != nil {
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
		if n, err := f.countOf(ctx, c.key.ID); err != nil || n != 1 {
			t.Fatalf("key %s: %d effects (%v), want 1", c.key.ID, n, err)
		}
	}
	t.Logf("%d calls, %d answered (%d on nodes 1-2 after node 3 was killed, %v after it started), %d unanswered; %d failed attempts retried on another node; longest call on a survivor after the kill: %v; 0 second effects",
		len(calls), acks.Load(), survAcks.Load(), killedAt.Sub(start).Round(time.Millisecond), unanswered, failover.Load(), time.Duration(maxPause.Load()).Round(time.Millisecond))
}
