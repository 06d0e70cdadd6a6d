package conformance

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// storeInstances is how many instances of the store the racing cases use
// when the fixture can open more ([Fixture].Reopen), as that many
// processes of a service would.
const storeInstances = 4

// racingRounds is how many rounds of [Callers] racing callers
// RacingReserves fires, each caller on a Guard of its own. A store whose
// Reserve reads and then writes without a condition lets two of them take
// one free key in some rounds; the rounds make "some" most runs.
const racingRounds = 5

// instances returns up to n instances of the store on the fixture's
// records: f.Store, then more from Fixture.Reopen (none without it).
func (e *env[Tx]) instances(n int) []idempotency.KeyStore[Tx] {
	e.t.Helper()
	if len(e.stores) == 0 {
		e.stores = []idempotency.KeyStore[Tx]{e.f.Store}
	}
	for e.f.Reopen != nil && len(e.stores) < n {
		st, err := e.f.Reopen(e.ctx)
		if err != nil {
			e.t.Fatalf("Fixture.Reopen: %v", err)
		}
		if st == nil {
			e.t.Fatal("Fixture.Reopen returned a nil store")
		}
		e.stores = append(e.stores, st)
	}
	return e.stores[:min(n, len(e.stores))]
}

// guards returns n Guards with cfg, spread round-robin over the store's
// instances. Callers of one key on different Guards then race in the
// store, as callers in different processes do, instead of queueing in
// one Guard's memory.
func (e *env[Tx]) guards(n int, cfg *idempotency.Config) []*idempotency.Guard[Tx] {
	e.t.Helper()
	stores := e.instances(storeInstances)
	gs := make([]*idempotency.Guard[Tx], n)
	for i := range gs {
		gs[i] = e.guardOn(stores[i%len(stores)], cfg)
	}
	return gs
}

// racingReserves: rounds of 20 callers of one new key, each on a Guard of
// its own over several store instances. The store sees 20 Reserves of one
// free key at once, and exactly one of them may obtain a Txn. On a
// multi-primary cluster, exactly one may commit ([Features].MultiPrimary).
func (s *suite[Tx]) racingReserves(t *testing.T) {
	e := s.setup(t, Options{})
	gs := e.guards(Callers, nil)
	for round := range racingRounds {
		key := idempotency.Key{Scope: "race", ID: uniq("k")}
		tag := fmt.Sprint("race-", round)
		var calls atomic.Int64
		fn := e.effectFn(tag, &calls)
		rs := fire(t, Callers, func(i int) (idempotency.Response, error) {
			return gs[i].Do(e.ctx, key, "fp", fn)
		})
		contract := fmt.Sprintf("round %d: %d callers of one key on %d Guards over %d store instances",
			round, Callers, len(gs), len(e.stores))
		checkOneExecution(t, rs, contract)
		e.count(tag, 1, contract+" must give one effect")
		switch c := calls.Load(); {
		case c != 1 && s.h.Features.MultiPrimary:
			// Certified at commit: the losers rolled back (one effect,
			// checked above) and replayed.
			t.Logf("%s: fn ran %d times, one commit (Features.MultiPrimary)", contract, c)
		case c != 1:
			t.Fatalf("%s: fn ran %d times, want 1", contract, c)
		}
	}
}

// racingWinnerFails: the caller that takes the key fails while 19 callers
// on other Guards wait for it in the store. Once it rolled back, exactly
// one of them runs, and the others get that one's answer.
func (s *suite[Tx]) racingWinnerFails(t *testing.T) {
	s.winnerFailsOn(t, Callers, idempotency.Key{Scope: "race", ID: uniq("k")}, "the 19 callers on other Guards")
}
