package conformance

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// The Quota cases check the counters of [backend.QuotaCounter]
// directly, on a store that implements it; on any other store they are
// skipped, naming the interface.

// quotaWindow is the window of the Quota cases: a day, so that a case
// rarely spans two windows; one that does is done again.
const quotaWindow = backend.MaxQuotaWindow

// quotaRetryFor bounds how long a caller of the Quota cases retries an
// admission the store refused with ErrConflict.
const quotaRetryFor = 10 * time.Second

// quotaCounter returns the fixture's store as a QuotaCounter, or skips the
// case.
func (e *env[Tx]) quotaCounter(st idempotency.KeyStore[Tx]) backend.QuotaCounter {
	e.t.Helper()
	q, ok := st.(backend.QuotaCounter)
	if !ok {
		e.lacking("QuotaCounter")
	}
	return q
}

// admit calls AdmitQuota and fails the case on an error.
func (e *env[Tx]) admit(qc backend.QuotaCounter, key idempotency.Key, q backend.Quota) backend.QuotaAdmission {
	e.t.Helper()
	a, err := qc.AdmitQuota(e.ctx, backend.QuotaCheck{Key: key, Quota: q})
	if err != nil {
		e.t.Fatalf("AdmitQuota: %v", err)
	}
	return a
}

// end calls EndQuota for an admission of scope and fails the case on an
// error.
func (e *env[Tx]) end(qc backend.QuotaCounter, scope string, q backend.Quota, a backend.QuotaAdmission, created bool) {
	e.t.Helper()
	err := qc.EndQuota(e.ctx, backend.QuotaEnd{Scope: scope, Window: q.Window, WindowStart: a.WindowStart, Created: created})
	if err != nil {
		e.t.Fatalf("EndQuota: %v", err)
	}
}

// quotaAtomic: Callers admissions of distinct new keys of one scope race
// over several store instances; exactly MaxKeys are counted and the others
// refused (QuotaKeys). A counter that is read and then written lets racing
// admissions overwrite each other and counts more.
func (s *suite[Tx]) quotaAtomic(t *testing.T) {
	s.need(t, "QuotaCounter")
	e := s.setup(t, Options{})
	stores := e.instances(storeInstances)
	qcs := make([]backend.QuotaCounter, len(stores))
	for i, st := range stores {
		qcs[i] = e.quotaCounter(st)
	}
	const limit = 5
	q := backend.Quota{Window: quotaWindow, MaxKeys: limit}
	for round := 1; ; round++ {
		scope := uniq("quota")
		adms := make([]backend.QuotaAdmission, Callers)
		errs := make([]error, Callers)
		var conflicts atomic.Int64
		fire(t, Callers, func(i int) (idempotency.Response, error) {
			check := backend.QuotaCheck{Key: idempotency.Key{Scope: scope, ID: uniq("k")}, Quota: q}
			// A conflict the store reports (ErrConflict) is retried, as a
			// caller retries one: it counted nothing. The retries are
			// bounded by time, not by count: a store without a wait of its
			// own (SQLite without a busy timeout) may refuse one caller
			// many times in a row on a loaded host.
			n, _ := e.retryingConflicts(quotaRetryFor, func(time.Time) error {
				adms[i], errs[i] = qcs[i%len(qcs)].AdmitQuota(e.ctx, check)
				return errs[i]
			})
			conflicts.Add(int64(n))
			return idempotency.Response{}, nil
		})
		if n := conflicts.Load(); n > 0 {
			t.Logf("round %d: %d admissions met a conflict (ErrConflict) and were retried", round, n)
		}
		counted, windows := 0, map[time.Time]bool{}
		for i, a := range adms {
			if errs[i] != nil {
				t.Fatalf("AdmitQuota of new key %d racing %d others: %v", i, Callers-1, errs[i])
			}
			windows[a.WindowStart.UTC()] = true
			switch {
			case a.Counted:
				counted++
			case a.Over != backend.QuotaKeys:
				t.Fatalf("AdmitQuota of new key %d: %+v; want it counted, or refused with QuotaKeys", i, a)
			}
		}
		if len(windows) > 1 && round < 3 {
			continue // the admissions spanned two windows
		}
		if counted != limit {
			t.Fatalf("%d admissions of new keys of one scope at once, over %d store instances, MaxKeys %d: %d counted, want exactly %d "+
				"(AdmitQuota is atomic: a counter read and then written lets racing admissions overwrite each other)", Callers, len(qcs), limit, counted, limit)
		}
		return
	}
}

