package clusters

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// streamingRunsEnv sets how many runs of the streaming wait-bound rig
// TestGalera/StreamingWaits makes on one cluster (default 1: CI's share).
// Each run lasts streamingRunTime.
const streamingRunsEnv = "IDEMPOTENCY_GALERA_STREAMING_RUNS"

// streamingRunTime is how long one run of the rig keeps its callers busy.
const streamingRunTime = 8 * time.Second

// waitsTally is what one run of galeraStreamingWaits saw.
type waitsTally struct {
	keys, calls, executed, replays, inProgress int64
	// runs of fn in all; extra = runs - executed: runs whose transaction
	// was rolled back (certification, or the applier's brute-force abort)
	// and retried into a replay of another node's answer.
	runs    int64
	extra   int64
	maxWait time.Duration // the longest call that ended in a replay
}

// galeraStreamingWaits is the rig of the wait bound on streaming
// replication: 4 callers per node walk the same sequence of fresh keys, so
// that every key is called on all three nodes within a few milliseconds,
// its holder on one node and the others waiting for it on theirs, and
// neighbouring keys are inserted at once (the gap locks of one key's
// reservation then meet the next key's). fn writes one effect and takes a
// few milliseconds. With WaitTimeout 10 s, every call must end with the
// key's one answer (executed once, replayed byte for byte by the others),
// or ErrInProgress: never ErrStore, since every holder lives.
func galeraStreamingWaits(t *testing.T, g *Galera) {
	runs := 1
	if v := os.Getenv(streamingRunsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive count", streamingRunsEnv, v)
		}
		runs = n
	}
	f := newGaleraFixture(t, g, 0, streaming, nil)
	var total waitsTally
	for run := 1; run <= runs; run++ {
		s := streamingWaitsRun(t, f, fmt.Sprintf("r%d", run))
		t.Logf("run %d of %d: %d keys, %d calls: %d executed, %d replays, %d ErrInProgress, 0 failed; fn ran %d times, %d extra runs rolled back by certification (one effect per key kept); longest call answered by a replay %v",
			run, runs, s.keys, s.calls, s.executed, s.replays, s.inProgress, s.runs, s.extra, s.maxWait.Round(time.Millisecond))
		total.keys += s.keys
		total.calls += s.calls
		total.extra += s.extra
		total.inProgress += s.inProgress
		if t.Failed() {
			t.Fatalf("run %d failed", run)
		}
	}
	t.Logf("streaming wait bound: %d runs in a row, %d keys, %d calls, 0 ErrStore, %d ErrInProgress; %d extra runs of fn rolled back by certification",
		runs, total.keys, total.calls, total.inProgress, total.extra)
}

func streamingWaitsRun(t *testing.T, f *galeraFixture, tag string) waitsTally {
	const perNode = 4
	ctx, cancel := context.WithTimeout(context.Background(), streamingRunTime+60*time.Second)
	defer cancel()
	prefix := testkit.Name("sw-" + tag + "-")
	guards := make([]*idempotency.Guard[*sql.Tx], GaleraNodes)
	for i := range guards {
		gd, err := idempotency.New[*sql.Tx](f.spread(i), &idempotency.Config{WaitTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = gd
	}
	var (
		s      waitsTally
		mu     sync.Mutex
		bodies = map[string]string{} // key ID -> the one answer
		stop   atomic.Bool
		failed atomic.Int64
		runs   atomic.Int64
		calls  atomic.Int64
	)
	time.AfterFunc(streamingRunTime, func() { stop.Store(true) })
	var wg sync.WaitGroup
	for c := range perNode * GaleraNodes {
		node := c % GaleraNodes
		wg.Go(func() {
			for i := 0; !stop.Load() && failed.Load() == 0; i++ {
				id := fmt.Sprintf("%s%07d", prefix, i)
				key := idempotency.Key{Scope: "sw", ID: id}
				start := time.Now()
				resp, err := guards[node].Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					runs.Add(1)
					if err := f.fx.Effect(ctx, tx, id); err != nil {
						return idempotency.Response{}, err
					}
					time.Sleep(2 * time.Millisecond)
					return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"id":%q,"node":%d,"caller":%d}`, id, node+1, c)}, nil
				})
				took := time.Since(start)
				calls.Add(1)
				mu.Lock()
				switch {
				case errors.Is(err, idempotency.ErrInProgress):
					s.inProgress++
					if took < 9*time.Second {
						failed.Add(1)
						t.Errorf("key %s on node %d: ErrInProgress after %v, before the wait bound (10 s): %v", id, node+1, took, err)
					}
				case err != nil:
					failed.Add(1)
					t.Errorf("key %s on node %d: %v after %v; want the key's answer (or ErrInProgress at the bound), never an error while its holder lives",
						id, node+1, err, took)
				default:
					if resp.Replayed {
						s.replays++
						s.maxWait = max(s.maxWait, took)
					} else {
						s.executed++
					}
					if b, ok := bodies[id]; ok && b != string(resp.Body) {
						failed.Add(1)
						t.Errorf("key %s: answers %s and %s", id, b, resp.Body)
					}
					bodies[id] = string(resp.Body)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.calls, s.runs = calls.Load(), runs.Load()
	s.keys = int64(len(bodies))
	s.extra = s.runs - s.executed
	if s.executed != s.keys {
		t.Errorf("%d calls executed fn for %d keys; want one per key", s.executed, s.keys)
	}
	// One effect per key: the extra runs were rolled back.
	var effects int64
	if err := f.count.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.effects+"` WHERE tag LIKE ?", prefix+"%").Scan(&effects); err != nil {
		t.Fatal(err)
	}
	var distinct int64
	if err := f.count.QueryRowContext(ctx, "SELECT COUNT(DISTINCT tag) FROM `"+f.effects+"` WHERE tag LIKE ?", prefix+"%").Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if effects != s.keys || distinct != s.keys {
		t.Errorf("%d effects on %d keys for %d keys answered; want exactly one per key", effects, distinct, s.keys)
	}
	return s
}

// galeraFirstTry: a first try (no wait) on another node right after a
// caller reserved the key on node 1, with streaming replication, reports
// the key in progress, so that the caller's waiting try follows. The
// reservation's row reaches the other node certified but not always
// applied yet: a no-wait INSERT there then fails certification (1213), a
// conflict that the core used to retry without waiting, ten times in
// 0.1-0.2 s, and then give up with ErrStore while the holder still ran.
func galeraFirstTry(t *testing.T, g *Galera) {
	const rounds = 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newGaleraFixture(t, g, 0, streaming, nil)
	conflicts := 0
	for round := range rounds {
		key := idempotency.Key{Scope: "ft", ID: fmt.Sprintf("%s%d", testkit.Name("ft-"), round)}
		r := backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour, Deadline: time.Now().Add(10 * time.Second)}
		txn, _, err := f.stores[0].Reserve(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		node := 1 + round%2
		_, rec, err := f.stores[node].Reserve(ctx, r)
		_ = txn.Rollback(ctx)
		switch {
		case rec != nil || !errors.Is(err, idempotency.ErrInProgress):
			t.Fatalf("round %d: a first try on node %d right after node 1 reserved the key: %v, %v; want ErrInProgress, so that the caller waits",
				round, node+1, rec, err)
		case strings.Contains(err.Error(), "may be held"):
			conflicts++
		}
	}
	t.Logf("%d first tries right after another node's reservation: all ErrInProgress, %d of them from a conflict (certification, 1213, or a lock not found again)", rounds, conflicts)
}
