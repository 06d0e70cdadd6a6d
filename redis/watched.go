package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	goredis "github.com/redis/go-redis/v9"
)

// This file holds the reservation that arms Complete's WATCH in its own
// round trip, on a single node or Sentinel client. A new key then costs two
// round trips instead of three.
//
// The reservation script, WATCH on the record and a read of its owner go in
// one pipeline. They run on a connection the reservation keeps until
// Complete or Rollback (the contract's one connection per reservation). The
// owner read after WATCH may be the caller's token. Then any later write to
// the record (a takeover, a renewal, anything) aborts Complete's EXEC. So
// Complete can send MULTI, fn's commands, the record and EXEC at once. An
// aborted EXEC falls back to the check under a fresh WATCH (see commit).
//
// A key that turns out completed or held leaves a WATCH to clear (UNWATCH,
// one more round trip) before the connection goes back to the pool. Replays
// would then cost two round trips. So a Store remembers the keys it lately
// found completed (seenKeys), and looks those up with the plain script, in
// one round trip. A caller that waits for a key (r.Wait > 0) uses the plain
// script too.

// pinned is a pooled connection that a reservation keeps. It is the
// go-redis Tx of a Client.Watch call (with no keys: it sends nothing). The
// call's callback waits, on a goroutine of its own, until release. (Client.Conn would do,
// but go-redis races on its options when Conns dial at once.)
//
// Taking a connection that way costs about 20 µs (a goroutine, its
// wake-up, go-redis's Tx), a tenth of a new key. So a connection given
// back clean (no WATCH armed, the last reply read) is parked for the next
// reservation instead (see pinPark), and released to the pool only once it
// has sat idle for pinIdle.
type pinned struct {
	s     *Store
	tx    *goredis.Tx
	done  chan struct{} // closed by release
	ended chan struct{} // closed once Watch returned the connection
	// reused: taken from the parked ones; a failure on it is retried on a
	// fresh connection (see tryWatched).
	reused bool
	// bad: it failed, or may lead to the old primary: never parked.
	bad      bool
	parkedAt time.Time
}

// pin takes a connection for a reservation: a parked one if reuse, else
// a new one from the pool, dialled, if need be, at its first command.
func (s *Store) pin(reuse bool) (*pinned, error) {
	if reuse {
		if p := s.parked.take(s.pinIdle); p != nil {
			return p, nil
		}
	}
	p := &pinned{s: s, done: make(chan struct{}), ended: make(chan struct{})}
	ready := make(chan *goredis.Tx, 1)
	var err error
	go func() {
		defer close(p.ended)
		ran := false
		// Not the caller's context: the goroutine and its Tx outlive the
		// call when parked, and must not keep one request's values.
		err = s.single.Watch(context.Background(), func(tx *goredis.Tx) error {
			ran = true
			ready <- tx
			<-p.done
			return nil
		})
		if ran {
			s.pins.Add(-1) // back in the pool
		}
	}()
	select {
	case p.tx = <-ready:
		return p, nil
	case <-p.ended: // Watch did not run its callback
		return nil, fmt.Errorf("redis: no connection for the reservation: %w", err)
	}
}

// release gives the connection back to the pool (or drops it, if it
// failed). It does not wait for that: the goroutine of pin returns it as
// it ends, off the caller's path, where waiting for it cost a wake-up of
// each goroutine in turn (tens of µs on a loaded machine).
func (p *pinned) release() {
	p.s.pins.Add(1)
	close(p.done)
}

// put ends a reservation's use of p: parked when clean (the caller read
// the last reply and left no WATCH armed), else released.
func (p *pinned) put(clean bool) {
	if !clean || p.bad || !p.s.parked.park(p, p.s.pinIdle) {
		p.release()
	}
}

// pinIdle is how long a parked connection waits for the next reservation
// before it goes back to the pool.
const pinIdle = 100 * time.Millisecond

// pinPark holds the connections parked for the next reservations, newest
// last. A quarter of the client's pool at most: the rest stays the
// application's. While any is parked a goroutine sweeps those idle for
// longer than pinIdle back to the pool.
type pinPark struct {
	mu       sync.Mutex
	idle     []*pinned
	max      int
	sweeping bool
}

// park adds p, unless the park is full; it reports whether it did.
func (k *pinPark) park(p *pinned, idle time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.idle) >= k.max {
		return false
	}
	p.parkedAt = time.Now()
	p.reused = true
	k.idle = append(k.idle, p)
	if !k.sweeping {
		k.sweeping = true
		go k.sweep(idle)
	}
	return true
}

// take returns the newest parked connection, or nil if none has been idle
// for less than idle (those are released).
func (k *pinPark) take(idle time.Duration) *pinned {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.idle); n > 0 {
		p := k.idle[n-1]
		k.idle[n-1] = nil
		k.idle = k.idle[:n-1]
		if time.Since(p.parkedAt) < idle {
			return p
		}
		p.release()
		k.releaseOlder(time.Now())
	}
	return nil
}

// flush releases every parked connection: one failed, so may the others
// (a restart, a failover).
func (k *pinPark) flush() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.releaseOlder(time.Now())
}

