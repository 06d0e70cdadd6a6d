// Package idempotency makes repeated operations safe when the network fails
// mid-request.
//
// A [Guard] runs a caller's effect under an idempotency key. The first call
// with a key runs the effect inside the store's transaction. It stores its
// [Response] with the key in that same transaction. Every later call with
// the same key and the same request fingerprint gets the stored response
// back without running the effect again. The same key with another
// fingerprint is refused with [ErrMismatch].
//
// An effect in several steps, one of them a call to another system, is an
// [Operation], run by [Guard.Run] and finished after a crash by a
// [Completer]. An operator looks at keys with [Guard.Inspect] and
// [Guard.List], releases one with [Guard.Forget], and deletes expired ones
// with [Guard.Purge]; [Guard.AdmitQuota] bounds what one scope may do.
//
// The storage is a [KeyStore]: stores live in the sqlite, postgres, mysql
// and redis packages. Writing a store of your own starts at [KeyStore] and
// package backend, which holds the rest of the store's contract (what
// its methods take and return, the optional capabilities, the helpers
// only a store calls); package conformance checks any implementation.
// What a Guard tells its [Config].Observer (one event per call, with its
// outcome) is in package observe.
package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// Guard runs operations under idempotency keys on a [KeyStore]. It is safe
// for concurrent use; build it with [New].
type Guard[Tx any] struct {
	store KeyStore[Tx]
	cfg   Config
	// noWait: a negative [Config.WaitTimeout]; cfg.WaitTimeout then holds
	// the default, the bound of the call's conflict retries.
	noWait bool
	// fl is the in-memory queue, shared with every view ([Guard.WithTTL]).
	fl *flight
}

// Do runs fn at most once per key, as seen by every caller of the key's
// store:
//
//  1. New key: fn runs inside the store's transaction. (resp, nil) commits
//     the effects done through tx, the key and resp together, and Do returns
//     resp with Replayed false. An error from fn (or a panic, which Do
//     re-raises) rolls everything back and leaves the key free.
//  2. Completed key, same fingerprint: Do returns the stored response with
//     Replayed true; fn is not called.
//  3. Completed key, other fingerprint: an error wrapping [ErrMismatch].
//  4. Key held by a running caller: Do waits for it, then behaves as 2 or 3,
//     or competes again if that caller failed. Past [Config.WaitTimeout] (at
//     once when it is negative) it returns an error wrapping [ErrInProgress];
//     ctx bounds the wait too. Callers of one key in this Guard wait in
//     memory for the one among them that is in the store, and are handed
//     its answer; see [Config.MaxWaiters] for waits inside the store.
//  5. A completed key is remembered for [Config.TTL] after it completed,
//     by the store's clock; then it counts as new.
//  6. Store conflicts ([backend.ErrConflict]) are retried with a short backoff, up
//     to [Config.MaxRetries] times and, while fn has not run, within
//     [Config.WaitTimeout]: the wait bound covers the whole call, every
//     attempt, retry and backoff included, whatever the store reports on
//     the way. A key the store reports held (or possibly held: SQLite's one
//     write lock taken by another process) when the bound runs out gives
//     [ErrInProgress]; conflicts still failing at the bound, on a key the
//     store does not report held, give [ErrStore] with [backend.ErrConflict]. Once
//     fn has run, its conflicts (and its commit's) are retried up to
//     MaxRetries whatever the bound, since fn's time is not waiting; the
//     reservation of such a retry waits for nothing past the bound.
//  7. Any other store error is returned wrapping [ErrStore]: retrying with
//     the same key is safe. When ctx ended, ctx's error is in the chain.
//     A missing table or column gives [ErrSchema] instead: no retry helps.
//
// fn must do every write through tx, never through the pool the store was
// built on: only writes through tx commit atomically with the key.
func (g *Guard[Tx]) Do(ctx context.Context, key Key, fingerprint string, fn func(tx Tx) (Response, error)) (Response, error) {
	if g.cfg.Observer == nil {
		var tr trace
		resp, _, err := g.do(ctx, key, fingerprint, fn, &tr)
		return resp, err
	}
	resp, _, err := g.observed(ctx, key, fingerprint, fn)
	return resp, err
}

// DoEvent is [Guard.Do] for integrations: it also returns the call's
// [observe.Event], as the [observe.Observer] (if set) is told it. Integrations such as idemhttp use it to
// report a call's waits, the age of a replayed record and failures after
// fn in events of their own.
func (g *Guard[Tx]) DoEvent(ctx context.Context, key Key, fingerprint string, fn func(tx Tx) (Response, error)) (Response, observe.Event, error) {
	return g.observed(ctx, key, fingerprint, fn)
}

