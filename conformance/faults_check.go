package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// check asserts the outcome of one fault scenario: one effect, one answer,
// a typed error, the bound.
func (s *faultSuite[Tx]) check(t *testing.T, ctx context.Context, r *faultRig[Tx], res *FaultResult, orig, retried idempotency.Response, known *[]string) {
	t.Helper()
	fail := func(check, format string, args ...any) {
		t.Helper()
		s.failCheck(t, res, check, known, format, args...)
	}
	if err := res.CallErr; err != nil {
		switch {
		case res.Action == faultproxy.Delay:
			fail(checkTyped, "the faulted call failed (the step was %v late): %v; a slow step must not fail a call within its deadline", s.h.Delay, err)
		case !errors.Is(err, idempotency.ErrStore) && !errors.Is(err, context.DeadlineExceeded):
			fail(checkTyped, "the faulted call returned an untyped error %q; want idempotency.ErrStore (or its context's error) in the chain", err)
		}
	}
	if res.Blocked > res.Bound {
		fail(checkBound, "the key stayed blocked %v after the fault, longer than the bound %v", res.Blocked.Round(time.Millisecond), res.Bound)
	}
	if res.CallErr == nil {
		// The retry ran concurrently with the faulted call: either may
		// have executed, the other replayed; never both executed.
		switch {
		case !res.Replayed && !orig.Replayed:
			fail(checkAnswer, "the faulted call (%s) and the retry (%s) both ran fn: two answers for one key", orig.Body, retried.Body)
		case !faultSameResponse(orig, retried):
			fail(checkAnswer, "the faulted call answered %s, the retry %s", orig.Body, retried.Body)
		}
	}
	n, err := r.clean.Count(ctx, r.ns)
	if err != nil {
		t.Fatalf("%s at %s: Count: %v", res.Action, res.Step, err)
	}
	res.Effects = n
	if n != 1 {
		fail(checkEffects, "%d effects committed after the fault and the retry, want exactly 1", n)
	}
	// The faulted store's own pool, once the network is back, replays the
	// same answer (it may meet dead connections first: ErrStore, retried).
	g, err := idempotency.New(r.faulty.Store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for i := 0; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := g.Do(cctx, r.key, "fp", func(Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errors.New("conformance: fn ran for a completed key")
		})
		cancel()
		if err == nil {
			if !resp.Replayed || !faultSameResponse(resp, retried) {
				fail(checkAnswer, "the faulted store answered %s (replayed %v), want the replay of %s", resp.Body, resp.Replayed, retried.Body)
			}
			break
		}
		errs = append(errs, err)
		if !errors.Is(err, idempotency.ErrStore) || i == 5 {
			fail(checkRecovery, "the faulted store could not replay the answer once the network was back: %v", errors.Join(errs...))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(errs) > 0 && !t.Failed() {
		t.Logf("%s at %s: the faulted store's pool failed %d call(s) before replaying: %v", res.Action, res.Step, len(errs), errs[0])
	}
}

// The checks of a fault scenario, as [FaultHarness].Known names them.
const (
	// CheckEffects: exactly one effect committed.
	checkEffects = "effects"
	// CheckAnswer: one answer for every successful call.
	checkAnswer = "answer"
	// CheckTyped: the faulted call failed, if at all, with ErrStore or
	// its context's error.
	checkTyped = "typed-error"
	// CheckBound: the key was free again within the bound.
	checkBound = "bound"
	// checkDeadline: the faulted call returned soon after its context's
	// deadline.
	checkDeadline = "deadline"
	// CheckRecovery: the faulted store's own pool replays the answer once
	// the network is back.
	checkRecovery = "recovery"
)

// failCheck reports a failed check of a scenario, as an error, or as a
// log line when the harness knows the failure (its reason then goes to
// known).
func (s *faultSuite[Tx]) failCheck(t *testing.T, res *FaultResult, check string, known *[]string, format string, args ...any) {
	t.Helper()
	msg := res.Action.String() + " at " + res.Step + ": " + fmt.Sprintf(format, args...)
	if s.h.Known != nil {
		if why := s.h.Known(res.Step, res.Action, check); why != "" {
			t.Logf("KNOWN (%s): %s", why, msg)
			*known = append(*known, why)
			return
		}
	}
	t.Error(msg)
}

// faultOutcome is how a call of a scenario ended.
type faultOutcome struct {
	resp idempotency.Response
	err  error
	took time.Duration
}

// checkFollowers asserts what the callers of the key that arrived in the
// faulted Guard after the fault got: the one answer, or a typed error, in
// time.
func (s *faultSuite[Tx]) checkFollowers(t *testing.T, res *FaultResult, waited []faultOutcome, orig faultOutcome, ans idempotency.Response, known *[]string) {
	t.Helper()
	var fsum []string
	for _, o := range waited {
		switch {
		case o.err != nil:
			fsum = append(fsum, "error")
		case o.resp.Replayed:
			fsum = append(fsum, "replayed")
		default:
			fsum = append(fsum, "executed")
		}
	}
	if len(fsum) > 0 {
		t.Logf("%s at %s: callers of the same key in the faulted Guard: %s", res.Action, res.Step, strings.Join(fsum, ", "))
	}
	for i, o := range waited {
		switch {
		case o.err == nil && !o.resp.Replayed && (!res.Replayed || orig.err == nil && !orig.resp.Replayed):
			s.failCheck(t, res, checkAnswer, known, "caller %d of the same key ran fn too (%s): two executions answered", i+1, o.resp.Body)
		case o.err == nil && !faultSameResponse(o.resp, ans):
			s.failCheck(t, res, checkAnswer, known, "caller %d of the same key answered %s, the retry %s", i+1, o.resp.Body, ans.Body)
		case o.err != nil && !errors.Is(o.err, idempotency.ErrStore) && !errors.Is(o.err, context.DeadlineExceeded) && !errors.Is(o.err, idempotency.ErrInProgress):
			s.failCheck(t, res, checkTyped, known, "caller %d of the same key returned an untyped error %q", i+1, o.err)
		case o.took > s.h.CallTimeout+returnSlack:
			s.failCheck(t, res, checkDeadline, known, "caller %d of the same key returned %v after it started, more than %v after its deadline", i+1, o.took.Round(time.Millisecond), returnSlack)
		}
	}
}

// faultSameResponse reports whether a and b carry the same status, header
// and body.
func faultSameResponse(a, b idempotency.Response) bool {
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) &&
		(len(a.Header) == 0 && len(b.Header) == 0 || reflect.DeepEqual(a.Header, b.Header))
}