// releaseOlder releases the parked connections parked before t. k.mu is
// held.
func (k *pinPark) releaseOlder(t time.Time) {
	n := 0
	for _, p := range k.idle {
		if !p.parkedAt.Before(t) {
			break
		}
		p.release()
		n++
	}
	k.idle = append(k.idle[:0], k.idle[n:]...)
	clear(k.idle[len(k.idle):cap(k.idle)])
}

// sweep releases the connections idle for idle or longer, until none is
// parked.
func (k *pinPark) sweep(idle time.Duration) {
	for {
		k.mu.Lock()
		k.releaseOlder(time.Now().Add(-idle))
		if len(k.idle) == 0 {
			k.sweeping = false
			k.mu.Unlock()
			return
		}
		next := time.Until(k.idle[0].parkedAt.Add(idle))
		k.mu.Unlock()
		time.Sleep(next)
	}
}

// seenSlots is the size of a Store's memory of completed keys.
const seenSlots = 4096

// seenKeys remembers, lossily, the keys lately found completed: a key maps
// to one slot, and a newer key in the same slot replaces it. It only picks
// the cheaper look-up; a wrong answer costs one round trip, never
// correctness.
type seenKeys struct {
	slots [seenSlots]atomic.Uint64
}

func (s *seenKeys) add(id uint64)      { s.slots[id%seenSlots].Store(id) }
func (s *seenKeys) has(id uint64) bool { return s.slots[id%seenSlots].Load() == id }

// tryWatched runs the reservation script under token on a connection of
// its own, followed by WATCH on the record and a read of its owner. If it
// reserved the key, the result keeps the connection, WATCH armed, for
// Complete; otherwise the WATCH is cleared and the connection released.
func (s *Store) tryWatched(ctx context.Context, k keys, r backend.Reservation, token string) (tryResult, error) {
	cn, err := s.pin(true)
	if err != nil {
		return tryResult{}, err
	}
	keys := []string{k.rec}
	args, err := s.reserveArgs(r, token, "")
	if err != nil {
		cn.release()
		return tryResult{}, err
	}
	sent := time.Now()
	var run *goredis.Cmd
	var owner *goredis.StringCmd
	send := func(eval bool) error {
		_, err := cn.tx.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if eval {
				run = s.reserveScript.Eval(ctx, p, keys, args...)
			} else {
				run = s.reserveScript.EvalSha(ctx, p, keys, args...)
			}
			p.Do(ctx, "watch", k.rec)
			owner = p.HGet(ctx, k.rec, "owner")
			return nil
		})
		return err
	}
	err = send(false)
	if err != nil && isNoScript(run.Err()) {
		err = send(true)
	}
	if err := run.Err(); err != nil {
		if outcomeUnknown(err) {
			cn.bad = true
			cn.release()
			s.abandon(ctx, k, token)
			return tryResult{}, staleOr(ctx, cn, mapError("reserve", err))
		}
		cn.bad = true
		s.unwatch(ctx, cn)
		return tryResult{}, staleOr(ctx, cn, mapError("reserve", err))
	}
	if err != nil && !errors.Is(err, goredis.Nil) { // WATCH or HGET failed
		cn.bad = true
		s.unwatch(ctx, cn)
		s.abandon(ctx, k, token)
		return tryResult{}, staleOr(ctx, cn, mapError("reserve", err))
	}
	vals, err := run.Slice()
	if err != nil {
		s.unwatch(ctx, cn)
		return tryResult{}, mapError("reserve", err)
	}
	out, err := s.parseReserve(k, r, vals, sent)
	if err == nil && out.reserved && owner.Err() == nil && owner.Val() == token {
		out.conn = cn
		return out, nil
	}
	if err == nil && out.rec != nil {
		// replicas.go: the script wrote after reading the completed
		// record; a replay waits for that write on this connection.
		err = s.repl.replayReplicated(ctx, cn.tx, r.Key)
	}
	s.unwatch(ctx, cn)
	return out, err
}

// unwatch clears the WATCH of cn and puts it back, even when ctx is done.
func (s *Store) unwatch(ctx context.Context, cn *pinned) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	// After a failed UNWATCH (a cut connection), go-redis drops the
	// connection instead of pooling it.
	cn.put(cn.tx.Unwatch(ctx).Err() == nil)
}

// errStalePin is what tryWatched returns when its first round trip failed
// on a parked connection: Reserve tries once more, under a new token (the
// failed one was abandoned), on a connection from the pool.
var errStalePin = errors.New("redis: a parked connection failed")

// staleOr is errStalePin, wrapping err, when the failed round trip ran on a
// parked connection (cn.reused) and ctx is not done: one that sat idle
// may have been closed by the server, or lead to a demoted primary
// (READONLY), where the pool would have given a checked one. It also
// releases the other parked connections. Else it is err.
func staleOr(ctx context.Context, cn *pinned, err error) error {
	if !cn.reused || ctx.Err() != nil {
		return err
	}
	cn.s.parked.flush()
	return fmt.Errorf("%w: %w", errStalePin, err)
}

// isNoScript reports whether err says the server does not know the script
// (EVALSHA before the script was loaded).
func isNoScript(err error) bool {
	var rerr goredis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOSCRIPT")
}
