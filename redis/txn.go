package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// txn is one reservation: the key is held under token, and a timer renews
// its lease until Complete or Rollback.
type txn struct {
	s       *Store
	k       keys
	token   string
	tx      *Tx
	r       backend.Reservation
	started time.Time
	// created is the reservation's creation time, and clock Redis's clock
	// when the reservation script ran (Unix ms), read at clockAt.
	created, clock int64
	clockAt        time.Time
	ended          bool
	hold           *hold
	// conn, if not nil, is the connection the reservation was made on,
	// with WATCH armed on the record since (see tryWatched). Renewals and
	// Complete use it; Complete or Rollback releases it.
	conn *pinned
	// connFailed: a renewal on conn failed (see renew); renewals and
	// Complete go through the client instead. Only renew writes it, and
	// Complete reads it after stop.
	connFailed bool

	mu          sync.Mutex
	stopped     bool
	timer       *time.Timer    // the next renewal
	cancelRenew func()         // cancels the renewal in flight, if any
	renewing    sync.WaitGroup // the renewal in flight
}

// newTxn starts the renewals of the reservation that h names.
func (s *Store) newTxn(k keys, r backend.Reservation, h *hold, out tryResult) *txn {
	t := &txn{
		conn:    out.conn,
		created: out.created,
		clock:   out.clock,
		clockAt: out.clockAt,
		s:       s,
		k:       k,
		token:   h.token,
		tx:      &Tx{Pipeliner: s.client.TxPipeline(), base: k.base},
		r:       r,
		started: time.Now(),
		hold:    h,
	}
	if !s.noRenew {
		t.mu.Lock() // renew reads t.timer
		t.timer = time.AfterFunc(s.renewEvery, t.renew)
		t.mu.Unlock()
	}
	return t
}

// renew extends the lease, and schedules the next renewal unless the
// reservation has ended or the token no longer matches. It runs on the
// timer's goroutine, which ends with it: nothing runs between renewals.
func (t *txn) renew() {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.s.renewEvery)
	t.cancelRenew = cancel
	t.renewing.Add(1)
	t.mu.Unlock()
	defer t.renewing.Done()

	run := func(ctx context.Context, c goredis.Scripter) (int64, error) {
		return t.s.renewScript.Run(ctx, c, []string{t.k.rec}, t.token, t.s.lease.Milliseconds()).Int64()
	}
	var n int64
	var err error
	if t.conn != nil && !t.connFailed {
		// The reservation's connection: one per reservation.
		if n, err = run(ctx, t.conn.tx); err != nil {
			// It failed: after a failover it is a connection to the old
			// primary (which refuses writes, or was closed by the
			// Sentinel), where a renewal no longer holds the key. Renew
			// through the client, which follows the primary, from now on;
			// the script's token check makes that safe anywhere.
			t.connFailed = true
		}
	}
	if t.conn == nil || t.connFailed {
		n, err = run(ctx, t.s.client)
	}
	cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cancelRenew = nil
	switch {
	case t.stopped || err == nil && n == 0: // n == 0: lease lost, Complete will report it
	case err != nil:
		// A failover in progress, a cut connection: try again soon, so that
		// the lease on the new primary is renewed before it runs out.
		t.timer.Reset(max(t.s.renewEvery/4, MinLease))
	default:
		t.timer.Reset(t.s.renewEvery)
	}
}

// stop ends the renewals: none is scheduled or in flight once it returns.
func (t *txn) stop() {
	t.mu.Lock()
	t.stopped = true
	if t.timer != nil {
		t.timer.Stop()
	}
	if t.cancelRenew != nil {
		t.cancelRenew()
	}
	t.mu.Unlock()
	t.renewing.Wait()
}

// end tells the Store's waiters that the reservation is over in Redis.
func (t *txn) end() { t.s.endHold(t.hold) }

// Tx implements [backend.Txn].
func (t *txn) Tx() *Tx { return t.tx }

// minRecordTTL is the shortest Redis expiry of a completed record.
const minRecordTTL = time.Minute

var errEnded = errors.New("redis: reservation already completed or rolled back")

// Complete implements [backend.Txn]. It sends MULTI, fn's commands,
// the completed record, its expiry, PUBLISH and EXEC. They run under a
// WATCH of the record, armed when the token was last seen to be the
// caller's. That is by the reservation itself (one round trip), or else by
// a check just before (two, three on Cluster; see docs/performance.md). On any failure the
// reservation is released if the caller still owns it.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	t.stop()
	defer t.end()
	err := t.commit(ctx, resp)
	if err != nil && !errors.Is(err, backend.ErrLeaseLost) {
		_ = t.release(ctx)
	}
	return err
}

