package clusters

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// call is one Do of the failover workloads: a fresh key, and what the
// caller was told before the primary died.
type call struct {
	key         idempotency.Key
	afterStall  bool // the call started once the replication link was stalled
	acked       bool // Do answered with a response
	body        []byte
	err         error
	retryBody   []byte
	retryReplay bool
}

// load runs workers that each call do with fresh keys, one after the
// other, until stopped. onAck runs in the worker right after each
// acknowledged answer, with the number of answers so far: a test kills the
// primary from there, right after an acknowledged commit.
type load struct {
	prefix  string
	stalled atomic.Bool
	stopped atomic.Bool
	acks    atomic.Int64
	wg      sync.WaitGroup

	mu    sync.Mutex
	calls []*call
}

func newLoad(prefix string) *load { return &load{prefix: testkit.Name(prefix + "-")} }

func (l *load) start(workers int, do func(idempotency.Key) (idempotency.Response, error), onAck func(n int64)) {
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; !l.stopped.Load(); i++ {
				c := &call{key: idempotency.Key{Scope: "ha", ID: fmt.Sprintf("%s-%d-%d", l.prefix, w, i)}, afterStall: l.stalled.Load()}
				l.mu.Lock()
				l.calls = append(l.calls, c)
				l.mu.Unlock()
				resp, err := do(c.key)
				c.err = err
				if err != nil {
					time.Sleep(5 * time.Millisecond) // the primary may be dead: do not spin
					continue
				}
				c.acked, c.body = true, resp.Body
				if !l.stopped.Load() {
					onAck(l.acks.Add(1))
				}
			}
		}()
	}
}

// stop ends the load and waits for its workers.
func (l *load) stop() []*call {
	l.stopped.Store(true)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

// waitAcks waits until n answers were acknowledged, or fails t after d.
func (l *load) waitAcks(t testing.TB, n int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for l.acks.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d calls answered after %v", l.acks.Load(), n, d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tally is what the retries after a failover found.
type tally struct {
	calls, acked, ackedAfterStall, unacked int
	// keptAcks: acknowledged, and the retry replayed the same bytes.
	keptAcks int
	// lostAcks: acknowledged, and the retry ran fn again (a second
	// effect, as seen from outside the store).
	lostAcks, lostAfterStall int
	// unackedReplayed: no answer before the failover, the retry found
	// the committed key; unackedExecuted: the retry ran fn (first time
	// for the surviving store).
	unackedReplayed, unackedExecuted int
}

func (s tally) String() string {
	return fmt.Sprintf("%d calls: %d acknowledged (%d started after the link stalled), %d not; after failover: %d acknowledged answers replayed byte-exact, %d lost (retry ran fn again; %d of them started after the stall); unacknowledged: %d replayed, %d executed",
		s.calls, s.acked, s.ackedAfterStall, s.unacked, s.keptAcks, s.lostAcks, s.lostAfterStall, s.unackedReplayed, s.unackedExecuted)
}

// retryAll retries every call with its key through do (against the
// promoted replica) and classifies the results; a retry that fails, or an
// acknowledged answer replayed with other bytes, fails t.
func retryAll(t testing.TB, calls []*call, do func(idempotency.Key) (idempotency.Response, error)) tally {
	t.Helper()
	var s tally
	for _, c := range calls {
		resp, err := do(c.key)
		if err != nil {
			t.Fatalf("retry of %s after failover: %v", c.key.ID, err)
		}
		c.retryBody, c.retryReplay = resp.Body, resp.Replayed
		s.calls++
		switch {
		case c.acked:
			s.acked++
			if c.afterStall {
				s.ackedAfterStall++
			}
			switch {
			case !resp.Replayed:
				s.lostAcks++
				if c.afterStall {
					s.lostAfterStall++
				}
			case bytes.Equal(resp.Body, c.body):
				s.keptAcks++
			default:
				t.Fatalf("key %s: acknowledged %q, replayed %q after failover", c.key.ID, c.body, resp.Body)
			}
		default:
			s.unacked++
			if resp.Replayed {
				s.unackedReplayed++
			} else {
				s.unackedExecuted++
			}
		}
	}
	return s
}

// checkEffects fails t unless counts (effects per key ID) holds exactly one
// effect for the key of every call, and nothing for any other key; after
// names what the calls went through, for the messages.
func checkEffects(t testing.TB, counts map[string]int, calls []*call, after string) {
	t.Helper()
	for _, c := range calls {
		if n := counts[c.key.ID]; n != 1 {
			t.Errorf("key %s: %d effects after %s, want exactly 1", c.key.ID, n, after)
		}
	}
	if len(counts) != len(calls) {
		t.Errorf("%d keys have effects, want %d (one per call)", len(counts), len(calls))
	}
}
