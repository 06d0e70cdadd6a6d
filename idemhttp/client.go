package idemhttp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Defaults of [Transport].
const (
	DefaultMaxAttempts = 5
	DefaultBaseDelay   = 100 * time.Millisecond
	DefaultMaxDelay    = 5 * time.Second
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
// random key ([NewKey]) sent as an sf-string ("8e03978e-..."), the draft's
// form.
// The key of a request can be read back from the response:
// resp.Request.Header.Get("Idempotency-Key").
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
// context's deadline, that response is returned instead. A request without
// a key (another method, and no key header) is sent once.
//
// The body is sent again on each attempt through req.GetBody (set by
// http.NewRequest for in-memory bodies); a body without GetBody is read into
// memory first. All attempts run under the request's context.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Methods get a generated key when the request has none. Defaults to
	// [DefaultMethods] (POST and PATCH).
	Methods []string
	// KeyHeader is the header that carries the key. Defaults to
	// [HeaderKey] ("Idempotency-Key").
	KeyHeader string
	// MaxAttempts bounds the attempts per request, the first included.
	// Defaults to [DefaultMaxAttempts]; 1 disables retries.
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt. Defaults to
	// [DefaultBaseDelay].
	BaseDelay time.Duration
	// MaxDelay caps every wait, Retry-After included. Defaults to
	// [DefaultMaxDelay].
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

// RoundTrip sends req as one logical operation, retrying as described on
// [Transport]. It returns the last attempt's response (the caller closes
// its body) or, when the last attempt failed, its error wrapped with the
// attempt count. req is not modified; each attempt is a clone of it.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	send := t.Base
	if send == nil {
		send = http.DefaultTransport
	}
	header := t.KeyHeader
	if header == "" {
		header = HeaderKey
	}
	key := ""
	if len(req.Header.Values(header)) == 0 {
		if !t.keyed(req.Method) {
			return send.RoundTrip(req)
		}
		key = quoteKey(NewKey())
	}
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
		maxAttempts = DefaultMaxAttempts
	}
	t.Budget.deposit()
	for attempt := 1; ; attempt++ {
		areq := req.Clone(ctx)
		if key != "" {
			areq.Header.Set(header, key)
		}
		if getBody != nil {
			if areq.Body, err = getBody(); err != nil {
				return nil, fmt.Errorf("idemhttp: attempt %d: GetBody: %w", attempt, err)
			}
			areq.GetBody = getBody
		}
		resp, err := send.RoundTrip(areq)
		if err != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err)
		}
		answer := func() (*http.Response, error) {
			if err != nil {
				return nil, fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err)
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
		if !ok || !t.Budget.withdraw() { // waiting is not allowed: this attempt is the answer
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
				return nil, fmt.Errorf("idemhttp: waiting after attempt %d: %w (last error: %w)", attempt, serr, err)
			}
			return nil, fmt.Errorf("idemhttp: waiting after attempt %d (last status %d): %w", attempt, resp.StatusCode, serr)
		}
	}
}

func (t *Transport) keyed(method string) bool {
	methods := t.Methods
	if methods == nil {
		methods = DefaultMethods()
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
