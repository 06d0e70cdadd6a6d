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
	records map[idempotency.Key]*idempotency.Record
	held    map[idempotency.Key]chan struct{} // closed when the holder ends
	ops     map[idempotency.Key]*opRow        // unfinished operations
	counts  map[string]int
	quota   map[quotaRow]*quotaCount // see quota.go
	// ReserveErr, when set, is returned by Reserve (to test failing stores).
	ReserveErr func() error
	// Conflict, when set, classifies fn's errors (see IsConflict).
	Conflict func(error) bool
	// Clock, when set, is the store's clock, read instead of time.Now (the
	// clock of this process, which is the store's own): a test clock.
	Clock func() time.Time
}

// now reads the store's clock, refusing a test clock's reading outside the
// contract's range.
func (s *Store) now() (time.Time, error) {
	if s.Clock == nil {
		return time.Now(), nil
	}
	now := s.Clock()
	return now, idempotency.CheckClock(now)
}

// IsConflict implements [idempotency.ConflictClassifier] through s.Conflict.
func (s *Store) IsConflict(err error) bool { return s.Conflict != nil && s.Conflict(err) }

var _ idempotency.KeyStore[*Tx] = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{records: map[idempotency.Key]*idempotency.Record{}, held: map[idempotency.Key]chan struct{}{},
		ops: map[idempotency.Key]*opRow{}, counts: map[string]int{}}
}

// Count returns how many effects tagged tag were committed.
func (s *Store) Count(tag string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[tag]
}

// Reserve implements [idempotency.KeyStore].
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*Tx], *idempotency.Record, error) {
	if s.ReserveErr != nil {
		if err := s.ReserveErr(); err != nil {
			return nil, nil, err
		}
	}
	deadline := time.NewTimer(r.Wait)
	defer deadline.Stop()
	for {
		now, err := s.now()
		if err != nil {
			return nil, nil, err
		}
		s.mu.Lock()
		if rec, ok := s.records[r.Key]; ok && rec.ExpiresAt.After(now) {
			s.mu.Unlock()
			cp := *rec // the caller owns its copy: no shared header map nor body
			cp.Header, cp.Body = rec.Header.Clone(), bytes.Clone(rec.Body)
			return nil, &cp, nil
		}
		if _, ok := s.ops[r.Key]; ok {
			s.mu.Unlock()
			return nil, nil, fmt.Errorf("%w: memstore: an unfinished operation", idempotency.ErrInProgress)
		}
		wait, busy := s.held[r.Key]
		if !busy {
			s.held[r.Key] = make(chan struct{})
			s.mu.Unlock()
			return &txn{s: s, r: r, created: now, tx: &Tx{}}, nil, nil
		}
		s.mu.Unlock()
		if r.Wait == 0 {
			return nil, nil, fmt.Errorf("%w: memstore", idempotency.ErrInProgress)
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-deadline.C:
			return nil, nil, fmt.Errorf("%w: memstore: waited %v", idempotency.ErrInProgress, r.Wait)
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
	r       idempotency.Reservation
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
	for _, e := range t.tx.effects {
		s.counts[e]++
	}
	s.records[t.r.Key] = &idempotency.Record{
		Key: t.r.Key, Fingerprint: t.r.Fingerprint, Status: resp.Status,
		Header: resp.Header.Clone(), Body: append([]byte{}, resp.Body...),
		CreatedAt: t.created, ExpiresAt: idempotency.Expiry(now, t.r.TTL),
	}
	t.release()
	return nil
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
