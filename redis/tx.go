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
)

// Tx is the transaction fn receives: a Redis pipeline whose commands are
// sent in the same MULTI/EXEC as the stored response when the key
// completes, and only if the caller still owns the key. Nothing queued on it
// runs before that; results are in the commands after [idempotency.Guard.Do]
// returns. If fn fails, the queued commands are discarded.
//
// On Redis Cluster every key fn touches must be in the record's hash slot:
// name keys with [Tx.Key] (or use a prefix with a hash tag, see the package
// doc). Exec refuses to run; Pipelined and TxPipelined only queue. Never
// call Exec on the embedded Pipeliner itself: that would send the commands
// at once, outside the key's transaction.
type Tx struct {
	goredis.Pipeliner
	base string
}

// errExec is returned by the Exec of a [Tx].
var errExec = errors.New("redis: Tx.Exec called inside fn; the commands run when the key completes")

// Key returns a key named name in the record's hash slot, so that fn may use
// it in the transaction on Redis Cluster too. The same name under another
// idempotency key gives another Redis key.
func (tx *Tx) Key(name string) string { return tx.base + "u:" + name }

// Exec refuses to execute: the queued commands run when the key completes.
func (tx *Tx) Exec(ctx context.Context) ([]goredis.Cmder, error) { return nil, errExec }

// Pipelined queues the commands fn queues on tx; they run when the key
// completes. It returns them unexecuted.
func (tx *Tx) Pipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	n := tx.Len()
	if err := fn(tx); err != nil {
		return nil, err
	}
	return slices.Clone(tx.Cmds()[n:]), nil
}

// TxPipelined is [Tx.Pipelined]: everything on tx is one transaction.
func (tx *Tx) TxPipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	return tx.Pipelined(ctx, fn)
}

// Pipeline returns tx itself.
func (tx *Tx) Pipeline() goredis.Pipeliner { return tx }

// TxPipeline returns tx itself.
func (tx *Tx) TxPipeline() goredis.Pipeliner { return tx }

// txn is one reservation: the key is held under token, and a timer renews
// its lease until Complete or Rollback.
type txn struct {
	s       *Store
	k       keys
	token   string
	tx      *Tx
	r       idempotency.Reservation
	started time.Time
	ended   bool
	hold    *hold

	mu          sync.Mutex
	stopped     bool
	timer       *time.Timer    // the next renewal
	cancelRenew func()         // cancels the renewal in flight, if any
	renewing    sync.WaitGroup // the renewal in flight
}

// newTxn starts the renewals of the reservation that h names.
func (s *Store) newTxn(k keys, r idempotency.Reservation, h *hold) *txn {
	t := &txn{
		s:       s,
		k:       k,
		token:   h.token,
		tx:      &Tx{Pipeliner: s.client.TxPipeline(), base: k.base},
		r:       r,
		started: time.Now(),
		hold:    h,
	}
	t.mu.Lock() // renew reads t.timer
	t.timer = time.AfterFunc(s.renewEvery, t.renew)
	t.mu.Unlock()
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

	n, err := t.s.renewScript.Run(ctx, t.s.client, []string{t.k.rec}, t.token, t.s.lease.Milliseconds()).Int()
	cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cancelRenew = nil
	if !t.stopped && (err != nil || n != 0) { // n == 0: lease lost, Complete will report it
		t.timer.Reset(t.s.renewEvery)
	}
}

// stop ends the renewals: none is scheduled or in flight once it returns.
func (t *txn) stop() {
	t.mu.Lock()
	t.stopped = true
	t.timer.Stop()
	if t.cancelRenew != nil {
		t.cancelRenew()
	}
	t.mu.Unlock()
	t.renewing.Wait()
}

// end tells the Store's waiters that the reservation is over in Redis.
func (t *txn) end() { t.s.endHold(t.hold) }

// Tx implements [idempotency.Txn].
func (t *txn) Tx() *Tx { return t.tx }

var errEnded = errors.New("redis: reservation already completed or rolled back")

// Complete implements [idempotency.Txn]: WATCH the record, check the token,
// then MULTI, fn's commands, the completed record, its expiry, PUBLISH,
// EXEC. On a *goredis.Client the WATCH travels with the token check, so
// Complete costs two round trips (three on Cluster). On any failure the
// reservation is released if the caller still owns it.
func (t *txn) Complete(ctx context.Context, resp idempotency.Response, expiresAt time.Time) error {
	if t.ended {
		return errEnded
	}
	t.ended = true
	t.stop()
	defer t.end()
	err := t.commit(ctx, resp, expiresAt)
	if err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
		_ = t.release(ctx)
	}
	return err
}

// errNotOwner is returned by the watched check when the token is gone.
var errNotOwner = errors.New("redis: reservation is no longer ours")

