package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

// attempt is one reservation and, if it is won, one run of fn.
//
// It first asks the store without waiting. Only when the key is held
// elsewhere does it wait inside the store, in one of the Guard's waiter
// slots, for what remains of the wait bound.
func (g *Guard[Tx]) attempt(ctx context.Context, c *call, key Key, fp string, deadline time.Time, fn func(Tx) (Response, error), tr *trace) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	tr.afterFn = false
	r := backend.Reservation{Key: key, Fingerprint: fp, TTL: g.cfg.TTL, NoWait: g.noWait, Deadline: deadline}
	reserveStart := time.Now()
	txn, rec, err := g.store.Reserve(ctx, r)
	if errors.Is(err, ErrInProgress) { // it may have waited for a lock
		tr.waited += time.Since(reserveStart)
	}
	if wait := time.Until(deadline); errors.Is(err, ErrInProgress) && !g.noWait && wait > 0 {
		if !g.takeWaiter() {
			if errors.Is(err, backend.ErrConflict) {
				// A conflict that may be the key's (the store reports
				// both): with no waiter slot, retried as a conflict.
				return Response{}, err
			}
			return Response{}, fmt.Errorf("%w: the key is held elsewhere and %d calls already wait in the store (Config.MaxWaiters)",
				ErrInProgress, g.cfg.MaxWaiters)
		}
		waitStart := time.Now()
		r.Wait = time.Until(deadline)
		txn, rec, err = g.store.Reserve(ctx, r)
		tr.waited += time.Since(waitStart)
		g.releaseWaiter()
	}
	switch {
	case err != nil:
		return Response{}, err
	case txn == nil && rec == nil:
		return Response{}, errors.New("idempotency: store returned neither a reservation nor a record")
	case txn == nil:
		if rec.Fingerprint != fp {
			return Response{}, ErrMismatch
		}
		tr.age = recordAge(rec)
		resp, err := g.replay(ctx, key, rec)
		resp.TTL = g.cfg.TTL
		return resp, err
	}
	c.running()
	resp, err := g.run(ctx, txn, key, fn, tr)
	var fe fnError
	if errors.As(err, &fe) && !errors.Is(err, backend.ErrConflict) {
		// Only fn's own error is classified: a conflict met by fn's
		// statements is retried (the rollback discarded the attempt),
		// whatever the rollback itself reported.
		if cc, ok := g.store.(backend.ConflictClassifier); ok && cc.IsConflict(fe.fn) {
			err = fmt.Errorf("%w: %w", backend.ErrConflict, fe.err)
		}
	}
	return resp, err
}

// run calls fn on a won reservation and ends the transaction: Complete on
// success, Rollback on an error or a panic (re-raised). An error of fn comes
// back as an fnError.
func (g *Guard[Tx]) run(ctx context.Context, txn backend.Txn[Tx], key Key, fn func(Tx) (Response, error), tr *trace) (resp Response, err error) {
	done := false
	defer func() {
		if done {
			return
		}
		// fn panicked: roll back with a context that is not cancelled.
		_ = txn.Rollback(context.WithoutCancel(ctx))
	}()
	resp, err = fn(txn.Tx())
	if err == nil && (resp.Status < 100 || resp.Status > 599) {
		err = fmt.Errorf("%w: status %d outside 100..599", ErrInvalidResponse, resp.Status)
	}
	done = true
	if err != nil {
		if rerr := txn.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			return Response{}, fnError{err, errors.Join(err, fmt.Errorf("%w: rollback: %w", ErrStore, rerr))}
		}
		return Response{}, fnError{err, err}
	}
	// Only status, header and body are stored: the store gets no more.
	resp = Response{Status: resp.Status, Header: resp.Header, Body: resp.Body}
	stored, err := g.seal(ctx, key, resp)
	if err != nil {
		if rerr := txn.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("%w: rollback: %w", ErrStore, rerr))
		}
		return Response{}, err
	}
	now := time.Now().Round(0) // before Complete: no later than the store's clock at completion
	if err := txn.Complete(ctx, stored); err != nil {
		tr.afterFn = true
		return Response{}, err
	}
	resp.TTL = g.cfg.TTL
	resp.ExpiresAt = backend.Expiry(now, g.cfg.TTL).Truncate(time.Millisecond)
	return resp, nil
}

// backoff is a random wait in [0, base<<(attempt-1)), the exponent capped
// at 5 (full jitter). base is at most maxRetryBackoff, so it cannot
// overflow.
func backoff(base time.Duration, attempt int) time.Duration {
	return rand.N(base << min(attempt-1, 5))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
