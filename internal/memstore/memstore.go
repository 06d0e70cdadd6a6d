// Package memstore is an in-memory [idempotency.KeyStore] used to test the
// core and the conformance suite without a server. Its transaction is a
// buffer of effects applied on Complete, so effects and key commit together.
package memstore

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// Tx buffers the effects of one reservation.
type Tx struct {
	effects []string
}

// Effect records one effect tagged tag, applied when the reservation completes.
func (tx *Tx) Effect(tag string) { tx.effects = append(tx.effects, tag) }

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	mu      sync.Mutex
	records map[idempotency.Key]*backend.Record
	held    map[idempotency.Key]chan struct{} // closed when the holder ends
	ops     map[idempotency.Key]*opRow        // unfinished operations
	counts  map[string]int
	quota   map[quotaRow]*quotaCount // see quota.go
	// ReserveErr, when set, is returned by Reserve (to test failing stores).
	ReserveErr func() error
	// Conflict, when set, classifies fn's errors (see IsConflict).
	Conflict func(error) bool
	// SchemaErr, when set, is what CheckSchema returns (to test the
	// core's start-up check); nil passes it.
	SchemaErr func(backend.SchemaCheck) error
	// Clock, when set, is the store's clock, read instead of time.Now (the
	// clock of this process, which is the store's own): a test clock.
	Clock func() time.Time
	// StepLeases, when set, holds a Phase by its lease alone, as a store
	// without transactions (etcd) does: see leases.go.
	StepLeases bool
	// StaleStepCommits is a deliberate mistake, for the conformance
	// catalogue: a Phase whose lease was taken over still commits.
	StaleStepCommits bool
	leases           map[idempotency.Key]*stepHold // see leases.go
	gen              uint64                        // the last stepHold's
}

// now reads the store's clock, refusing a test clock's reading outside the
// contract's range.
func (s *Store) now() (time.Time, error) {
	if s.Clock == nil {
		return time.Now(), nil
	}
	now := s.Clock()
	return now, backend.CheckClock(now)
}

// IsConflict implements [backend.ConflictClassifier] through s.Conflict.
func (s *Store) IsConflict(err error) bool { return s.Conflict != nil && s.Conflict(err) }

var _ idempotency.KeyStore[*Tx] = (*Store)(nil)

var _ backend.SchemaChecker = (*Store)(nil)

// CheckSchema implements [backend.SchemaChecker]: an in-memory store
// has no schema, so it returns what s.SchemaErr returns, nil without one.
func (s *Store) CheckSchema(_ context.Context, c backend.SchemaCheck) error {
	if s.SchemaErr != nil {
		return s.SchemaErr(c)
	}
	return nil
}

// New returns an empty store.
func New() *Store {
	return &Store{records: map[idempotency.Key]*backend.Record{}, held: map[idempotency.Key]chan struct{}{},
		ops: map[idempotency.Key]*opRow{}, counts: map[string]int{}}
}

// Count returns how many effects tagged tag were committed.
func (s *Store) Count(tag string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[tag]
}

// Reserve implements [idempotency.KeyStore].
func (s *Store) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*Tx], *backend.Record, error) {
	if s.ReserveErr != nil {
		if err := s.ReserveErr(); err != nil {
			return nil, nil, err
		}
	}
	rec, now, err := s.take(ctx, r.Key, r.Wait, func(time.Time, bool) error {
		if _, ok := s.ops[r.Key]; ok {
			return fmt.Errorf("%w: memstore: an unfinished operation", idempotency.ErrInProgress)
		}
		return nil
	})
	if rec != nil || err != nil {
		return nil, rec, err
	}
	return &txn{s: s, r: r, created: now, tx: &Tx{}}, nil, nil
}

// take is the turn that Reserve and Acquire wait for on key. Each round,
// under s.mu and by the store's clock: a live record ends it (a copy is
// returned: the caller owns its header map and body); then claim is asked
// (busy tells whether another caller holds key), and its error ends it;
// then a holder makes it wait for the key's release, up to wait (0: not at
// all), and a free key becomes the caller's, held until its transaction
// ends.
func (s *Store) take(ctx context.Context, key idempotency.Key, wait time.Duration, claim func(now time.Time, busy bool) error) (*backend.Record, time.Time, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		now, err := s.now()
		if err != nil {
			return nil, now, err
		}
		s.mu.Lock()
		if rec, ok := s.records[key]; ok && rec.ExpiresAt.After(now) {
			s.mu.Unlock()
			cp := *rec
			cp.Header, cp.Body = rec.Header.Clone(), bytes.Clone(rec.Body)
			return &cp, now, nil
		}
		released, busy := s.held[key]
		if busy && s.lapsed(key, now) {
			s.takeOver(key)
			busy = false
		}
		if err := claim(now, busy); err != nil {
			s.mu.Unlock()
			return nil, now, err
		}
		if !busy {
			s.held[key] = make(chan struct{})
			s.mu.Unlock()
			return nil, now, nil
		}
		lapse := s.leaseEnd(key, now)
		s.mu.Unlock()
		if wait == 0 {
			return nil, now, fmt.Errorf("%w: memstore", idempotency.ErrInProgress)
		}
		select {
		case <-released:
		case <-lapse:
		case <-ctx.Done():
			return nil, now, ctx.Err()
		case <-deadline.C:
			return nil, now, fmt.Errorf("%w: memstore: waited %v", idempotency.ErrInProgress, wait)
		}
	}
}

// Purge implements [idempotency.KeyStore].
func (s *Store) Purge(_ context.Context, limit int) (int, error) {
	before, err := s.now()
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, rec := range s.records {
		if n == limit {
			break
		}
		if !rec.ExpiresAt.After(before) {
			delete(s.records, k)
			n++
		}
	}
	return n, nil
}

type txn struct {
	s       *Store
	r       backend.Reservation
	created time.Time // the store's clock at the reservation
	tx      *Tx
}

func (t *txn) Tx() *Tx { return t.tx }

func (t *txn) Complete(_ context.Context, resp idempotency.Response) error {
	s := t.s
	now, err := s.now()
	if err != nil {
		_ = t.Rollback(context.Background())
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t.commit(now, resp)
	t.release()
	return nil
}

// commit applies the effects and stores resp as the key's record; s.mu is
// held.
func (t *txn) commit(now time.Time, resp idempotency.Response) {
	s := t.s
	for _, e := range t.tx.effects {
		s.counts[e]++
	}
	s.records[t.r.Key] = &backend.Record{
		Key: t.r.Key, Fingerprint: t.r.Fingerprint, Status: resp.Status,
		Header: resp.Header.Clone(), Body: append([]byte{}, resp.Body...),
		CreatedAt: t.created, ExpiresAt: backend.Expiry(now, t.r.TTL),
	}
}

func (t *txn) Rollback(context.Context) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.release()
	return nil
}

func (t *txn) release() {
	close(t.s.held[t.r.Key])
	delete(t.s.held, t.r.Key)
}
