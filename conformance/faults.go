package conformance

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// FaultHarness tells [RunFaults] how to build stores whose connections go
// through a fault-injecting proxy ([faultproxy.Proxy]) to their server.
//
//	func TestFaults(t *testing.T) {
//		conformance.RunFaults(t, conformance.FaultHarness[pgx.Tx]{
//			Upstream: "127.0.0.1:5432",
//			NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[pgx.Tx] {
//				// a pool dialing addr; keys table and effects table named after ns
//			},
//			Bound:          3 * time.Second,
//			PartitionBound: 4 * time.Second, // e.g. idle_in_transaction_session_timeout=2s
//		})
//	}
type FaultHarness[Tx any] struct {
	// Upstream is the server's address, host:port.
	Upstream string
	// NewFixture returns a fixture whose Store opens every connection to
	// addr (host:port): the address of a proxy in front of Upstream, or
	// Upstream itself. Fixtures built with the same ns share their keys
	// and their effects (one keys table or prefix, one effects table);
	// fixtures with different ns share nothing. It creates what it needs
	// and registers its cleanup with t.Cleanup. The suite calls Count only
	// on fixtures built with addr == Upstream.
	NewFixture func(t testing.TB, addr, ns string) Fixture[Tx]
	// Bound is the store's documented bound on how long a key stays
	// blocked after a fault the server can see. Such a fault is a cut
	// connection, or a lost reply after which the faulted caller's context
	// ends and its connection is closed. A retry with the same key, on
	// another connection, must succeed at most Bound after the fault. It includes
	// the faulted caller's CallTimeout. Defaults to CallTimeout + 2s.
	Bound time.Duration
	// PartitionBound is the bound after a network partition that outlasts
	// it, when neither end learns that the other is gone. It is the
	// server's own timeout on an idle transaction, or the store's lease. Zero skips
	// the partition scenarios.
	PartitionBound time.Duration
	// CallTimeout is the deadline of the faulted call's context. Defaults
	// to 1s.
	CallTimeout time.Duration
	// Delay is how long the Delay scenarios hold a step; the faulted call
	// must then succeed. Defaults to CallTimeout/4.
	Delay time.Duration
	// Waiters is how many more callers of the same key, in the faulted
	// store's Guard, arrive once the fault has fired. Each must end with
	// the one answer, or with ErrStore, ErrInProgress or its context's
	// error. Defaults to 2; negative means none.
	Waiters int
	// Parallel is how many scenarios run at once. Defaults to 6.
	Parallel int
	// Known, if not nil, names known bugs. It is given a scenario (the
	// step label, such as "fn#1", and the action) and a check that failed
	// ("effects", "answer", "typed-error", "bound", "deadline",
	// "recovery"). It returns the reason the failure is known, or "". A
	// known failure is logged, and the scenario is reported as skipped
	// with that reason unless another check failed.
	Known func(step string, a faultproxy.Action, check string) string
	// KnownSteps, if not nil, excuses the steps of the traced call that a
	// later call need not send again, so that a fault armed at one and never
	// firing skips its scenario instead of failing. It is given a step's
	// label (such as "reserve#3") and the printable head of its bytes, and
	// returns why the step may not fire, or "". A client that multiplexes calls over one
	// connection (gRPC, HTTP/2) sends control frames: SETTINGS, PING,
	// WINDOW_UPDATE and their acknowledgements. The trace sees them as
	// steps, but a later call need not send them again. A known step is
	// tried once; if its fault does not fire, the scenario is skipped with
	// the reason instead of failing "never fired".
	KnownSteps func(step, head string) string
	// Cold runs every scenario on a pool that has not connected yet, so
	// that the faults also hit the connection's start (dial, handshake,
	// first use of each statement). By default the faulted store first
	// makes one call with another key, and the faults hit the steady
	// state.
	Cold bool
	// Report, if not nil, is given the result of every scenario, from the
	// goroutines that run them.
	Report func(FaultResult)
}

// RunFaultsWarmAndCold runs [RunFaults] twice, as two subtests. "Warm"
// uses a pool that has connected: faults hit the store's statements.
// "Cold" uses h.Cold: faults also hit the handshake and the first use of
// each statement.
func RunFaultsWarmAndCold[Tx any](t *testing.T, h FaultHarness[Tx]) {
	t.Helper()
	for _, cold := range []bool{false, true} {
		name := "Warm"
		if cold {
			name = "Cold"
		}
		hc := h
		hc.Cold = cold
		t.Run(name, func(t *testing.T) { RunFaults(t, hc) })
	}
}

