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
	"math/rand/v2"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/canonical"
	"github.com/go-idempotency/idempotency/observe"
)

// Errors returned by [Guard.Do]; match them with errors.Is.
var (
	// ErrInvalidFingerprint: the fingerprint is empty, too long or not
	// printable ASCII. The store was not touched.
	ErrInvalidFingerprint = errors.New("idempotency: invalid fingerprint")
	// ErrInvalidResponse: fn returned a Response that cannot be stored
	// (status outside 100..599, or a nil fn). The transaction was rolled
	// back and the key left free.
	ErrInvalidResponse = errors.New("idempotency: invalid response")
	// ErrMismatch: the key was completed by a request with another
	// fingerprint. fn was not called. (HTTP 422.)
	ErrMismatch = errors.New("idempotency: key reused with a different request")
	// ErrInvalidBody: [FingerprintJSON] or [FingerprintForm] was given
	// bytes that are not one valid JSON value, or not an
	// application/x-www-form-urlencoded body as net/url parses it.
	// (HTTP 400.)
	ErrInvalidBody = canonical.ErrInvalid
	// ErrStore: the store failed (a cut connection, a timeout, a busy
	// database, conflicts still failing after every retry, a lost commit
	// reply). The driver's error stays in the chain. Whatever the store did,
	// the guarantee holds: the effect and the key were committed together
	// or not at all. So retrying the same request with the same key is
	// safe: it replays the committed answer or runs fn once. (HTTP 503.)
	ErrStore = errors.New("idempotency: store failed; retrying with the same key is safe")
	// ErrTooLarge: an [Operation]'s input and step data ([State]) would
	// take more than [backend.MaxProgressLen] bytes. Checked before anything is
	// written for the input; a step that sets too much fails, rolled back.
	ErrTooLarge = errors.New("idempotency: operation input and step data too large")
	// ErrUnfinished: a run of an [Operation] failed between two steps with
	// an error that is not [FinalAnswer]. Every step before it is committed; the
	// key is unfinished, and a retry with the same key (or the
	// [Completer]) resumes it at the step that failed. (HTTP 503.)
	ErrUnfinished = errors.New("idempotency: operation unfinished; retrying with the same key resumes it")
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
	g.leave(key, c, &answer{fp: fp, resp: cloneResponse(resp)})
	return resp, attempts, false, nil
}

// storeError adds [ErrStore] to the chain of an error that came from the
// store rather than from fn, the caller's input or the caller's context.
// own reports that the error returned is fn's own, as fn returned it.
func storeError(ctx context.Context, err error) (_ error, own bool) {
	var fe fnError
	switch {
	case errors.Is(err, ErrStore):
		return err, false
	case errors.Is(err, backend.ErrConflict): // retries exhausted
		return fmt.Errorf("%w: %w", ErrStore, err), false
	case errors.As(err, &fe):
		return fe.err, true
	case errors.Is(err, ErrMismatch), errors.Is(err, ErrInProgress),
		errors.Is(err, ErrInvalidResponse), errors.Is(err, ErrInvalidConfig),
		errors.Is(err, ErrCodec), errors.Is(err, ErrSchema): // ErrSchema: a retry does not help
		return err, false
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return err, false
	}
	return fmt.Errorf("%w: %w", ErrStore, err), false
}

// fnError marks an error that fn returned, so that it reaches the caller
// as it is (plus a failed rollback, if any), never as a store failure.
// fn is fn's own error; err is what the caller gets.
type fnError struct{ fn, err error }

func (e fnError) Error() string { return e.err.Error() }
func (e fnError) Unwrap() error { return e.err }

// outcomeOf is the Outcome of a call that returned resp and err: the one
// its error names, HandlerError for an error of fn's own.
func outcomeOf(resp Response, err error) observe.Outcome {
	switch {
	case err == nil && resp.Replayed:
		return observe.Replayed
	case err == nil:
		return observe.Executed
	case errors.Is(err, ErrMismatch):
		return observe.Mismatch
	case errors.Is(err, ErrInProgress):
		return observe.InProgress
	case errors.Is(err, ErrStore), errors.Is(err, ErrCodec):
		return observe.StoreError
	case errors.Is(err, ErrOverQuota):
		return observe.OverQuota
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidFingerprint), errors.Is(err, ErrInvalidInput):
		return observe.Rejected
	case errors.Is(err, ErrSchema), errors.Is(err, ErrInvalidConfig), errors.Is(err, errors.ErrUnsupported):
		return observe.Internal
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return observe.Canceled
	}
	return observe.HandlerError
}

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

