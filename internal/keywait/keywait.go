// Package keywait queues the callers of one key inside one process: one
// caller at a time holds the key's turn, the others wait for it in memory
// (no polling, no connection held) and may receive a value the holder
// hands over when its turn ends.
//
// A store uses it to spare its callers of one key the database's own wait
// (a lock wait or a busy handler polling on a schedule): the holder of a
// key's turn looks the key up, reserves it and runs the effect; when it is
// done its waiters wake at once, with the completed record if it had one.
// It only orders the callers of one process: the database still decides
// who gets a key.
//
// Usage:
//
//	for {
//		turn, mine := q.Take(key)
//		if mine {
//			break // this caller holds the turn; it must call q.Leave(key, ...) once
//		}
//		v, handed, err := turn.Wait(ctx, deadline)
//		...
//	}
package keywait

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrDeadline is returned by [Turn.Wait] when the deadline passed before
// the turn ended.
var ErrDeadline = errors.New("keywait: deadline passed before the holder's turn ended")

// Queue holds the turns of the keys callers are using. The zero value is
// ready to use; a Queue must not be copied after first use. It is safe for
// concurrent use.
type Queue[K comparable, V any] struct {
	mu    sync.Mutex
	turns map[K]*Turn[V]
}

// Turn is one holder's turn with a key, which its waiters wait for.
type Turn[V any] struct {
	done    chan struct{} // closed when the turn is over; val and handed are set before
	waiters int           // callers that joined the turn to wait; under Queue.mu
	val     V
	handed  bool
}

// Take gives the caller the turn of key if nobody holds it (mine is true:
// the caller must end it with exactly one [Queue.Leave]). Otherwise it
// returns the current holder's turn, counting the caller among its
// waiters; the caller waits with [Turn.Wait] and then calls Take again
// (the turn it waited for has ended, another caller may hold the next).
func (q *Queue[K, V]) Take(key K) (t *Turn[V], mine bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t, ok := q.turns[key]; ok {
		t.waiters++
		return t, false
	}
	if q.turns == nil {
		q.turns = make(map[K]*Turn[V])
	}
	t = &Turn[V]{done: make(chan struct{})}
	q.turns[key] = t
	return t, true
}

// Leave ends the turn of key that the caller holds and wakes its waiters.
// If hand is not nil and the turn has waiters, hand is called once, before
// they wake, and the value it returns with ok set is handed to each of them
// by [Turn.Wait] (the same value to all: hand it immutable, or let each
// waiter copy it). Calling Leave for a key whose turn the caller does not
// hold is a bug; it does nothing if no turn is held.
func (q *Queue[K, V]) Leave(key K, hand func() (v V, ok bool)) {
	q.mu.Lock()
	t := q.turns[key]
	delete(q.turns, key)
	var waiters int
	if t != nil {
		waiters = t.waiters // no caller joins t any more
	}
	q.mu.Unlock()
	if t == nil {
		return
	}
	if hand != nil && waiters > 0 {
		t.val, t.handed = hand()
	}
	close(t.done)
}

// Held reports how many keys have a turn held, for tests and metrics.
func (q *Queue[K, V]) Held() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.turns)
}

// Joined reports how many callers have joined the current turn of key to
// wait for it (each Take that did not get the turn counts once, even if
// that caller has stopped waiting since), for tests and metrics.
func (q *Queue[K, V]) Joined(key K) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t, ok := q.turns[key]; ok {
		return t.waiters
	}
	return 0
}

// Wait waits until t ends, deadline passes or ctx is done. It returns the
// value the holder handed over (handed is true) or none (the holder had
// nothing to hand, or failed: compete for the key again), [ErrDeadline],
// or ctx.Err(). A deadline already passed does not wait: it reports
// whether t has already ended. The zero deadline means no bound but ctx.
// A turn that has ended is reported as ended even if ctx is done too.
func (t *Turn[V]) Wait(ctx context.Context, deadline time.Time) (v V, handed bool, err error) {
	select {
	case <-t.done:
		return t.val, t.handed, nil
	default:
	}
	var bound <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return v, false, ErrDeadline
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		bound = timer.C
	}
	select {
	case <-t.done:
		return t.val, t.handed, nil
	case <-ctx.Done():
		return v, false, ctx.Err()
	case <-bound:
		return v, false, ErrDeadline
	}
}