// RunFaults injects a fault at every step of the store's protocol and
// checks what a client retrying with the same key gets. It first traces one
// call through the proxy, naming each round trip by the store call that
// sent it. Then, for every round trip and every [faultproxy.Action] (cut
// before, cut after, drop the reply, partition, delay), it runs one call on
// a fresh fixture with that fault armed. After each fault, a client on
// another connection retries with the same key until it succeeds, and the
// suite requires:
//
//   - exactly one effect committed, and one answer: every call that
//     succeeded (the faulted one, the retry, a replay through the faulted
//     store's own pool) got the same response;
//   - the retry succeeded within [FaultHarness].Bound of the fault (within
//     PartitionBound for a partition);
//   - the faulted call failed, if it did, with [idempotency.ErrStore] or its
//     context's error in the chain, and a Delay did not make it fail;
//   - the faulted call returned at most 3s after its context's deadline
//     (CallTimeout), even behind a partition;
//   - the callers of the same key that arrive in the faulted Guard while
//     the fault holds the first ([FaultHarness].Waiters) get that answer, or
//     ErrStore, ErrInProgress or their context's error, in time;
//   - once the network is back, the faulted store's own pool replays the
//     answer (after failing a few calls with ErrStore, at most).
//
// It logs a table of the scenarios with the measured times.
func RunFaults[Tx any](t *testing.T, h FaultHarness[Tx]) {
	t.Helper()
	if h.NewFixture == nil || h.Upstream == "" {
		t.Fatal("conformance: FaultHarness needs Upstream and NewFixture")
	}
	if h.CallTimeout <= 0 {
		h.CallTimeout = time.Second
	}
	if h.Bound <= 0 {
		h.Bound = h.CallTimeout + 2*time.Second
	}
	if h.Delay <= 0 {
		h.Delay = h.CallTimeout / 4
	}
	if h.Waiters == 0 {
		h.Waiters = 2
	} else if h.Waiters < 0 {
		h.Waiters = 0
	}
	if h.Parallel <= 0 {
		h.Parallel = 6
	}
	s := &faultSuite[Tx]{h: h}
	var plan []faultStep
	t.Run("Trace", func(t *testing.T) { plan = s.trace(t) })
	if len(plan) == 0 {
		t.Fatal("conformance: the traced call sent no step through the proxy (does the fixture dial addr?)")
	}
	actions := []faultproxy.Action{faultproxy.CutBefore, faultproxy.CutAfter, faultproxy.DropReply, faultproxy.Delay}
	if h.PartitionBound > 0 {
		actions = append(actions, faultproxy.Partition)
	}
	var (
		wg      sync.WaitGroup
		sem     = make(chan struct{}, h.Parallel)
		mu      sync.Mutex
		results []FaultResult
	)
	for _, a := range actions {
		for _, st := range plan {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				t.Run(st.label+"/"+a.String(), func(t *testing.T) {
					r, ok := s.scenario(t, st, a)
					if !ok {
						return
					}
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
					if h.Report != nil {
						h.Report(r)
					}
					if len(r.Known) > 0 && !t.Failed() {
						t.Skipf("known: %s", strings.Join(r.Known, "; "))
					}
				})
			}()
		}
	}
	wg.Wait()
	t.Log(faultTable(results))
}

// returnSlack is how long after its context's deadline the faulted call
// must have returned.
const returnSlack = 3 * time.Second

// retryAfter is how long after a fault the retrying client starts.
const retryAfter = 100 * time.Millisecond

// faultSuite runs the scenarios of one harness.
type faultSuite[Tx any] struct {
	h  FaultHarness[Tx]
	ns atomic.Int64
}

// faultStep is one step of the traced call.
type faultStep struct {
	label, head string
}

// scenario runs one fault, once the protocol took the traced path (at most
// three attempts), and checks the outcome.
func (s *faultSuite[Tx]) scenario(t *testing.T, st faultStep, a faultproxy.Action) (FaultResult, bool) {
	return s.scenarioWith(t, st, func() (FaultResult, bool) { return s.attempt(t, st, a) })
}

// faultT is what scenarioWith needs of a *testing.T.
type faultT interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
}

// scenarioWith runs attempt until the fault fires at st: at most three
// times, once for a step the harness declares known. If it never fires, it
// fails t, or skips it with the harness's reason for a known step.
func (s *faultSuite[Tx]) scenarioWith(t faultT, st faultStep, attempt func() (FaultResult, bool)) (FaultResult, bool) {
	t.Helper()
	var known string
	if s.h.KnownSteps != nil {
		known = s.h.KnownSteps(st.label, st.head)
	}
	tries := 3
	if known != "" {
		tries = 1
	}
	for n := 1; n <= tries; n++ {
		r, ok := attempt()
		if ok || t.Failed() {
			return r, ok
		}
		if known != "" {
			t.Skipf("known step: the fault never fires at %s (%q): %s", st.label, st.head, known)
			return FaultResult{}, false
		}
		t.Logf("attempt %d: the fault did not fire at %s (the call took another path); again", n, st.label)
	}
	t.Errorf("the fault never fired at %s in 3 attempts (if the step is a control frame of a multiplexed client, declare it in FaultHarness.KnownSteps)", st.label)
	return FaultResult{}, false
}