// observed is Do with its Event; apart from Do, so that Do's own stack
// frame stays small (callers often run it on a fresh goroutine).
func (g *Guard[Tx]) observed(ctx context.Context, key Key, fingerprint string, fn func(tx Tx) (Response, error)) (_ Response, ev observe.Event, _ error) {
	start := time.Now()
	ev = observe.Event{Key: key, Outcome: observe.HandlerError, Err: errPanicked}
	var tr trace
	defer func() {
		ev.Duration = time.Since(start)
		ev.Waited, ev.RecordAge, ev.AfterFn = tr.waited, tr.age, tr.afterFn
		if g.cfg.Observer != nil {
			g.cfg.Observer(ctx, ev)
		}
	}()
	resp, attempts, err := g.do(ctx, key, fingerprint, fn, &tr)
	ev.Outcome, ev.Attempts, ev.Err = outcomeOf(resp, err), attempts, err
	if err != nil || !resp.Replayed {
		tr.age = 0
	}
	if err == nil {
		tr.afterFn = false
	}
	ev.TTL = g.cfg.TTL
	return resp, ev, err
}

// errPanicked is what the observer is told when fn panicked.
var errPanicked = errors.New("idempotency: fn panicked")

func (g *Guard[Tx]) do(ctx context.Context, key Key, fingerprint string, fn func(tx Tx) (Response, error), tr *trace) (resp Response, attempts int, err error) {
	if err := key.Validate(); err != nil {
		return Response{}, 0, err
	}
	if err := validateFingerprint(fingerprint); err != nil {
		return Response{}, 0, err
	}
	if fn == nil {
		return Response{}, 0, fmt.Errorf("%w: nil fn", ErrInvalidResponse)
	}
	own := false // err is fn's own: returned as fn returned it
	defer func() {
		// A call that ended because ctx did says so, whatever the store
		// or driver reported.
		if cerr := ctx.Err(); err != nil && cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		if err != nil && !own {
			err = &backend.KeyError{Key: key, Err: err}
		}
	}()
	deadline := time.Now().Add(g.cfg.WaitTimeout)
	for {
		c, lead := g.join(key)
		if !lead {
			waitStart := time.Now()
			resp, handed, err := g.follow(ctx, c, fingerprint, deadline)
			tr.waited += time.Since(waitStart)
			if err != nil || handed {
				return resp, 0, err
			}
			continue // the call ahead failed: compete for the key
		}
		resp, attempts, own, err = g.lead(ctx, c, key, fingerprint, deadline, fn, tr)
		return resp, attempts, err
	}
}

// lead runs the attempts of the call that represents key in the store,
// then hands its answer to the callers of key waiting in memory.
// own reports that err is fn's own error, as fn returned it.
func (g *Guard[Tx]) lead(ctx context.Context, c *call, key Key, fp string, deadline time.Time, fn func(Tx) (Response, error), tr *trace) (resp Response, attempts int, own bool, err error) {
	handed := false
	defer func() {
		if !handed { // an error or a panic in fn: the followers compete
			g.leave(key, c, nil)
		}
	}()
	for attempts = 1; ; attempts++ {
		resp, err = g.attempt(ctx, c, key, fp, deadline, fn, tr)
		if err == nil || !errors.Is(err, backend.ErrConflict) || attempts > g.cfg.MaxRetries {
			break
		}
		pause := backoff(g.cfg.RetryBackoff, attempts)
		if !c.won() {
			// Still waiting for the key: the wait bound ends the retries
			// (the last one is tried at the bound, waiting for nothing).
			left := time.Until(deadline)
			if left <= 0 {
				err = fmt.Errorf("%w (the wait bound %v ran out after %d attempts)", err, g.cfg.WaitTimeout, attempts)
				break
			}
			pause = min(pause, left)
		}
		if werr := sleep(ctx, pause); werr != nil {
			return Response{}, attempts, false, fmt.Errorf("%w: %w (while retrying: %w)", ErrStore, werr, err)
		}
	}
	if err != nil {
		err, own = storeError(ctx, err)
		return Response{}, attempts, own, err
	}
	handed = true
	g.leave(key, c, &answer{fp: fp, resp: resp})
	return resp, attempts, false, nil
}
