package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// FaultResult is what one fault scenario of [RunFaults] observed.
type FaultResult struct {
	// Step names the protocol step the fault hit: the store call that sent
	// it ("reserve", "fn", "complete"), and its rank among that call's
	// round trips ("complete#2").
	Step string
	// Head is the beginning of what the client sent in that step,
	// printable bytes only.
	Head string
	// Action is the fault.
	Action faultproxy.Action
	// CallErr is what the faulted call returned.
	CallErr error
	// CallTook is how long the faulted call took.
	CallTook time.Duration
	// Blocked is how long after the fault a retry with the same key, on
	// another connection, first succeeded.
	Blocked time.Duration
	// Replayed says whether that retry replayed a stored answer (the
	// faulted call had committed) or ran fn.
	Replayed bool
	// Bound is the bound Blocked was held to.
	Bound time.Duration
	// Effects is how many effects were committed in the end (1 expected).
	Effects int
	// Known holds the reasons [FaultHarness].Known gave for the checks of
	// this scenario that failed.
	Known []string
}

// faultTable formats the scenarios' results, and the largest blocked time
// per action.
func faultTable(rs []FaultResult) string {
	slices.SortFunc(rs, func(a, b FaultResult) int {
		if c := strings.Compare(a.Step, b.Step); c != 0 {
			return c
		}
		return int(a.Action - b.Action)
	})
	var sb strings.Builder
	sb.WriteString("\nstep          action     call (took)                      retry     blocked  bound   effects\n")
	worst := map[faultproxy.Action]time.Duration{}
	for _, r := range rs {
		call := "ok"
		switch {
		case r.CallErr == nil:
		case errors.Is(r.CallErr, context.DeadlineExceeded):
			call = "deadline"
		case errors.Is(r.CallErr, idempotency.ErrStore):
			call = "ErrStore"
		default:
			call = "UNTYPED"
		}
		retry := "executed"
		if r.Replayed {
			retry = "replayed"
		}
		if len(r.Known) > 0 {
			call += " KNOWN"
		}
		fmt.Fprintf(&sb, "%-13s %-10s %-32s %-9s %-8v %-7v %d\n", r.Step, r.Action,
			fmt.Sprintf("%s (%v)", call, r.CallTook.Round(time.Millisecond)), retry,
			r.Blocked.Round(time.Millisecond), r.Bound, r.Effects)
		worst[r.Action] = max(worst[r.Action], r.Blocked)
	}
	for _, a := range slices.Sorted(maps.Keys(worst)) {
		fmt.Fprintf(&sb, "longest blocked after %s: %v\n", a, worst[a].Round(time.Millisecond))
	}
	return sb.String()
}

func faultRand() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
