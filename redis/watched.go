package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
type pinned struct {
	tx    *goredis.Tx
	done  chan struct{} // closed by release
	ended chan struct{} // closed once Watch returned the connection
}

// pin takes a connection for a reservation; it is dialled, if need be, at
// its first command.
func (s *Store) pin(ctx context.Context) (*pinned, error) {
	p := &pinned{done: make(chan struct{}), ended: make(chan struct{})}
	ready := make(chan *goredis.Tx, 1)
	var err error
	s.pins.Add(1)
	go func() {
		defer s.pins.Add(-1)
		defer close(p.ended)
		err = s.single.Watch(context.WithoutCancel(ctx), func(tx *goredis.Tx) error {
			ready <- tx
			<-p.done
			return nil
		})
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
	close(p.done)
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
	cn, err := s.pin(ctx)
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
			cn.release()
			s.abandon(ctx, k, token)
			return tryResult{}, mapError("reserve", err)
		}
		s.unwatch(ctx, cn)
		return tryResult{}, mapError("reserve", err)
	}
	if err != nil && !errors.Is(err, goredis.Nil) { // WATCH or HGET failed
		s.unwatch(ctx, cn)
		s.abandon(ctx, k, token)
		return tryResult{}, mapError("reserve", err)
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

// unwatch clears the WATCH of cn and releases it, even when ctx is done.
func (s *Store) unwatch(ctx context.Context, cn *pinned) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	// After a failed UNWATCH (a cut connection), go-redis drops the
	// connection instead of pooling it.
	_ = cn.tx.Unwatch(ctx).Err()
	cn.release()
}

// isNoScript reports whether err says the server does not know the script
// (EVALSHA before the script was loaded).
func isNoScript(err error) bool {
	var rerr goredis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOSCRIPT")
}
