package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// inProgress answers what the middleware answers for a key in progress,
// without Retry-After, so only the problem type tells it apart.
func inProgress(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", idemhttp.ProblemContentType)
	w.WriteHeader(http.StatusConflict)
	_, _ = io.WriteString(w, `{"type":"`+idemhttp.ProblemInProgress+`","title":"in progress","status":409}`)
}

// businessConflict is an application's own 409.
func businessConflict(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusConflict)
	_, _ = io.WriteString(w, `{"type":"https://shop.example/already-captured","title":"Order already captured","status":409}`)
}

// TestTransportBusinessConflictNotRetried : a
// business 409 ("order already captured") used to be sent 5 times.
func TestTransportBusinessConflictNotRetried(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]func(http.ResponseWriter, *http.Request){
		"Problem": businessConflict,
		"Plain":   status(http.StatusConflict),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rec, srv := startRecorder(t, h, status(http.StatusCreated))
			c := fastTransport(srv)
			c.MaxAttempts = 5
			resp, body := do(t, c, post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
			if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "onflict") && !strings.Contains(body, "captured") {
				t.Errorf("got %d %q; want the 409 and its whole body", resp.StatusCode, body)
			}
			sameKey(t, rec, 1, `{}`)
		})
	}
}

// TestTransportReadsInProgressBody: the predicate peeks at the body and the
// caller still reads all of it.
func TestTransportReadsInProgressBody(t *testing.T) {
	t.Parallel()
	_, srv := startRecorder(t, inProgress)
	c := fastTransport(srv)
	c.MaxAttempts = 2
	resp, body := do(t, c, post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	if resp.StatusCode != http.StatusConflict || !strings.HasPrefix(body, `{"type":"`+idemhttp.ProblemInProgress) || !strings.HasSuffix(body, `"status":409}`) {
		t.Errorf("got %d %q; want the whole in-progress problem", resp.StatusCode, body)
	}
}

func TestDefaultRetry(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		header string
		want   bool
	}{{500, "", true}, {502, "", true}, {503, "", true}, {501, "", false}, {505, "", false}, {429, "", true},
		{409, "", false}, {409, "1", true}, {400, "", false}, {422, "1", false}, {201, "", false}} {
		resp := &http.Response{StatusCode: c.status, Header: http.Header{}, Body: http.NoBody}
		if c.header != "" {
			resp.Header.Set("Retry-After", c.header)
		}
		if got := idemhttp.DefaultRetry(resp, nil); got != c.want {
			t.Errorf("DefaultRetry(%d, Retry-After %q) = %v, want %v", c.status, c.header, got, c.want)
		}
	}
	if !idemhttp.DefaultRetry(nil, io.ErrUnexpectedEOF) {
		t.Error("a transport error is not retried")
	}
}

func TestTransportRetryPredicateAndHook(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusBadRequest), status(http.StatusBadRequest), status(http.StatusCreated))
	var events []idemhttp.RetryEvent
	c := fastTransport(srv)
	c.Retry = func(resp *http.Response, err error) bool {
		return err == nil && resp.StatusCode == http.StatusBadRequest
	}
	c.OnRetry = func(ev idemhttp.RetryEvent) { events = append(events, ev) }
	resp, _ := do(t, c, post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201 after retrying 400 twice", resp.StatusCode)
	}
	key := sameKey(t, rec, 3, `{}`)
	if len(events) != 2 || events[0].Attempt != 1 || events[1].Attempt != 2 || events[0].Response.StatusCode != 400 ||
		events[0].Err != nil || events[0].Request.Header.Get(idemhttp.DefaultKeyHeader) != key || events[1].Wait < 0 {
		t.Errorf("OnRetry events %+v", events)
	}
}

func TestTransport(t *testing.T) {
	t.Parallel()
	rec, srv := startRecorder(t, status(http.StatusServiceUnavailable), hangUp, status(http.StatusCreated))
	hc := &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond}}
	resp, err := hc.Do(post(t, testkit.Context(t, 20*time.Second), srv.URL, `{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	sameKey(t, rec, 3, `{"amount":1}`)

	// Other header name.
	rec, srv = startRecorder(t, status(http.StatusCreated))
	hc = &http.Client{Transport: &idemhttp.Transport{Base: srv.Client().Transport, KeyHeader: "X-Idempotency-Key"}}
	resp, err = hc.Do(post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if keys, _ := rec.seen(); len(keys) != 1 || keys[0] != "<none>" || resp.Request.Header.Get("X-Idempotency-Key") == "" {
		t.Errorf("keys %q, X-Idempotency-Key %q; want the key in X-Idempotency-Key only", keys, resp.Request.Header.Get("X-Idempotency-Key"))
	}
}

// TestRetryBudget: calls sharing a budget stop retrying once it is spent,
// and earn retries back as calls succeed.
func TestRetryBudget(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	attempts := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		attempts++
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	budget := idemhttp.NewRetryBudget(0.5, 3)
	c := fastTransport(srv)
	c.MaxAttempts = 5
	c.Budget = budget
	for range 4 {
		resp, _ := do(t, c, post(t, testkit.Context(t, 20*time.Second), srv.URL, `{}`))
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	// Burst 3, ratio 0.5: call 1 deposits (capped at 3) and retries 3
	// times (4 attempts); call 2 has 0.5 (1 attempt); call 3 has 1.0 (2
	// attempts); call 4 has 0.5 (1 attempt). Without a budget: 20.
	mu.Lock()
	got := attempts
	mu.Unlock()
	if got != 8 {
		t.Errorf("%d attempts for 4 calls; want 8 with the budget (20 without)", got)
	}
	if budget.Available() != 0 {
		t.Errorf("budget has %d retries left, want 0", budget.Available())
	}
	var nilBudget *idemhttp.RetryBudget
	if nilBudget.Available() != -1 {
		t.Error("a nil budget is not unlimited")
	}
}
