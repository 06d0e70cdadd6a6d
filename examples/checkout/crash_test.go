package main

import (
	"context"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// chargeRecorded is the kill point inside the processor call after the
// processor recorded the charge, before the service read its answer: the
// stub holds the answer back (processor.BlockNext) instead of the service
// pausing.
const chargeRecorded = "charge:recorded"

// crashCase is one cell of the crash matrix.
type crashCase struct {
	point    string
	declined bool
	// completer: the key is finished by the Completer of a fresh process,
	// with no retry from the client; else by the client's retry against a
	// fresh process whose Completer waits a minute.
	completer bool
}

func (c crashCase) name() string {
	s := c.point
	if c.declined {
		s += "/declined"
	}
	if c.completer {
		return s + "/completer"
	}
	return s + "/retry"
}

func crashCases() []crashCase {
	var cs []crashCase
	points := append(append([]string(nil), pausePoints[:3]...), chargeRecorded)
	points = append(points, pausePoints[3:]...)
	for _, p := range points {
		for _, completer := range []bool{false, true} {
			cs = append(cs, crashCase{point: p, completer: completer})
			if p == chargeRecorded || p == "before:receipt" {
				cs = append(cs, crashCase{point: p, declined: true, completer: completer})
			}
		}
	}
	return cs
}

// TestCrash kills the service with SIGKILL at every step boundary and
// inside the processor call, on each SQL store, then finishes the key by a
// client's retry or by the Completer of a fresh process: then the
// processor made exactly one charge, the tables hold one order, one
// receipt and one outbox event for the key, and every answer the client
// got is the stored one (or a 409, a 503, a refused or cut connection).
func TestCrash(t *testing.T) {
	t.Parallel()
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			serviceBinary(t)
			start := time.Now()
			ctx := testkit.Context(t, 3*time.Minute)
			t.Cleanup(func() {
				t.Logf("%d cases in %v", len(crashCases()), time.Since(start).Round(time.Millisecond))
			})
			for _, c := range crashCases() {
				t.Run(c.name(), func(t *testing.T) {
					t.Parallel()
					crash(t, ctx, sk, c)
				})
			}
		})
	}
}

const declinedAmount = 666

func crash(t *testing.T, ctx context.Context, sk storeKind, c crashCase) {
	f := newFixture(t, ctx, sk)
	amount := int64(1999)
	if c.declined {
		amount = declinedAmount
		f.proc.Decline(declinedAmount)
	}
	id := testkit.Name("crash-")
	key := keyOf(id)
	pauseAt := c.point
	var answers []answer
	var blocked interface{ Release() }
	recorded := make(<-chan string)
	if c.point == chargeRecorded {
		b := f.proc.BlockNext()
		blocked, recorded, pauseAt = b, b.Recorded(), ""
		t.Cleanup(b.Release)
	}
	first := f.start(ctx, serviceOpts{pauseAt: pauseAt})
	got := make(chan answer, 1)
	go func() { got <- post(ctx, first.url, id, amount) }()
	if blocked != nil {
		select {
		case k := <-recorded:
			if k != key.Derive("charge") {
				t.Fatalf("the processor recorded key %q, want the derived %q", k, key.Derive("charge"))
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no charge recorded in 20s:\n%s", first.log())
		}
	} else {
		first.waitMark(ctx, c.point, key, 20*time.Second)
	}
	first.kill()
	answers = append(answers, <-got)
	if answers[0].final() {
		t.Fatalf("the client got %v from the killed process", answers[0])
	}

	if !c.completer {
		second := f.start(ctx, serviceOpts{})
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		answers = append(answers, untilFinal(rctx, second.url, id, amount)...)
		cancel()
		second.stop()
	} else {
		second := f.start(ctx, serviceOpts{grace: 100 * time.Millisecond})
		if c.point == "before:order" {
			// Nothing committed: there is nothing to complete, and
			// nothing happened.
			time.Sleep(testLease + 500*time.Millisecond)
			f.checkNothing(ctx, id)
			second.stop()
			return
		}
		f.waitCompleted(ctx, key, 20*time.Second)
		// A read after the Completer finished: the replay.
		answers = append(answers, post(ctx, second.url, id, amount))
		second.stop()
	}
	if t.Failed() {
		return
	}
	f.checkKey(ctx, id, c.declined, answers)
	wantCharges, wantDeclines := 1, 0
	if c.declined {
		wantCharges, wantDeclines = 0, 1
	}
	if f.proc.Charges() != wantCharges || f.proc.Declines() != wantDeclines {
		t.Errorf("the processor made %d charges and %d declines, want %d and %d", f.proc.Charges(), f.proc.Declines(), wantCharges, wantDeclines)
	}
	t.Logf("answers: %v", answers)
}

// waitCompleted polls the store until key is completed.
func (f *fixture) waitCompleted(ctx context.Context, key idempotency.Key, d time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for {
		info, err := f.app.inspect(ctx, key)
		if err == nil && info.State == idempotency.KeyCompleted {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("key not completed in %v: %v %v", d, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkNothing asserts that no trace of id is anywhere.
func (f *fixture) checkNothing(ctx context.Context, id string) {
	f.t.Helper()
	key := keyOf(id)
	if info, err := f.app.inspect(ctx, key); err == nil {
		f.t.Errorf("key %s: %v, want no record", id, info.State)
	}
	n, err := f.app.count(ctx, "SELECT count(*) FROM "+newTables(f.prefix).Orders)
	if err != nil || n != 0 || f.proc.Requests() != 0 {
		f.t.Errorf("%d orders (%v), %d processor requests; want none", n, err, f.proc.Requests())
	}
}
