package idemhttp

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// delay returns how long to wait after a failed attempt, and false when the
// response's Retry-After asks for longer than MaxDelay.
func (t *Transport) delay(attempt int, resp *http.Response, now time.Time) (time.Duration, bool) {
	base, maxDelay := t.BaseDelay, t.MaxDelay
	if base <= 0 {
		base = defaultBaseDelay
	}
	if maxDelay <= 0 {
		maxDelay = defaultMaxDelay
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

// DefaultRetry is the default retry predicate of [Transport]. It retries:
//
//   - transport errors (the request may or may not have arrived: the key
//     makes a second arrival harmless);
//   - every 5xx except 501 and 505, which no retry can cure;
//   - 429;
//   - a 409 or 425 that is the server's "request in progress" answer. Its
//     problem type is [ProblemInProgress], or it carries Retry-After.
//
// Any other 409 is a business answer ("order already captured"). Like
// every other 4xx, it is returned at once.
func DefaultRetry(resp *http.Response, err error) bool {
	if err != nil {
		return true
	}
	switch s := resp.StatusCode; {
	case s == http.StatusConflict || s == http.StatusTooEarly:
		return resp.Header.Get("Retry-After") != "" || isInProgress(resp)
	case s == http.StatusTooManyRequests:
		return true
	case s == http.StatusNotImplemented || s == http.StatusHTTPVersionNotSupported:
		return false
	case s >= 500 && s <= 599:
		return true
	}
	return false
}

// isInProgress reports whether resp is the in-progress answer of
// [Middleware]: a 409 (or 425, [Options].InProgressStatus)
// application/problem+json document whose type is [ProblemInProgress]. It reads at most 64 KiB of the body and puts the body
// back, so the caller can still read all of it.
func isInProgress(resp *http.Response) bool {
	if resp == nil || (resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusTooEarly) || resp.Body == nil {
		return false
	}
	if media, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || media != problemContentType {
		return false
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil {
		return false
	}
	var p struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(head, &p) == nil && p.Type == ProblemInProgress
}

// RetryBudget bounds retries across many calls, so that a struggling
// server is not sent MaxAttempts times its usual load. Every call deposits
// Ratio tokens, and every retry spends one. A retry is allowed only while a
// whole token is left. The balance starts at, and never exceeds, Burst. A
// nil *RetryBudget allows every retry. It is safe for concurrent use.
type RetryBudget struct {
	mu     sync.Mutex
	ratio  float64
	burst  float64
	tokens float64
}

// NewRetryBudget returns a budget that allows, in the long run, ratio
// retries per call (0.1: one retry for ten calls), and burst retries at
// once from a full balance. A negative ratio or burst counts as 0.
func NewRetryBudget(ratio float64, burst int) *RetryBudget {
	b := &RetryBudget{ratio: max(ratio, 0), burst: float64(max(burst, 0))}
	b.tokens = b.burst
	return b
}

func (b *RetryBudget) deposit() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.tokens = min(b.tokens+b.ratio, b.burst)
	b.mu.Unlock()
}

func (b *RetryBudget) withdraw() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Available returns how many retries the budget allows right now.
func (b *RetryBudget) Available() int {
	if b == nil {
		return -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.tokens)
}
