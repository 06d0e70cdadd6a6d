package conformance_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// memHarness runs the suite on the in-memory store, changed by wrap.
func memHarness(wrap func(*memstore.Store) idempotency.KeyStore[*memstore.Tx]) conformance.Harness[*memstore.Tx] {
	return conformance.Harness[*memstore.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*memstore.Tx] {
			s := memstore.New()
			s.Clock = opts.Clock
			return conformance.Fixture[*memstore.Tx]{
				Store:  wrap(s),
				Effect: func(_ context.Context, tx *memstore.Tx, tag string) error { tx.Effect(tag); return nil },
				Count:  func(_ context.Context, tag string) (int, error) { return s.Count(tag), nil },
			}
		},
	}
}

// quotaMistakes are the deliberate bugs of a quotaStore.
type quotaMistakes struct {
	readThenWrite bool // AdmitQuota reads the counters, then writes them unconditionally
	countsReplays bool // a key completed and live is counted like a new one
	countsRefused bool // a refused admission is counted all the same
}

// quotaStore is the in-memory store with quota counters of its own, each
// mistake a third-party author made. Without mistakes it is correct.
type quotaStore struct {
	*memstore.Store
	bugs quotaMistakes
	mu   sync.Mutex
	rows map[quotaRow]*quotaRowCount
}

type quotaRow struct {
	scope  string
	window time.Duration
	start  int64 // Unix milliseconds
}

type quotaRowCount struct{ keys, inFlight int64 }

func (s *quotaStore) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	if !s.bugs.countsReplays {
		if info, err := s.Inspect(ctx, q.Key, false); err == nil && info.State == backend.KeyCompleted {
			return backend.QuotaAdmission{Replay: true}, nil
		}
	}
	now := time.Now()
	ms, span := now.UnixMilli(), q.Quota.Window.Milliseconds()
	row := quotaRow{q.Key.Scope, q.Quota.Window, ms - ms%span}
	adm := backend.QuotaAdmission{WindowStart: time.UnixMilli(row.start), RetryAfter: time.UnixMilli(row.start + span).Sub(now)}
	s.mu.Lock()
	c := s.rows[row]
	if c == nil {
		c = &quotaRowCount{}
		s.rows[row] = c
	}
	read := *c
	if s.bugs.readThenWrite { // a round trip between the read and the write
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	maxKeys, maxInFlight, _ := q.Quota.Limits()
	switch {
	case read.keys >= maxKeys:
		adm.Over = backend.QuotaKeys
	case read.inFlight >= maxInFlight:
		adm.Over = backend.QuotaInFlight
	default:
		adm.Counted = true
	}
	if adm.Counted || s.bugs.countsRefused {
		*c = quotaRowCount{keys: read.keys + 1, inFlight: read.inFlight + 1}
	}
	return adm, nil
}

func (s *quotaStore) EndQuota(_ context.Context, e backend.QuotaEnd) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.rows[quotaRow{e.Scope, e.Window, e.WindowStart.UnixMilli()}]
	if c == nil {
		return nil
	}
	c.inFlight = max(0, c.inFlight-1)
	if !e.Created {
		c.keys = max(0, c.keys-1)
	}
	return nil
}

func (s *quotaStore) PurgeQuota(context.Context, int) (int, error) { return 0, nil }

var _ backend.QuotaCounter = (*quotaStore)(nil)

// quotaSuite runs the suite on a quotaStore with mistakes m.
func quotaSuite(m quotaMistakes) func(t *testing.T) {
	return func(t *testing.T) {
		conformance.Run(t, memHarness(func(s *memstore.Store) idempotency.KeyStore[*memstore.Tx] {
			return &quotaStore{Store: s, bugs: m, rows: map[quotaRow]*quotaRowCount{}}
		}))
	}
}

// staleStepSuite runs the suite on the in-memory store holding phases by
// their leases, whose stale phase still commits.
func staleStepSuite(t *testing.T) {
	conformance.Run(t, memHarness(func(s *memstore.Store) idempotency.KeyStore[*memstore.Tx] {
		s.StepLeases, s.StaleStepCommits = true, true
		return s
	}))
}

// TestQuotaStoreConformance: the quota store without mistakes passes the
// suite's Quota cases (and the rest).
func TestQuotaStoreConformance(t *testing.T) {
	t.Parallel() // with TestCatalogue
	quotaSuite(quotaMistakes{})(t)
}