func (t *txn) commit(ctx context.Context, resp idempotency.Response, expiresAt time.Time) error {
	hdr := idempotency.MarshalHeader(resp.Header)
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	// The record's logical expiry is expiresAt on the core's clock (checked
	// by every read); Redis deletes it expiresAt - r.Now from now, which is
	// never earlier (the core read its clock for expiresAt after r.Now).
	ttl := max(expiresAt.Sub(t.r.Now), time.Millisecond)
	cmds := slices.Clone(t.tx.Cmds())
	t.tx.Discard()
	const attempts = 3
	for attempt := 1; ; attempt++ {
		var hset *goredis.IntCmd
		err := t.s.watchOwned(ctx, t.k.rec, t.token, func(wtx *goredis.Tx) error {
			for _, c := range cmds {
				c.SetErr(nil)
			}
			_, err := wtx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				if err := p.BatchProcess(ctx, cmds...); err != nil {
					return err
				}
				p.Del(ctx, t.k.rec)
				hset = p.HSet(ctx, t.k.rec,
					"state", stateCompleted,
					"scope", t.r.Key.Scope,
					"id", t.r.Key.ID,
					"fp", t.r.Fingerprint,
					"status", strconv.Itoa(resp.Status),
					"hdr", hdr,
					"body", body,
					"created", strconv.FormatInt(t.r.Now.UnixMilli(), 10),
					"expires", strconv.FormatInt(expiresAt.UnixMilli(), 10))
				p.PExpire(ctx, t.k.rec, ttl)
				p.Publish(ctx, t.k.wake, msgCompleted)
				return nil
			})
			if err == nil { // replicas.go: WAIT on this connection, if asked
				err = t.s.repl.waitReplicas(ctx, wtx, t.r.Key.ID)
			}
			return err
		})
		switch {
		case err == nil:
			if t.hold.waiters.Load() > 0 {
				// This Store's waiters take the record from here, as
				// decodeRecord would give it.
				rec := &idempotency.Record{
					Key:         t.r.Key,
					Fingerprint: t.r.Fingerprint,
					Status:      resp.Status,
					Body:        bytes.Clone(body),
					CreatedAt:   time.UnixMilli(t.r.Now.UnixMilli()),
					ExpiresAt:   time.UnixMilli(expiresAt.UnixMilli()),
				}
				if h, err := idempotency.UnmarshalHeader(hdr); err == nil {
					rec.Header = h
					t.hold.rec = rec
				}
			}
			return nil
		case errors.Is(err, errNotOwner):
			return fmt.Errorf("%w: key %q", idempotency.ErrLeaseLost, t.r.Key.ID)
		case errors.Is(err, ErrNotReplicated):
			return err
		case hset != nil && hset.Err() == nil && hset.Val() > 0:
			// EXEC ran: the record is completed, but a command of fn
			// failed at run time (Redis does not roll back).
			return fmt.Errorf("redis: key %q completed, but a queued command failed: %w", t.r.Key.ID, err)
		case errors.Is(err, goredis.TxFailedErr) && attempt < attempts:
			// The record was touched after WATCH (a late renewal, or a
			// takeover that the next check reports): check again.
			continue
		}
		return mapErr("complete", err)
	}
}

// watchOwned runs fn on a transaction that WATCHes rec, once it has checked
// that rec is pending under token (else errNotOwner). fn must end with
// EXEC. It uses one connection.
func (s *Store) watchOwned(ctx context.Context, rec, token string, fn func(*goredis.Tx) error) error {
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
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			_ = tx.Unwatch(uctx).Err()
			cancel()
		}
		return err
	})
}

// Rollback implements [idempotency.Txn]: the queued commands are discarded
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
	return t.release(ctx)
}

// release deletes the reservation if token still owns it and wakes waiters.
func (t *txn) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	err := t.s.releaseScript.Run(ctx, t.s.client, []string{t.k.rec}, t.token, t.k.wake).Err()
	return mapErr("release", err)
}

// decodeRecord builds a Record from the fields the reservation script
// returns.
func decodeRecord(fp, status, hdr, body, created, expires, scope, id string) (*idempotency.Record, error) {
	st, err := strconv.Atoi(status)
	if err != nil {
		return nil, fmt.Errorf("bad status %q", status)
	}
	cr, err := strconv.ParseInt(created, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad created %q", created)
	}
	ex, err := strconv.ParseInt(expires, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad expires %q", expires)
	}
	h, err := idempotency.UnmarshalHeader([]byte(hdr))
	if err != nil {
		return nil, fmt.Errorf("bad header: %w", err)
	}
	return &idempotency.Record{
		Key:         idempotency.Key{Scope: scope, ID: id},
		Fingerprint: fp,
		Status:      st,
		Header:      h,
		Body:        []byte(body),
		CreatedAt:   time.UnixMilli(cr),
		ExpiresAt:   time.UnixMilli(ex),
	}, nil
}