// attempt runs one scenario; it reports false if the fault did not fire at
// the planned step.
func (s *faultSuite[Tx]) attempt(t *testing.T, st faultStep, a faultproxy.Action) (FaultResult, bool) {
	h := s.h
	r := s.rig(t)
	res := FaultResult{Step: st.label, Head: st.head, Action: a, Bound: h.Bound}
	if a == faultproxy.Partition {
		res.Bound = h.PartitionBound
	}
	r.lab.reset()
	fired, err := r.proxy.Arm(faultproxy.Fault{
		Action: a,
		Match:  r.lab.matcher(st.label),
		Delay:  h.Delay,
		Hold:   h.PartitionBound + 2*time.Second, // outlasts the bound: healing cannot meet it
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.proxy.Heal()

	var execs atomic.Int64
	callCtx, cancelCall := context.WithTimeout(context.Background(), h.CallTimeout)
	defer cancelCall()
	done := make(chan faultOutcome, 1)
	start := time.Now()
	go func() {
		resp, err := r.guard.Do(callCtx, r.key, "fp", r.fn(callCtx, r.faulty, &execs, true, r.ns))
		done <- faultOutcome{resp, err, time.Since(start)}
	}()
	var orig *faultOutcome
	select {
	case <-fired:
	case o := <-done:
		orig = &o
	}
	firedAt, ok := r.proxy.Fired()
	if !ok || r.lab.labelOf(firedAt.Seq) != st.label {
		if orig == nil {
			<-done // bounded by CallTimeout plus the store's clean-up
		}
		return res, false
	}

	// Callers of the same key in the faulted Guard arrive while the fault
	// holds the first: they wait in memory for it, or compete after it.
	followers := make(chan faultOutcome, h.Waiters)
	for range h.Waiters {
		go func() {
			resp, err := r.guard.Do(callCtx, r.key, "fp", r.fn(callCtx, r.faulty, &execs, false, r.ns))
			followers <- faultOutcome{resp, err, time.Since(start)}
		}()
	}

	// Another client retries with the same key on the server directly,
	// concurrently with the faulted call, from shortly after the fault
	// (so that a forwarded step reaches the server first).
	ctx, cancel := context.WithTimeout(context.Background(), max(h.Bound, h.PartitionBound)+30*time.Second)
	defer cancel()
	retry, err := idempotency.New(r.clean.Store, &idempotency.Config{WaitTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	giveUp := firedAt.At.Add(max(h.Bound, h.PartitionBound) + 5*time.Second)
	var ans idempotency.Response
	var lastErr error
	time.Sleep(retryAfter)
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := retry.Do(rctx, r.key, "fp", r.fn(rctx, r.clean, &execs, false, r.ns))
		rcancel()
		if err == nil {
			res.Blocked, ans, res.Replayed = time.Since(firedAt.At), resp, resp.Replayed
			break
		}
		if !errors.Is(err, idempotency.ErrInProgress) && !errors.Is(err, idempotency.ErrStore) {
			t.Fatalf("retry after %s at %s: %v (want success, or ErrInProgress/ErrStore while blocked)", a, st.label, err)
		}
		lastErr = err
		if time.Now().After(giveUp) {
			t.Fatalf("after %s at %s: the key was still blocked %v after the fault (bound %v); last error: %v",
				a, st.label, time.Since(firedAt.At).Round(time.Millisecond), res.Bound, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var known []string
	if orig == nil {
		select {
		case o := <-done:
			orig = &o
		case <-time.After(time.Until(start.Add(h.CallTimeout + returnSlack))):
			r.proxy.CutAll() // what the caller's operating system would do, in the end
			select {
			case o := <-done:
				orig = &o
			case <-time.After(20 * time.Second):
				t.Fatalf("after %s at %s: the faulted call had not returned 20s after its connections were cut", a, st.label)
			}
		}
	}
	if orig.took > h.CallTimeout+returnSlack {
		s.failCheck(t, &res, checkDeadline, &known, "the faulted call returned %v after it started, more than %v after its context's deadline (%v): a caller's deadline must bound Do",
			orig.took.Round(time.Millisecond), returnSlack, h.CallTimeout)
	}
	var waited []faultOutcome
	for range h.Waiters {
		select {
		case o := <-followers:
			waited = append(waited, o)
		case <-time.After(time.Until(start.Add(h.CallTimeout + returnSlack + 10*time.Second))):
			t.Fatalf("after %s at %s: a caller waiting for the faulted one had not returned %v after its deadline", a, st.label, returnSlack+10*time.Second)
		}
	}
	r.proxy.Heal()
	res.CallErr, res.CallTook = orig.err, orig.took
	t.Logf("%s at %s: call %v after %v; retry (replayed %v) %v after the fault",
		a, st.label, orig.err, orig.took.Round(time.Millisecond), res.Replayed, res.Blocked.Round(time.Millisecond))
	s.checkFollowers(t, &res, waited, *orig, ans, &known)
	s.check(t, ctx, r, &res, orig.resp, ans, &known)
	res.Known = known
	return res, true
}