// errNotOwner is returned by the watched check when the token is gone.
var errNotOwner = errors.New("redis: reservation is no longer ours")

// execConn is a connection that Complete sends its MULTI/EXEC on: the
// *goredis.Tx of watchOwned, or the one the reservation pinned (WATCH
// armed by tryWatched).
type execConn interface {
	TxPipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error)
	Wait(ctx context.Context, numReplicas int, timeout time.Duration) *goredis.IntCmd
}

func (t *txn) commit(ctx context.Context, resp idempotency.Response) error {
	now, err := t.completionClock()
	if err != nil { // a test clock out of range: nothing is sent
		if cn := t.conn; cn != nil {
			t.conn = nil
			t.s.unwatch(ctx, cn)
		}
		return err
	}
	hdr := backend.MarshalHeader(resp.Header)
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	// The record's logical expiry is the clock at completion plus the TTL
	// (clamped to MaxExpiry), checked by every read. The pending record
	// holds its creation time and a provisional expiry, its creation plus
	// the TTL, both by the reservation script's clock; Complete moves that
	// expiry on by the time since (HINCRBY), so that no command carries a
	// time of this process. Redis deletes the record itself the TTL after
	// the EXEC (by its own clock), and not before minRecordTTL, for test
	// clocks that do not follow real time.
	maxMs := backend.MaxExpiry().UnixMilli()
	ttlMs := t.r.TTL.Milliseconds()
	provisional := min(t.created+ttlMs, maxMs)
	// A test clock that went back keeps the provisional expiry.
	expires := max(min(now+ttlMs, maxMs), provisional)
	expire := max(t.r.TTL, minRecordTTL)
	cmds := slices.Clone(t.tx.Cmds())
	t.tx.Discard()
	var done *goredis.IntCmd // the HINCRBY of the record's expiry
	var start time.Time      // when the last EXEC was sent
	var sent []goredis.Cmder // what the last EXEC carried
	// exec sends fn's commands and the completed record in one MULTI/EXEC
	// on c, whose WATCH on the record is armed and whose check found the
	// record ours. The record is completed with plain commands, not a
	// script: WATCH already guards it, and a script costs Redis several
	// times the work of the commands it runs. The pending record's scope,
	// id, fingerprint and creation time stay.
	exec := func(c execConn) error {
		for _, c := range cmds {
			c.SetErr(nil)
		}
		var err error
		sent, err = c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			if err := p.BatchProcess(ctx, cmds...); err != nil {
				return err
			}
			start = time.Now()
			p.HSet(ctx, t.k.rec, "state", stateCompleted, "status", strconv.Itoa(resp.Status), "hdr", hdr, "body", body)
			p.HDel(ctx, t.k.rec, "owner")
			done = p.HIncrBy(ctx, t.k.rec, "expires", expires-provisional)
			p.PExpire(ctx, t.k.rec, expire)
			p.Publish(ctx, t.k.wake(), msgCompleted)
			return nil
		})
		if err == nil { // replicas.go: WAIT on this connection, if asked
			err = t.s.repl.waitReplicas(ctx, c, t.r.Key)
		}
		return err
	}
	const attempts = 3
	for attempt := 1; ; attempt++ {
		done = nil
		var err error
		if cn := t.conn; cn != nil && t.connFailed {
			// The reservation's connection failed (a failover): check
			// under a fresh WATCH through the client, on the primary.
			t.conn = nil
			t.s.unwatch(ctx, cn)
			err = t.s.watchOwned(ctx, t.k.rec, t.token, exec)
		} else if cn != nil {
			// WATCH armed since the reservation: one round trip.
			t.conn = nil
			err = exec(cn.tx)
			ran := err == nil || errors.Is(err, goredis.TxFailedErr) || applied(done)
			if ran {
				cn.release() // EXEC ran: nothing is watched any more
			} else {
				t.s.unwatch(ctx, cn)
			}
			if !ran && notSent(err) {
				// The server refused the transaction (READONLY: the
				// primary was demoted; EXECABORT) or the connection was
				// unusable before anything was sent: nothing was applied.
				// Check again under a fresh WATCH through the client.
				continue
			}
		} else if t.s.cluster != nil {
			// Renewals stopped with Complete: retry redirects well
			// within the lease they left.
			err = t.s.clusterWatchOwned(ctx, t.k.rec, t.token, t.s.lease/2, exec,
				func() []goredis.Cmder { return sent })
		} else {
			err = t.s.watchOwned(ctx, t.k.rec, t.token, exec)
		}
		switch {
		case err == nil:
			t.s.seen.add(t.k.id)
			if t.hold.waiters.Load() > 0 {
				// This Store's waiters take the record from here, as
				// decodeRecord would give it.
				expires := done.Val() // as Redis moved it on
				rec := &backend.Record{
					Key:         t.r.Key,
					Fingerprint: t.r.Fingerprint,
					Status:      resp.Status,
					Body:        bytes.Clone(body),
					CreatedAt:   time.UnixMilli(t.created),
					ExpiresAt:   time.UnixMilli(expires),
				}
				if h, err := backend.UnmarshalHeader(hdr); err == nil {
					rec.Header = h
					t.hold.rec = rec
					t.hold.until = start.Add(time.Duration(expires-now) * time.Millisecond)
				}
			}
			return nil
		case errors.Is(err, errNotOwner):
			return fmt.Errorf("%w: key %v", backend.ErrLeaseLost, t.r.Key)
		case errors.Is(err, ErrNotReplicated):
			return err
		case applied(done):
			// EXEC ran: the record is completed, but a command of fn
			// failed at run time (Redis does not roll back).
			return fmt.Errorf("redis: key %v completed, but a queued command failed: %w", t.r.Key, err)
		case errors.Is(err, goredis.TxFailedErr) && attempt < attempts:
			// The record was touched after WATCH (a renewal, or a
			// takeover that the next check reports): check again.
			continue
		}
		return mapError("complete", err)
	}
}

