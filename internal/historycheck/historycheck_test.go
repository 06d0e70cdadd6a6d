package historycheck

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance"
)

// call builds a recorded call.
func call(client int, key string, from, to int64, outcome string, body string, replayed bool) conformance.HistoryCall {
	c := conformance.HistoryCall{Client: client, Key: key, Would: []byte("c" + strconv.Itoa(client)), Call: from, Return: to, Outcome: outcome}
	if outcome == conformance.OutcomeOK {
		c.Status, c.Body, c.Replayed = 201, []byte(body), replayed
	}
	if outcome == conformance.OutcomeUnknown {
		c.Return = -1
	}
	return c
}

// TestModel: the rules, on histories written by hand.
func TestModel(t *testing.T) {
	ok, unk, inp, failed := conformance.OutcomeOK, conformance.OutcomeUnknown, conformance.OutcomeInProgress, conformance.OutcomeFailed
	cases := []struct {
		name    string
		calls   []conformance.HistoryCall
		effects int
		legal   bool
	}{
		{"one execution, replays", []conformance.HistoryCall{call(0, "k", 0, 10, ok, "c0", false), call(1, "k", 5, 20, ok, "c0", true), call(2, "k", 1, 3, inp, "", false)}, 1, true},
		{"a replay that overlaps the execution may come first in time", []conformance.HistoryCall{call(1, "k", 0, 30, ok, "c0", true), call(0, "k", 1, 10, ok, "c0", false)}, 1, true},
		{"two executions", []conformance.HistoryCall{call(0, "k", 0, 10, ok, "c0", false), call(1, "k", 20, 30, ok, "c1", false)}, 2, false},
		{"a changed answer", []conformance.HistoryCall{call(0, "k", 0, 10, ok, "c0", false), call(1, "k", 20, 30, ok, "c0-changed", true)}, 1, false},
		{"an execution answering another call's body", []conformance.HistoryCall{call(0, "k", 0, 10, ok, "c1", false)}, 1, false},
		{"a replay before any execution", []conformance.HistoryCall{call(1, "k", 0, 5, ok, "c0", true), call(0, "k", 10, 20, ok, "c0", false)}, 1, false},
		{"fn failed after the key had an answer", []conformance.HistoryCall{call(0, "k", 0, 10, ok, "c0", false), call(1, "k", 20, 30, failed, "", false)}, 1, false},
		{"an unknown call that applied", []conformance.HistoryCall{call(0, "k", 0, -1, unk, "", false), call(1, "k", 20, 30, ok, "c0", true)}, 1, true},
		{"an unknown call that did not apply", []conformance.HistoryCall{call(0, "k", 0, -1, unk, "", false), call(1, "k", 20, 30, failed, "", false)}, 0, true},
		{"an effect without an answer", []conformance.HistoryCall{call(0, "k", 0, 10, failed, "", false)}, 1, false},
		{"an answer without its effect", []conformance.HistoryCall{call(0, "k", 0, 10, ok, "c0", false)}, 0, false},
		{"a mismatch", []conformance.HistoryCall{call(0, "k", 0, 10, conformance.OutcomeMismatch, "", false)}, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := conformance.History{Store: "hand", Calls: c.calls, Effects: map[string]int{"k": c.effects}, Ended: 40}
			// A second key, always right, does not hide the first's verdict.
			h.Calls = append(h.Calls, call(0, "other", 50, 60, ok, "c0", false))
			h.Effects["other"] = 1
			// The history as a file holds it: plain JSON, decoded again.
			b, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			h = conformance.History{}
			if err := json.Unmarshal(b, &h); err != nil {
				t.Fatal(err)
			}
			res := Check(h, 5*time.Second)
			if res.OK != c.legal {
				t.Fatalf("Check = %+v, want OK %v\n%s", res, c.legal, Describe(h, "k"))
			}
			if !c.legal && (len(res.Keys) != 1 || res.Keys[0] != "k") {
				t.Fatalf("bad keys %v, want [k]", res.Keys)
			}
		})
	}
}

// histories is how many histories TestHistories records per store:
// IDEMPOTENCY_HISTORIES, or 200.
func histories(t *testing.T) uint64 {
	if s := os.Getenv("IDEMPOTENCY_HISTORIES"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("IDEMPOTENCY_HISTORIES=%q: %v", s, err)
		}
		return n
	}
	return 200
}

// TestHistories records numbered histories on every store (postgres,
// mysql and redis through a fault proxy each) and checks them: none may
// break a rule.
func TestHistories(t *testing.T) {
	n := histories(t)
	for _, s := range Stores {
		t.Run(s, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			recs, closeAll, err := Lanes(ctx, s, 4, nil)
			if errors.Is(err, ErrNoServer) {
				if os.Getenv("IDEMPOTENCY_REQUIRE_ALL") == "1" {
					t.Fatalf("%v (IDEMPOTENCY_REQUIRE_ALL=1)", err)
				}
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll()
			sum, err := Run(ctx, recs, 1, n, 10*time.Second, nil)
			t.Logf("%s: %v", s, sum)
			for _, v := range sum.Violations {
				t.Errorf("%s", v)
			}
			if err != nil {
				t.Fatal(err)
			}
			if sum.Histories != int(n) {
				t.Fatalf("%d histories checked, want %d", sum.Histories, n)
			}
			if sum.Unknown == 0 {
				t.Errorf("no call had an unknown outcome: the faults did not reach the calls")
			}
		})
	}
}

func TestMain(m *testing.M) {
	quietMySQL()
	os.Exit(m.Run())
}
