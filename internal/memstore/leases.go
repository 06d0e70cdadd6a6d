package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// With Store.StepLeases, a Phase holds its key by its Acquisition's lease
// alone, as a store without transactions does (etcd, DynamoDB): once the
// lease ran out by the store's clock, another Reserve or Acquire takes the
// key over while the phase is still open, and the stale phase's Save,
// Release and Complete return ErrLeaseLost and commit nothing; its
// Rollback frees nothing. Without it a Phase holds its key until it ends,
// as a database transaction does.

// stepHold is the lease of an open Phase: its generation (which phase it
// is) and when it ends by the store's clock.
type stepHold struct {
	gen       uint64
	leaseEnds time.Time
}

// hold registers the lease of a phase that just took key; it returns the
// phase's generation (0 without StepLeases).
func (s *Store) hold(key idempotency.Key, now time.Time, lease time.Duration) uint64 {
	if !s.StepLeases {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases == nil {
		s.leases = map[idempotency.Key]*stepHold{}
	}
	s.gen++
	s.leases[key] = &stepHold{gen: s.gen, leaseEnds: now.Add(lease)}
	return s.gen
}

// lapsed reports whether key is held by a phase whose lease ended; s.mu
// is held.
func (s *Store) lapsed(key idempotency.Key, now time.Time) bool {
	h := s.leases[key]
	return s.StepLeases && h != nil && !h.leaseEnds.After(now)
}

// takeOver ends the hold of a phase whose lease lapsed: its waiters wake,
// and it is stale from now on; s.mu is held.
func (s *Store) takeOver(key idempotency.Key) {
	close(s.held[key])
	delete(s.held, key)
	delete(s.leases, key)
}

// leaseEnd is a channel that fires when the lease of the phase holding key
// ends (nil: no such lease); s.mu is held. A test clock that stands still
// is read again then.
func (s *Store) leaseEnd(key idempotency.Key, now time.Time) <-chan time.Time {
	h := s.leases[key]
	if !s.StepLeases || h == nil {
		return nil
	}
	return time.After(max(h.leaseEnds.Sub(now), time.Millisecond))
}

// holds reports whether the phase of generation gen still holds key; s.mu
// is held.
func (s *Store) holds(key idempotency.Key, gen uint64) bool {
	if !s.StepLeases {
		return true
	}
	h := s.leases[key]
	return h != nil && h.gen == gen
}

// stale is the error of a phase whose lease was taken over; s.mu is held.
// It is nil for a phase that still holds its key, and with the
// StaleStepCommits mistake.
func (p *phase) stale() error {
	if p.s.holds(p.r.Key, p.gen) || p.s.StaleStepCommits {
		return nil
	}
	return fmt.Errorf("%w: memstore: key %v: the phase's lease ran out and another run took the key", backend.ErrLeaseLost, p.r.Key)
}

// releasePhase ends the phase's hold, if it still holds the key; s.mu is
// held.
func (p *phase) releasePhase() {
	if p.s.holds(p.r.Key, p.gen) {
		p.release()
		delete(p.s.leases, p.r.Key)
	}
}

// Rollback discards the phase; a stale phase frees nothing.
func (p *phase) Rollback(context.Context) error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	p.releasePhase()
	return nil
}