// Purge deletes the keys expired by the store's clock in batches of
// [Config.PurgeBatch], each its own short transaction. It goes on until a
// batch comes back short or ctx ends, pausing between batches as
// [Config.PurgePause] says. A batch that meets a store
// conflict ([backend.ErrConflict]) is retried like a call of [Guard.Do] (up to
// [Config.MaxRetries] times in a row). It returns how many keys it
// deleted. The [observe.Observer] is told one Event per batch (each call of the
// store's Purge, a retried one included): Outcome [observe.Purged], Deleted,
// Duration, and Err if the batch failed.
func (g *Guard[Tx]) Purge(ctx context.Context) (int, error) {
	total := 0
	conflicts := 0
	for {
		start := time.Now()
		n, err := g.store.Purge(ctx, g.cfg.PurgeBatch)
		took := time.Since(start)
		g.observePurge(ctx, n, took, err)
		total += n
		if err != nil && errors.Is(err, backend.ErrConflict) && conflicts < g.cfg.MaxRetries && ctx.Err() == nil {
			conflicts++
			if werr := sleep(ctx, backoff(g.cfg.RetryBackoff, conflicts)); werr != nil {
				return total, fmt.Errorf("%w (while retrying: %w)", werr, err)
			}
			continue
		}
		conflicts = 0
		if err != nil {
			return total, err
		}
		if n < g.cfg.PurgeBatch {
			return total, nil
		}
		if err := sleep(ctx, purgePause(g.cfg.PurgePause, took)); err != nil {
			return total, err
		}
	}
}

// purgePause is the pause after a full batch of Purge that took took.
func purgePause(pause, took time.Duration) time.Duration {
	switch {
	case pause < 0:
		return 0
	case pause == 0:
		return took
	}
	return pause
}

// Errors a store reports, shared with package backend (the same values,
// so errors.Is matches either name).
var (
	// ErrInvalidKey: the key's id or scope is outside its allowed space. The
	// store was not touched. (HTTP 400.)
	ErrInvalidKey = backend.ErrInvalidKey
	// ErrInvalidConfig: a [Config] field is out of range. Returned by [New].
	ErrInvalidConfig = backend.ErrInvalidConfig
	// ErrInProgress: another caller holds the key and the wait bound
	// ([Config.WaitTimeout]) ran out before it finished, at once when it is
	// negative. fn was not called. (HTTP 409.)
	ErrInProgress = backend.ErrInProgress
	// ErrNotFound: the store holds no record for the key ([Guard.Inspect],
	// [Guard.Forget]).
	ErrNotFound = backend.ErrNotFound
)

// ErrSchema: the store's table is missing, or lacks a column this version
// needs: it was never migrated, [Config]'s table name has a typo, the
// table is that of an older version, or the service connects to another
// database or schema than the one migrated. Stores wrap the database's
// "no such table" and "no such column" errors of their own statements with
// it; the message names the table (or the column) and says to run the
// store's Migrate or apply its Schema. [Guard.CheckSchema] returns it
// before a service serves.
//
// It is a configuration error, not a transient failure: retrying does not
// help until the schema is fixed, so it is never wrapped in [ErrStore]
// (whose message says a retry is safe). Nothing was written: the key is
// not taken, fn did not run, and after the migration the same key runs as
// a new one. [observe.Event].Outcome is [observe.Failed]; idemhttp answers it with 500,
// not 503 with Retry-After.
var ErrSchema = backend.ErrSchema

func validateFingerprint(fp string) error {
	switch {
	case len(fp) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidFingerprint)
	case len(fp) > backend.MaxFingerprintLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidFingerprint, len(fp), backend.MaxFingerprintLen)
	}
	if i := indexNotPrintable(fp); i >= 0 {
		return fmt.Errorf("%w: byte %d is %#02x, not printable ASCII", ErrInvalidFingerprint, i, fp[i])
	}
	return nil
}

// indexNotPrintable is the index of the first byte of s outside printable
// ASCII, or -1.
func indexNotPrintable(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return i
		}
	}
	return -1
}
