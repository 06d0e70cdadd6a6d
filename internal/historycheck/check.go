// Package historycheck checks recorded histories of calls of
// idempotency's Guard.Do ([conformance.History]) with porcupine, against
// the sequential rules of one key, a model per key (the history is
// partitioned by key):
//
//   - the first call that completes fixes the key's answer: it ran fn (not
//     replayed) and answered what its own fn returns;
//   - every later call returns that answer, replayed byte for byte, or
//     reports the key in progress; no call runs fn once the key has an
//     answer, and fn never fails on a key that has one (it never runs);
//   - a call whose outcome is unknown (its caller died, its reply was lost,
//     the store failed) may or may not have applied, at any time between
//     its start and the end of the calls;
//   - the effects committed equal the completed keys: one for a key that
//     ends with an answer, none for a key that ends free.
//
// It is a module of its own so that the library's go.mod needs no
// porcupine; the recording side (package conformance) does not import it.
package historycheck

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/go-idempotency/idempotency/conformance"
)

// input is what a call was asked, as the model sees it.
type input struct {
	key     string
	would   string // the answer the call's fn gives
	effects bool   // the final count of effects, not a call
	probe   bool
}

// output is what a call got.
type output struct {
	outcome  string
	answer   string // status and body of an OutcomeOK call
	replayed bool
	effects  int
}

func answerOf(status int, body []byte) string { return fmt.Sprintf("%d %s", status, body) }

// none is the state of a key without an answer; any other state is the
// answer, as answerOf writes it.
const none = ""

// Model is the sequential specification of one key, partitioned by key.
var Model = porcupine.NondeterministicModel{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range ops {
			k := op.Input.(input).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		parts := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, byKey[k])
		}
		return parts
	},
	Init: func() []any { return []any{none} },
	Step: func(state, in, out any) []any {
		s, i, o := state.(string), in.(input), out.(output)
		if i.effects {
			if (o.effects == 0 && s == none) || (o.effects == 1 && s != none) {
				return []any{s}
			}
			return nil
		}
		switch o.outcome {
		case conformance.OutcomeOK:
			switch {
			case o.replayed && s != none && o.answer == s:
				return []any{s}
			case !o.replayed && s == none && !i.probe && o.answer == i.would:
				return []any{o.answer}
			}
			return nil // a second execution, a changed answer, a replay of nothing
		case conformance.OutcomeInProgress:
			return []any{s}
		case conformance.OutcomeFailed:
			if s == none { // fn ran: the key had no answer
				return []any{s}
			}
			return nil
		case conformance.OutcomeUnknown:
			if s == none && !i.probe {
				return []any{s, i.would}
			}
			return []any{s}
		}
		return nil // a mismatch, or an outcome the model does not know
	},
	Equal: func(a, b any) bool { return a.(string) == b.(string) },
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		if i.effects {
			return fmt.Sprintf("effects of %s: %d", i.key, o.effects)
		}
		return fmt.Sprintf("%s: %s %q replayed=%v", i.key, o.outcome, o.answer, o.replayed)
	},
}

// Operations turns h into porcupine's operations: its calls, and per key
// the final count of effects after them.
func Operations(h conformance.History) []porcupine.Operation {
	var ops []porcupine.Operation
	last := h.Ended
	for _, c := range h.Calls {
		last = max(last, c.Return)
	}
	for _, c := range h.Calls {
		ret := c.Return
		if c.Outcome == conformance.OutcomeUnknown || ret < 0 {
			ret = max(h.Ended, c.Call+1)
		}
		ops = append(ops, porcupine.Operation{
			ClientId: c.Client,
			Input:    input{key: c.Key, would: answerOf(201, c.Would), probe: c.Probe},
			Call:     c.Call,
			Output:   output{outcome: c.Outcome, answer: answerOf(c.Status, c.Body), replayed: c.Replayed},
			Return:   ret,
		})
	}
	client := 0
	for _, c := range h.Calls {
		client = max(client, c.Client+1)
	}
	for k, n := range h.Effects {
		ops = append(ops, porcupine.Operation{ClientId: client, Input: input{key: k, effects: true},
			Call: last + 1, Output: output{effects: n}, Return: last + 2})
	}
	return ops
}

// Result is the verdict on one history.
type Result struct {
	// OK: some order of the calls, each taking effect between its start
	// and its return, obeys the rules of every key.
	OK bool
	// Keys are the keys whose calls no such order explains.
	Keys []string
	// Took is how long the check took.
	Took time.Duration
	// TimedOut: porcupine gave up (the result is then not OK).
	TimedOut bool
}

// Check checks h, within timeout (0: no bound).
func Check(h conformance.History, timeout time.Duration) Result {
	start := time.Now()
	m := Model.ToModel()
	ops := Operations(h)
	res := porcupine.CheckOperationsTimeout(m, ops, timeout)
	r := Result{OK: res == porcupine.Ok, TimedOut: res == porcupine.Unknown}
	if !r.OK {
		for _, part := range m.Partition(ops) {
			if porcupine.CheckOperationsTimeout(m, part, timeout) != porcupine.Ok {
				r.Keys = append(r.Keys, part[0].Input.(input).key)
			}
		}
	}
	r.Took = time.Since(start)
	return r
}

// Describe prints the calls of h on key, in order of start, for a report.
func Describe(h conformance.History, key string) string {
	calls := make([]conformance.HistoryCall, 0, len(h.Calls))
	for _, c := range h.Calls {
		if c.Key == key {
			calls = append(calls, c)
		}
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].Call < calls[j].Call })
	var sb strings.Builder
	fmt.Fprintf(&sb, "history %d on %s (fault: %s), key %s, %d effects:\n", h.Number, h.Store, orNone(h.Fault), key, h.Effects[key])
	for _, c := range calls {
		ret := "unknown"
		if c.Return >= 0 && c.Outcome != conformance.OutcomeUnknown {
			ret = time.Duration(c.Return).String()
		}
		what := c.Outcome
		if c.Outcome == conformance.OutcomeOK {
			what = fmt.Sprintf("%d %s (replayed %v)", c.Status, c.Body, c.Replayed)
		} else if c.ErrKind != "" {
			what += " (" + c.ErrKind + ")"
		}
		probe := ""
		if c.Probe {
			probe = " probe"
		}
		fmt.Fprintf(&sb, "  client %d%s [%v, %s]: %s\n", c.Client, probe, time.Duration(c.Call), ret, what)
	}
	return sb.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
