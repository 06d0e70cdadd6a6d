package memstore

import (
	"context"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.QuotaCounter = (*Store)(nil)

// quotaRow names one window's counters of one scope.
type quotaRow struct {
	scope  string
	window time.Duration
	start  int64 // Unix milliseconds
}

type quotaCount struct {
	keys, inFlight, bytes int64
	end                   time.Time
}

// windowStart is the start, in Unix milliseconds, of the window of length
// w that now falls in.
func windowStart(now time.Time, w time.Duration) int64 {
	ms, span := now.UnixMilli(), w.Milliseconds()
	return ms - ((ms%span)+span)%span
}

// AdmitQuota implements [backend.QuotaCounter].
func (s *Store) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	if err := ctx.Err(); err != nil {
		return backend.QuotaAdmission{}, err
	}
	now, err := s.now()
	if err != nil {
		return backend.QuotaAdmission{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.records[q.Key]; ok && rec.ExpiresAt.After(now) {
		return backend.QuotaAdmission{Replay: true}, nil
	}
	start := windowStart(now, q.Quota.Window)
	row := quotaRow{q.Key.Scope, q.Quota.Window, start}
	if s.quota == nil {
		s.quota = map[quotaRow]*quotaCount{}
	}
	c := s.quota[row]
	if c == nil {
		c = &quotaCount{end: time.UnixMilli(start).Add(q.Quota.Window)}
		s.quota[row] = c
	}
	adm := backend.QuotaAdmission{WindowStart: time.UnixMilli(start), RetryAfter: c.end.Sub(now)}
	maxKeys, maxInFlight, maxBytes := q.Quota.Limits()
	switch {
	case c.keys >= maxKeys:
		adm.Over = backend.QuotaKeys
	case c.inFlight >= maxInFlight:
		adm.Over = backend.QuotaInFlight
	case c.bytes >= maxBytes:
		adm.Over = backend.QuotaBytes
	default:
		c.keys++
		c.inFlight++
		adm.Counted = true
	}
	return adm, nil
}

// EndQuota implements [backend.QuotaCounter].
func (s *Store) EndQuota(_ context.Context, e backend.QuotaEnd) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.quota[quotaRow{e.Scope, e.Window, e.WindowStart.UnixMilli()}]
	if c == nil {
		return nil
	}
	c.inFlight = max(0, c.inFlight-1)
	if !e.Created {
		c.keys = max(0, c.keys-1)
	}
	c.bytes += e.Bytes
	return nil
}

// PurgeQuota implements [backend.QuotaCounter].
func (s *Store) PurgeQuota(_ context.Context, limit int) (int, error) {
	now, err := s.now()
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for row, c := range s.quota {
		if n == limit {
			break
		}
		if !c.end.After(now) {
			delete(s.quota, row)
			n++
		}
	}
	return n, nil
}
