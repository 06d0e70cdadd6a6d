package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrKeyExpired: [Transport] stopped retrying because the next attempt
// would arrive after the server forgets the key, by the
// [HeaderKeyExpires] of an earlier answer: that attempt could run the
// operation a second time. The error says when the key expires and the
// last attempt's status or error; the operation may have run once.
var ErrKeyExpired = errors.New("idemhttp: the idempotency key expires before the next retry could arrive; not retried")

// Defaults of [Transport].
const (
	defaultMaxAttempts = 5
	defaultBaseDelay   = 100 * time.Millisecond
	defaultMaxDelay    = 5 * time.Second
)

// Transport is an http.RoundTripper that sends each request with an
// idempotency key and retries it safely, so that any http.Client (or a
// generated API client that takes one) gets safe retries:
//
//	hc := &http.Client{Transport: &idemhttp.Transport{Budget: idemhttp.NewRetryBudget(0.2, 10)}}
//
// The zero value is ready to use; it is safe for concurrent use as long as
// its fields are not changed.
//
// Each request is one logical operation with ONE key, fixed before the
// first attempt and never changed. It is the caller's own key header if the
// request has one. Otherwise, for the methods in Methods, it is a fresh
// random key ([NewKeyID]) sent as an sf-string ("8e03978e-..."), the draft's
// form.
// The key of a request can be read back from the response:
// resp.Request.Header.Get("Idempotency-Key"), and, when no attempt got an
// answer, from the error ([ErrorKey]): a caller that tries the
// operation again later must send that key, not let a new one be made.
//
// A request with a key is retried when Retry says so, up to MaxAttempts
// attempts and while Budget allows. [DefaultRetry] retries transport
// errors, 5xx, 429, and a 409 only when it is the server's "in progress"
// answer. It never retries a business 409 such as "order already
// captured". Between attempts the Transport waits a random delay in
// [0, min(MaxDelay, BaseDelay*2^(n-1))]: exponential backoff with full
// jitter. When the response has a Retry-After header (seconds or
// HTTP-date), it waits exactly that long. When
// Retry-After asks for more than MaxDelay, or a wait would pass the
// context's deadline, that response is returned instead.
//
// An answer may say until when the server keeps the key
// ([HeaderKeyExpires]: on stored answers, replays and the in-progress
// problem of [Middleware]). The Transport keeps the latest such bound of
// the request's attempts. Once the next attempt would be sent at or after
// it (now plus the wait), it stops and returns an error wrapping
// [ErrKeyExpired] instead of a retry that could run the operation twice.
// When the answer has a Date, the bound is also taken relative to it (the
// server's clock, less a second for its rounding) from the moment the
// attempt was sent, and the earlier of the two readings is kept, so that
// a client clock behind the server's does not move it later. A request without
// a key (another method, and no key header) is sent once.
//
// The body is sent again on each attempt through req.GetBody (set by
// http.NewRequest for in-memory bodies); a body without GetBody is read into
// memory first. All attempts run under the request's context.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Methods get a generated key when the request has none. Defaults to
	// POST and PATCH.
	Methods []string
	// KeyHeader is the header that carries the key. Defaults to
	// [DefaultKeyHeader] ("Idempotency-Key").
	KeyHeader string
	// MaxAttempts bounds the attempts per request, the first included.
	// Defaults to 5; 1 disables retries.
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt. Defaults to
	// 100ms.
	BaseDelay time.Duration
	// MaxDelay caps every wait, Retry-After included. Defaults to
	// 5s.
	MaxDelay time.Duration
	// Retry reports whether an attempt that ended with (resp, err) is sent
	// again with the same key; exactly one of resp and err is non-nil. It
	// may read resp's body only if it puts an equivalent one back. Defaults
	// to [DefaultRetry].
	Retry func(resp *http.Response, err error) bool
	// OnRetry, if set, is called before each wait for a retry, on the
	// goroutine that called RoundTrip.
	OnRetry func(RetryEvent)
	// Budget, if set, bounds the retries of every request that shares it: a
	// retry it refuses returns the attempt's answer at once.
	Budget *RetryBudget
}

// RetryEvent describes a retry about to happen; see [Transport].OnRetry.
type RetryEvent struct {
	// Request is the attempt that failed.
	Request *http.Request
	// Attempt counts the attempts made so far, from 1.
	Attempt int
	// Response is the failed attempt's response (its body already
	// drained and closed), or nil after a transport error.
	Response *http.Response
	// Err is the transport error, or nil.
	Err error
	// Wait is how long the transport waits before the next attempt.
	Wait time.Duration
}

// attemptError is the error of [Transport.RoundTrip] once an attempt was
// sent and no response is returned; see [ErrorKey].
type attemptError struct {
	header, key string // the key header's name and its value as sent
	err         error  // the error, its text that of the attemptError
}

func (e *attemptError) Error() string { return e.err.Error() }

func (e *attemptError) Unwrap() error { return e.err }

// ErrorKey returns the idempotency key that every attempt of a request
// carried (the [Transport]'s generated one or the caller's own: header is
// its name, key its value as sent), when err is [Transport.RoundTrip]'s
// error after at least one attempt was sent and no response is returned
// (transport errors, a context that ended, [ErrKeyExpired]), as wrapped
// by http.Client's *url.Error. The operation may then have run once: to
// try it again later, send the request with this key. Sent again without
// it, the request gets a new key, and the server runs the operation as a
// new one. ok is false for other errors. The error's text names no key.
func ErrorKey(err error) (header, key string, ok bool) {
	var ae *attemptError
	if !errors.As(err, &ae) {
		return "", "", false
	}
	return ae.header, ae.key, true
}

