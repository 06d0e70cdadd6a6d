package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
)

// leaseStore is an in-memory store that holds keys by lease, as a Redis,
// DynamoDB or etcd store does: a reservation runs out lease after it was
// taken (never renewed), and another caller may then take the key. With
// checkOwner it refuses Complete from an owner whose lease was taken over
// (correct); without it, that owner still completes (broken: its effect
// applies after the new owner's, two effects for one key).
type leaseStore struct {
	lease      time.Duration
	now        func() time.Time // the store's clock, for expiries (leases run on time.Now)
	checkOwner bool

	mu     sync.Mutex
	recs   map[idempotency.Key]*leaseRec
	counts map[string]int
	token  uint64
	wake   chan struct{} // closed and replaced whenever a record changes
}

type leaseRec struct {
	pending  bool
	token    uint64
	leaseEnd time.Time
	rec      idempotency.Record
	ttl      time.Duration
}

// leaseTx buffers the effects of one reservation, applied on Complete.
type leaseTx struct{ effects []string }

func newLeaseStore(lease time.Duration, checkOwner bool) *leaseStore {
	return &leaseStore{lease: lease, checkOwner: checkOwner, recs: map[idempotency.Key]*leaseRec{},
		counts: map[string]int{}, wake: make(chan struct{})}
}

// changed wakes the waiters; s.mu is held.
func (s *leaseStore) changed() {
	close(s.wake)
	s.wake = make(chan struct{})
}

func (s *leaseStore) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*leaseTx], *idempotency.Record, error) {
	deadline := time.Now().Add(r.Wait)
	for {
		s.mu.Lock()
		cur := s.recs[r.Key]
		now, clk := time.Now(), s.now()
		if err := idempotency.CheckClock(clk); err != nil {
			s.mu.Unlock()
			return nil, nil, err
		}
		switch {
		case cur != nil && !cur.pending && cur.rec.ExpiresAt.After(clk):
			rec := cur.rec
			rec.Header, rec.Body = rec.Header.Clone(), bytes.Clone(rec.Body)
			s.mu.Unlock()
			return nil, &rec, nil
		case cur == nil || !cur.pending || !now.Before(cur.leaseEnd):
			s.token++
			token := s.token
			s.recs[r.Key] = &leaseRec{pending: true, token: token, leaseEnd: now.Add(s.lease),
				rec: idempotency.Record{Key: r.Key, Fingerprint: r.Fingerprint, CreatedAt: clk, ExpiresAt: idempotency.Expiry(clk, r.TTL)}, ttl: r.TTL}
			s.mu.Unlock()
			return &leaseTxn{s: s, key: r.Key, token: token, tx: &leaseTx{}}, nil, nil
		}
		wake, leaseEnd := s.wake, cur.leaseEnd
		s.mu.Unlock()
		if !now.Before(deadline) {
			return nil, nil, fmt.Errorf("%w: lease store: key %q is held", idempotency.ErrInProgress, r.Key.ID)
		}
		timer := time.NewTimer(min(time.Until(deadline), time.Until(leaseEnd)))
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, nil, ctx.Err()
		}
		timer.Stop()
	}
}

func (s *leaseStore) Purge(_ context.Context, limit int) (int, error) {
	before := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, cur := range s.recs {
		if n < limit && !cur.pending && !cur.rec.ExpiresAt.After(before) {
			delete(s.recs, k)
			n++
		}
	}
	return n, nil
}

func (s *leaseStore) count(tag string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[tag]
}

type leaseTxn struct {
	s     *leaseStore
	key   idempotency.Key
	token uint64
	tx    *leaseTx
}

func (t *leaseTxn) Tx() *leaseTx { return t.tx }

func (t *leaseTxn) Complete(ctx context.Context, resp idempotency.Response) error {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.recs[t.key]
	owner := cur != nil && cur.pending && cur.token == t.token
	if err := ctx.Err(); err != nil {
		if owner {
			delete(s.recs, t.key)
			s.changed()
		}
		return err
	}
	if s.checkOwner && !owner {
		return fmt.Errorf("%w: lease store: key %q", idempotency.ErrLeaseLost, t.key.ID)
	}
	for _, tag := range t.tx.effects {
		s.counts[tag]++
	}
	rec := idempotency.Record{Key: t.key, Status: resp.Status, Header: resp.Header.Clone(), Body: bytes.Clone(resp.Body)}
	if cur != nil {
		rec.Fingerprint, rec.CreatedAt = cur.rec.Fingerprint, cur.rec.CreatedAt
		rec.ExpiresAt = idempotency.Expiry(s.now(), cur.ttl)
	}
	s.recs[t.key] = &leaseRec{rec: rec}
	s.changed()
	return nil
}

func (t *leaseTxn) Rollback(context.Context) error {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.recs[t.key]; cur != nil && cur.pending && cur.token == t.token {
		delete(s.recs, t.key)
		s.changed()
	}
	return nil
}

// leaseHarness builds a fresh leaseStore per case, honouring Options.Lease.
func leaseHarness(checkOwner bool) conformance.Harness[*leaseTx] {
	return conformance.Harness[*leaseTx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*leaseTx] {
			lease := 30 * time.Second
			if opts.Lease > 0 {
				lease = opts.Lease
			}
			s := newLeaseStore(lease, checkOwner)
			s.now = clockOr(opts.Clock)
			return conformance.Fixture[*leaseTx]{
				Store: s,
				Effect: func(_ context.Context, tx *leaseTx, tag string) error {
					tx.effects = append(tx.effects, tag)
					return nil
				},
				Count: func(_ context.Context, tag string) (int, error) { return s.count(tag), nil },
			}
		},
		Features: conformance.Features{Leases: true},
	}
}

// TestLeaseStoreConformance: a store that holds keys by lease and refuses
// a stale owner passes the whole suite, LeaseRunsOut included.
func TestLeaseStoreConformance(t *testing.T) {
	conformance.Run(t, leaseHarness(true))
}

// clockOr is the store's clock of a test store: the fixture's test clock,
// or time.Now.
func clockOr(clk func() time.Time) func() time.Time {
	if clk != nil {
		return clk
	}
	return time.Now
}