// applied reports whether the HINCRBY of the record's expiry ran in an
// EXEC that returned its replies. A command that a redirected or refused
// transaction never ran has no error and no value (a record's expiry, once
// moved on, is above 0).
func applied(done *goredis.IntCmd) bool {
	return done != nil && done.Err() == nil && done.Val() > 0
}

// watchOwned runs fn on a transaction that WATCHes rec, once it has checked
// that rec is pending under token (else errNotOwner). fn must end with
// EXEC. It uses one connection.
func (s *Store) watchOwned(ctx context.Context, rec, token string, fn func(execConn) error) error {
	owned := func(st *goredis.SliceCmd) error {
		v, err := st.Result()
		if err != nil {
			return err
		}
		if len(v) != 2 || v[0] != statePending || v[1] != token {
			return errNotOwner
		}
		return nil
	}
	c, ok := s.client.(*goredis.Client)
	if !ok {
		// Cluster, Ring: go-redis sends WATCH (and follows MOVED) itself.
		return s.client.Watch(ctx, func(tx *goredis.Tx) error {
			if err := owned(tx.HMGet(ctx, rec, "state", "owner")); err != nil {
				return err
			}
			return fn(tx)
		}, rec)
	}
	// A single node or Sentinel: WATCH and the check in one round trip.
	// go-redis does not know about this WATCH, so UNWATCH by hand whenever
	// EXEC did not run.
	return c.Watch(ctx, func(tx *goredis.Tx) error {
		var st *goredis.SliceCmd
		_, err := tx.Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.Do(ctx, "watch", rec)
			st = p.HMGet(ctx, rec, "state", "owner")
			return nil
		})
		if err == nil {
			err = owned(st)
		}
		if err == nil {
			err = fn(tx)
		}
		if err != nil && !errors.Is(err, goredis.TxFailedErr) && !goredis.IsExecAbortError(err) {
			uctx, cancel := cleanupContext(ctx)
			_ = tx.Unwatch(uctx).Err()
			cancel()
		}
		return err
	})
}

// Rollback implements [backend.Txn]: the queued commands are discarded
// and the reservation deleted if the caller still owns it, which wakes the
// waiters. It works with a cancelled ctx.
func (t *txn) Rollback(ctx context.Context) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	t.tx.Discard()
	t.stop()
	defer t.end()
	if cn := t.conn; cn != nil {
		t.conn = nil
		t.s.unwatch(ctx, cn) // before release takes a connection of the pool
	}
	return t.release(ctx)
}

// release deletes the reservation if token still owns it and wakes waiters.
// It runs even when ctx is done, bounded by releaseTimeout. When ctx is
// done already, abandonTimeout bounds it instead. (The caller is late:
// behind a partition it must not wait the longer bound past its deadline.)
func (t *txn) release(ctx context.Context) error {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	err := t.s.releaseScript.Run(ctx, t.s.client, []string{t.k.rec}, t.token, t.k.wake()).Err()
	return mapError("release", err)
}

// completionClock is the clock the record is completed by, in Unix
// milliseconds: the test clock's reading when one is set, or else Redis's
// clock as the reservation script read it, moved on by the time this
// process measured since it had the reply (monotonic). That is no later
// than Redis's clock at the EXEC: the record expires no later than the TTL
// after its completion, by Redis's clock.
func (t *txn) completionClock() (int64, error) {
	now, set, err := t.s.testClock()
	if err != nil || set {
		return now, err
	}
	return t.clock + time.Since(t.clockAt).Milliseconds(), nil
}
