package redis

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
)

// This file holds what the callers of one Store share in memory: the
// reservations it is making or holds (hold), on which its own waiters
// wait, and the runs of the reservation script that callers of the same
// key join (look).

// hold is a reservation this Store is making or holds, for the Store's own
// waiters: done is closed once it has ended in Redis (completed, released,
// found lost, or never made).
type hold struct {
	token   string
	done    chan struct{}
	waiters atomic.Int32 // callers waiting on done
	// Callers of the same key waiting for this caller's reservation
	// script (see look), nil while there are none, and which look that
	// is. Guarded by Store.mu.
	joined *lookResult
	seq    uint64
	// Set before done is closed when Complete succeeded and someone
	// waited: the stored record, as the reservation script would return it,
	// and the monotonic instant it expires (by Redis's clock when it was
	// written).
	rec   *idempotency.Record
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
func (h *hold) record() *idempotency.Record {
	if h.rec == nil {
		return nil
	}
	return cloneRecord(h.rec)
}

// lookSeq numbers the latest look started.
func (s *Store) lookSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.looks
}

// lookResult is what one run of the reservation script found, for the
// callers that joined it.
type lookResult struct {
	done   chan struct{} // closed once out and err are set
	out    tryResult     // out.rec, if any, is the callers' to copy, never to change
	err    error
	leader string // the token the script ran with
	n      int    // callers that joined; guarded by Store.mu
}

// look runs the reservation script for r under own's token, unless another
// caller of this Store is running it for the same key: then it waits for
// that answer and uses it when it can (the key held by that caller, or a
// completed record that has not expired on r's clock); otherwise it runs
// the script itself. Concurrent callers of one key thus cost one round
// trip, not one each. A look numbered after or lower started before what
// the caller waits to see (its subscription, a wake-up), and may have run
// before it: the caller does not join it. Nor does a caller that takes the
// key over from a dead token (see Reserve).
func (s *Store) look(ctx context.Context, k keys, r idempotency.Reservation, own *hold, after uint64, dead string) (tryResult, error) {
	s.mu.Lock()
	l := s.looking[k.rec]
	if l != nil && (l.seq <= after || dead != "") {
		s.mu.Unlock()
		return s.try(ctx, k, r, own.token, dead)
	}
	if l == nil {
		s.looks++
		own.seq = s.looks
		s.looking[k.rec] = own
		s.mu.Unlock()
		out, err := s.try(ctx, k, r, own.token, dead)
		s.mu.Lock()
		delete(s.looking, k.rec)
		j := own.joined
		own.joined = nil
		s.mu.Unlock()
		if j != nil {
			j.out, j.err = out, err
			j.out.conn = nil // the leader's own
			if out.rec != nil {
				j.out.rec = cloneRecord(out.rec) // the caller may change its own
			}
			close(j.done)
		}
		return out, err
	}
	j := l.joined
	if j == nil {
		j = &lookResult{done: make(chan struct{}), leader: l.token}
		l.joined = j
	}
	j.n++
	s.mu.Unlock()
	select {
	case <-j.done:
	case <-ctx.Done():
		return tryResult{}, ctx.Err()
	}
	switch out := j.out; {
	case j.err != nil:
		// The other caller failed (its own context may have ended): look
		// ourselves.
	case out.reserved:
		return tryResult{pttl: -1, owner: j.leader}, nil
	case out.rec != nil:
		if out.rec.Key == r.Key && s.liveInMemory(out.rec, out.until) {
			return tryResult{rec: cloneRecord(out.rec)}, nil
		}
	default:
		return out, nil // pending: held by someone else
	}
	return s.try(ctx, k, r, own.token, dead)
}
