package idemhttp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Defaults of [Client].
const (
	DefaultMaxAttempts = 5
	DefaultBaseDelay   = 100 * time.Millisecond
	DefaultMaxDelay    = 5 * time.Second
)

// Client sends requests with an idempotency key and retries them safely.
// The zero value is ready to use; it is safe for concurrent use as long as
// its fields are not changed.
//
// Each call of [Client.Do] is one logical operation with ONE key, fixed
// before the first attempt and never changed: the caller's own
// Idempotency-Key header if the request has one, otherwise, for the methods
// in Methods, a fresh random key ([NewKey]) sent as an sf-string
// ("8e03978e-..."), the draft's form. The key of a call can be read back
// from the response: resp.Request.Header.Get("Idempotency-Key").
//
// A request with a key is retried on network errors and on 409, 429 and
// 5xx responses, up to MaxAttempts attempts, waiting between attempts a
// random delay in [0, min(MaxDelay, BaseDelay*2^(n-1))] (exponential backoff
// with full jitter) or, when the response has a Retry-After header (seconds
// or HTTP-date), exactly that long. When Retry-After asks for more than
// MaxDelay, or a wait would pass the context's deadline, that response is
// returned instead. Other 4xx responses (422 included) are never retried. A
// request without a key (another method, and no Idempotency-Key header) is
// sent once.
//
// The body is sent again on each attempt through req.GetBody (set by
// http.NewRequest for in-memory bodies); a body without GetBody is read into
// memory first. All attempts run under the request's context.
type Client struct {
	// HTTPClient sends each attempt. Defaults to http.DefaultClient.
	HTTPClient *http.Client
	// Methods get a generated key when the request has none. Defaults to
	// [DefaultMethods] (POST and PATCH).
	Methods []string
	// MaxAttempts bounds the attempts per call, the first included.
	// Defaults to [DefaultMaxAttempts]; 1 disables retries.
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt. Defaults to
	// [DefaultBaseDelay].
	BaseDelay time.Duration
	// MaxDelay caps every wait, Retry-After included. Defaults to
	// [DefaultMaxDelay].
	MaxDelay time.Duration
}

// Do sends req as one logical operation, retrying as described on [Client].
// It returns the last attempt's response (the caller closes its body) or,
// when the last attempt failed, its error wrapped with the attempt count.
// req is not modified; each attempt is a clone of it.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	hc := c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	key := ""
	if len(req.Header.Values(HeaderKey)) == 0 {
		if !c.keyed(req.Method) {
			return hc.Do(req)
		}
		key = quoteKey(NewKey())
	}
	getBody, err := replayableBody(req)
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	maxAttempts := c.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = DefaultMaxAttempts
	}
	for attempt := 1; ; attempt++ {
		areq := req.Clone(ctx)
		if key != "" {
			areq.Header.Set(HeaderKey, key)
		}
		if getBody != nil {
			if areq.Body, err = getBody(); err != nil {
				return nil, fmt.Errorf("idemhttp: attempt %d: GetBody: %w", attempt, err)
			}
			areq.GetBody = getBody
		}
		resp, err := hc.Do(areq)
		if err != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err)
		}
		if attempt >= maxAttempts || !retryable(resp, err) {
			if err != nil {
				return nil, fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err)
			}
			return resp, nil
		}
		wait, ok := c.delay(attempt, resp, time.Now())
		if dl, has := ctx.Deadline(); ok && has && time.Now().Add(wait).After(dl) {
			ok = false
		}
		if !ok { // waiting is not allowed: this attempt is the answer
			if err != nil {
				return nil, fmt.Errorf("idemhttp: attempt %d of %d: %w", attempt, maxAttempts, err)
			}
			return resp, nil
		}
		if resp != nil {
			// Drain a little so the connection can be reused.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
		}
		if serr := sleep(ctx, wait); serr != nil {
			if err != nil {
				return nil, fmt.Errorf("idemhttp: waiting after attempt %d: %w (last error: %w)", attempt, serr, err)
			}
			return nil, fmt.Errorf("idemhttp: waiting after attempt %d (last status %d): %w", attempt, resp.StatusCode, serr)
		}
	}
}

func (c *Client) keyed(method string) bool {
	methods := c.Methods
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

// delay returns how long to wait after a failed attempt, and false when the
// response's Retry-After asks for longer than MaxDelay.
func (c *Client) delay(attempt int, resp *http.Response, now time.Time) (time.Duration, bool) {
	base, maxDelay := c.BaseDelay, c.MaxDelay
	if base <= 0 {
		base = DefaultBaseDelay
	}
	if maxDelay <= 0 {
		maxDelay = DefaultMaxDelay
	}
	if resp != nil {
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
			return d, d <= maxDelay
		}
	}
	ceil := maxDelay
	if shift := attempt - 1; shift < 62 && base <= maxDelay>>shift {
		ceil = base << shift
	}
	return rand.N(ceil + 1), true
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP-date
// (a date in the past means no wait).
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 63); err == nil {
		if n > uint64(1<<63-1)/uint64(time.Second) {
			return 1<<63 - 1, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// retryable reports whether an attempt that ended with (resp, err) may be
// sent again with the same key.
func retryable(resp *http.Response, err error) bool {
	if err != nil {
		return true
	}
	s := resp.StatusCode
	return s == http.StatusConflict || s == http.StatusTooManyRequests || (s >= 500 && s <= 599)
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
