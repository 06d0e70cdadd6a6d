package redis

import (
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// hold is a reservation this Store is making or holds. It serves two
// promises of the KeyStore contract. Redis may still name a token of this
// Store that has no hold. That token belongs to a reservation that is over
// (a lost reply, a failed release). The Store's callers then take the key
// over at once, rather than at the end of the lease. And the Store's own
// waiters wait on done. It is closed once the reservation has ended in
// Redis: completed, released, found lost, or never made. So they take a
// freed key at once, though a failed release publishes no wake-up.
type hold struct {
	token   string
	done    chan struct{}
	waiters atomic.Int32 // callers waiting on done
	// Set before done is closed, when Complete succeeded and someone
	// waited. rec is the stored record, as the reservation script would
	// return it. until is the monotonic instant it expires (by Redis's clock
	// when it was written).
	rec   *backend.Record
	until time.Time
}

func (s *Store) addHold(token string) *hold {
	h := &hold{token: token, done: make(chan struct{})}
	s.mu.Lock()
	s.holds[token] = h
	s.mu.Unlock()
	return h
}

// endHold wakes h's waiters; they look at the key again, or take the
// record h carries.
func (s *Store) endHold(h *hold) {
	s.mu.Lock()
	delete(s.holds, h.token)
	s.mu.Unlock()
	close(h.done)
}

// holdOf returns the hold of the reservation under token, if this Store is
// making or holds it.
func (s *Store) holdOf(token string) *hold {
	if token == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holds[token]
}

// record returns a copy of the record the holder completed, or nil.
func (h *hold) record() *backend.Record {
	if h.rec == nil {
		return nil
	}
	return cloneRecord(h.rec)
}