// quotaReplayFree: a key whose record is completed and live is reported
// Replay, counted in nothing and never refused, even with the scope's
// limits reached; a new key is still counted as before.
func (s *suite[Tx]) quotaReplayFree(t *testing.T) {
	s.need(t, "QuotaCounter")
	e := s.setup(t, Options{})
	qc := e.quotaCounter(e.f.Store)
	scope := uniq("quota")
	done := idempotency.Key{Scope: scope, ID: uniq("done")}
	e.executes(e.guard(&idempotency.Config{TTL: time.Hour}), done, uniq("q"), "a key to replay")
	q := backend.Quota{Window: quotaWindow, MaxKeys: 2, MaxInFlight: 2}
	for i := range 5 {
		a := e.admit(qc, done, q)
		if !a.Replay || a.Counted || a.Over != 0 {
			t.Fatalf("AdmitQuota %d of a key completed and live: %+v; want Replay, not counted, not refused", i+1, a)
		}
	}
	first := e.admit(qc, idempotency.Key{Scope: scope, ID: uniq("new")}, q)
	second := e.admit(qc, idempotency.Key{Scope: scope, ID: uniq("new")}, q)
	if !first.Counted || !second.Counted {
		t.Fatalf("two new keys after 5 replays, MaxKeys 2: %+v, %+v; want both counted (a replay costs nothing)", first, second)
	}
	if a := e.admit(qc, done, q); !a.Replay || a.Counted || a.Over != 0 {
		t.Fatalf("AdmitQuota of a key completed and live, with the scope's MaxKeys reached: %+v; want Replay, never refused", a)
	}
}

// quotaRefusedNotCounted: over a limit nothing is counted. MaxKeys 2: two
// keys counted, two refused; one counted key ends with nothing stored, so
// the next new key is counted. MaxInFlight 1: the second key is refused
// while the first runs, and counted once it ended.
func (s *suite[Tx]) quotaRefusedNotCounted(t *testing.T) {
	s.need(t, "QuotaCounter")
	e := s.setup(t, Options{})
	qc := e.quotaCounter(e.f.Store)
	for round := 1; ; round++ {
		scope := uniq("quota")
		key := func() idempotency.Key { return idempotency.Key{Scope: scope, ID: uniq("k")} }
		q := backend.Quota{Window: quotaWindow, MaxKeys: 2}
		var adms []backend.QuotaAdmission
		step := func(want string, a backend.QuotaAdmission) {
			t.Helper()
			adms = append(adms, a)
			got := "counted"
			if !a.Counted {
				got = fmt.Sprintf("refused by %v", a.Over)
			}
			if got != want && len(windowsOf(adms)) == 1 {
				t.Fatalf("%s: got %s (%+v), want %s: over a limit nothing is counted", scope, got, a, want)
			}
		}
		k1 := e.admit(qc, key(), q)
		step("counted", k1)
		step("counted", e.admit(qc, key(), q))
		step(fmt.Sprintf("refused by %v", backend.QuotaKeys), e.admit(qc, key(), q))
		step(fmt.Sprintf("refused by %v", backend.QuotaKeys), e.admit(qc, key(), q))
		e.end(qc, scope, q, k1, false) // one key less: it stored nothing
		step("counted", e.admit(qc, key(), q))
		step(fmt.Sprintf("refused by %v", backend.QuotaKeys), e.admit(qc, key(), q))

		fl := backend.Quota{Window: quotaWindow, MaxInFlight: 1}
		scope = uniq("quota")
		r1 := e.admit(qc, key(), fl)
		step("counted", r1)
		step(fmt.Sprintf("refused by %v", backend.QuotaInFlight), e.admit(qc, key(), fl))
		step(fmt.Sprintf("refused by %v", backend.QuotaInFlight), e.admit(qc, key(), fl))
		e.end(qc, scope, fl, r1, true)
		step("counted", e.admit(qc, key(), fl))
		if len(windowsOf(adms)) == 1 || round == 3 {
			return
		}
	}
}

// windowsOf returns the distinct windows the admissions were counted in.
func windowsOf(adms []backend.QuotaAdmission) map[time.Time]bool {
	w := map[time.Time]bool{}
	for _, a := range adms {
		if !a.WindowStart.IsZero() {
			w[a.WindowStart.UTC()] = true
		}
	}
	return w
}