// RoundTrip sends req as one logical operation, retrying as described on
// [Transport]. It returns the last attempt's response (the caller closes
// its body) or, when the last attempt failed, its error wrapped with the
// attempt count; [ErrorKey] reads the key from it. req is not
// modified; each attempt is a clone of it.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	send := t.Base
	if send == nil {
		send = http.DefaultTransport
	}
	header := t.KeyHeader
	if header == "" {
		header = DefaultKeyHeader
	}
	key := ""
	callers := headerValues(req.Header, header)
	if len(callers) == 0 {
		if !t.keyed(req.Method) {
			return send.RoundTrip(req)
		}
		key = quoteKey(NewKeyID())
	}
	sentKey := key
	if sentKey == "" {
		sentKey = strings.Join(callers, ", ")
	}
	failed := func(err error) error { return &attemptError{header: header, key: sentKey, err: err} }
	getBody, err := replayableBody(req)
	if err != nil {
		return nil, err
	}
	retry := t.Retry
	if retry == nil {
		retry = DefaultRetry
	}
	ctx := req.Context()
	maxAttempts := t.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = defaultMaxAttempts
	}
	t.Budget.deposit()
	var expires time.Time // the key's expiry, as the answers bound it; zero: unknown
	for attempt := 1; ; attempt++ {
		areq := req.Clone(ctx)
		if key != "" {
			areq.Header.Set(header, key)
		}
		if getBody != nil {
			if areq.Body, err = getBody(); err != nil {
				err = fmt.Errorf("idemhttp: attempt %d: GetBody: %w", attempt, err)
				if attempt > 1 {
					err = failed(err)
				}
				return nil, err
			}
			areq.GetBody = getBody
		}
		sent := time.Now()
		resp, err := send.RoundTrip(areq)
		if resp != nil {
			if e, ok := keyExpiry(resp, sent); ok && e.After(expires) {
				expires = e
			}
		}
		if err != nil && ctx.Err() != nil {
			return nil, failed(fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err))
		}
		answer := func() (*http.Response, error) {
			if err != nil {
				return nil, failed(fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err))
			}
			return resp, nil
		}
		if attempt >= maxAttempts || !retry(resp, err) {
			return answer()
		}
		wait, ok := t.delay(attempt, resp, time.Now())
		if dl, has := ctx.Deadline(); ok && has && time.Now().Add(wait).After(dl) {
			ok = false
		}
		if !ok { // waiting is not allowed: this attempt is the answer
			return answer()
		}
		if !expires.IsZero() && !time.Now().Add(wait).Before(expires) {
			return nil, failed(t.expired(attempt, maxAttempts, resp, err, expires, wait))
		}
		if !t.Budget.withdraw() {
			return answer()
		}
		if resp != nil {
			// Drain a little so the connection can be reused.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
		}
		if t.OnRetry != nil {
			t.OnRetry(RetryEvent{Request: areq, Attempt: attempt, Response: resp, Err: err, Wait: wait})
		}
		if serr := sleep(ctx, wait); serr != nil {
			if err != nil {
				return nil, failed(fmt.Errorf("idemhttp: waiting after attempt %d: %w (last error: %w)", attempt, serr, err))
			}
			return nil, failed(fmt.Errorf("idemhttp: waiting after attempt %d (last status %d): %w", attempt, resp.StatusCode, serr))
		}
	}
}

// expired closes the attempt's answer and returns the [ErrKeyExpired] of
// a retry that would come too late.
func (t *Transport) expired(attempt, maxAttempts int, resp *http.Response, err error, expires time.Time, wait time.Duration) error {
	last := fmt.Sprintf("error: %v", err)
	if resp != nil {
		last = "status " + strconv.Itoa(resp.StatusCode)
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}
	return fmt.Errorf("%w: attempt %d of %d (last %s); the key expires at %s by this clock, the next attempt would be sent in %v",
		ErrKeyExpired, attempt, maxAttempts, last, expires.Format(time.RFC3339), wait.Round(time.Millisecond))
}

// keyExpiry reads the [HeaderKeyExpires] of resp, an answer to an attempt
// sent at sent, as an instant of this process's clock. With a Date field,
// the time left by the server's clock (less a second: both are rounded
// down) counts from sent, which is no later than the server's Date; the
// earlier of that and the field read by the local clock is returned.
func keyExpiry(resp *http.Response, sent time.Time) (time.Time, bool) {
	v := resp.Header.Get(HeaderKeyExpires)
	if v == "" {
		return time.Time{}, false
	}
	e, err := http.ParseTime(v)
	if err != nil {
		return time.Time{}, false
	}
	if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		if rel := sent.Add(e.Sub(d) - time.Second); rel.Before(e) {
			return rel, true
		}
	}
	return e, true
}

// headerValues returns the values of h's header name, under its
// canonical form or any other spelling (a header set directly in the map,
// h["idempotency-key"], which Header.Values does not see): a caller's key
// however it was written, so that no second key is generated beside it.
func headerValues(h http.Header, name string) []string {
	var vs []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			vs = append(vs, v...)
		}
	}
	return vs
}

func (t *Transport) keyed(method string) bool {
	methods := t.Methods
	if methods == nil {
		methods = defaultMethods()
	}
	for _, m := range methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// replayableBody returns a function giving a fresh copy of req's body per
// attempt, reading the body into memory when req has no GetBody.
func replayableBody(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		return req.GetBody, nil
	}
	data, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("idemhttp: reading the request body: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, nil
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
