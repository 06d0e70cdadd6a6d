package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// fakeStore is a KeyStore that records what the core asks of it. Reserve
// hands out a reservation unless rec or err is set.
type fakeStore struct {
	mu        sync.Mutex
	reserved  []backend.Reservation
	completed int // calls of Complete
	rolled    int
	rec       *backend.Record
	err       error
	purge     func(limit int) (int, error)
}

type fakeTxn struct{ s *fakeStore }

func (s *fakeStore) Reserve(_ context.Context, r backend.Reservation) (backend.Txn[int], *backend.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserved = append(s.reserved, r)
	switch {
	case s.err != nil:
		return nil, nil, s.err
	case s.rec != nil:
		return nil, s.rec, nil
	}
	return fakeTxn{s}, nil, nil
}

func (s *fakeStore) Purge(_ context.Context, limit int) (int, error) {
	return s.purge(limit)
}

func (t fakeTxn) Tx() int { return 0 }

func (t fakeTxn) Complete(_ context.Context, _ Response) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.s.completed++
	return nil
}

func (t fakeTxn) Rollback(context.Context) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.s.rolled++
	return nil
}

func mustNew(t *testing.T, s KeyStore[int], cfg *Config) *Guard[int] {
	t.Helper()
	g, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestNewDefaults(t *testing.T) {
	g := mustNew(t, &fakeStore{}, nil)
	c := g.cfg
	if c.TTL != defaultTTL || c.WaitTimeout != defaultWaitTimeout || c.MaxRetries != defaultMaxRetries ||
		c.RetryBackoff != defaultRetryBackoff || c.PurgeBatch != defaultPurgeBatch || c.MaxWaiters != defaultMaxWaiters ||
		cap(g.fl.waiters) != defaultMaxWaiters {
		t.Fatalf("defaults: got %+v (waiter slots %d)", c, cap(g.fl.waiters))
	}
	if defaultTTL != 24*time.Hour || defaultWaitTimeout != 30*time.Second || defaultMaxRetries != 10 ||
		defaultRetryBackoff != 2*time.Millisecond || defaultPurgeBatch != 1000 || defaultMaxWaiters != 2 {
		t.Fatal("a documented default changed: update the docs and this test together")
	}
	set := Config{TTL: time.Millisecond, WaitTimeout: time.Nanosecond, MaxRetries: 3, RetryBackoff: time.Nanosecond,
		PurgeBatch: 1, MaxWaiters: 5}
	c = mustNew(t, &fakeStore{}, &set).cfg
	if c.TTL != set.TTL || c.WaitTimeout != set.WaitTimeout || c.MaxRetries != 3 || c.RetryBackoff != set.RetryBackoff ||
		c.PurgeBatch != 1 || c.MaxWaiters != 5 {
		t.Fatalf("explicit values must be kept: got %+v", c)
	}
	if g := mustNew(t, &fakeStore{}, &Config{RetryBackoff: maxRetryBackoff}); g.cfg.RetryBackoff != time.Minute {
		t.Fatalf("RetryBackoff at its maximum: got %v", g.cfg.RetryBackoff)
	}
	g = mustNew(t, &fakeStore{}, &Config{MaxRetries: -1, MaxWaiters: -1})
	if g.cfg.MaxRetries != 0 || g.fl.waiters != nil {
		t.Fatalf("negative MaxRetries/MaxWaiters: got %d retries, waiter slots %v; want 0 and no bound", g.cfg.MaxRetries, g.fl.waiters)
	}
	g = mustNew(t, &fakeStore{}, &Config{WaitTimeout: -1})
	if !g.noWait || g.cfg.WaitTimeout != defaultWaitTimeout {
		t.Fatalf("negative WaitTimeout: got noWait %v, retry bound %v; want true, %v", g.noWait, g.cfg.WaitTimeout, defaultWaitTimeout)
	}
}

func TestNewRefusesOutOfRange(t *testing.T) {
	for _, cfg := range []Config{
		{TTL: -1}, {TTL: time.Millisecond - 1}, {TTL: 1}, {RetryBackoff: -1}, {PurgeBatch: -1},
		{RetryBackoff: maxRetryBackoff + 1},
	} {
		if _, err := New[int](&fakeStore{}, &cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := New[int](nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(nil store) = %v, want ErrInvalidConfig", err)
	}
}

func TestExpiryClamp(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	room := backend.MaxExpiry().Sub(now)
	for _, c := range []struct {
		ttl  time.Duration
		want time.Time
	}{
		{time.Hour, now.Add(time.Hour)},
		{room - 1, backend.MaxExpiry().Add(-1)},
		{room, backend.MaxExpiry()},
		{room + 1, backend.MaxExpiry()},
		{math.MaxInt64, backend.MaxExpiry()},
	} {
		if got := backend.Expiry(now, c.ttl); !got.Equal(c.want) {
			t.Errorf("backend.Expiry(now, %v) = %v, want %v", c.ttl, got, c.want)
		}
	}
	if !backend.MaxExpiry().Equal(time.Unix(0, math.MaxInt64)) || !backend.MinClock().Equal(time.Unix(0, math.MinInt64)) {
		t.Fatal("backend.MaxExpiry/backend.MinClock moved")
	}
}

func TestBackoffBounds(t *testing.T) {
	base := time.Millisecond
	for attempt := 1; attempt <= 9; attempt++ {
		limit := base << min(attempt-1, 5)
		var top time.Duration
		for range 2000 {
			d := backoff(base, attempt)
			if d < 0 || d >= limit {
				t.Fatalf("backoff(%v, %d) = %v outside 0..%v", base, attempt, d, limit)
			}
			top = max(top, d)
		}
		if top < limit/2 { // full jitter: 2000 draws all in the lower half has odds 2^-2000
			t.Fatalf("backoff(%v, %d) never above %v: the range is not %v", base, attempt, limit/2, limit)
		}
	}
}

func TestStatusRange(t *testing.T) {
	for status, valid := range map[int]bool{99: false, 100: true, 200: true, 599: true, 600: false, 0: false} {
		s := &fakeStore{}
		g := mustNew(t, s, nil)
		_, err := g.Do(context.Background(), Key{ID: fmt.Sprint("k", status)}, "fp", func(int) (Response, error) {
			return Response{Status: status}, nil
		})
		if valid != (err == nil) || (!valid && !errors.Is(err, ErrInvalidResponse)) {
			t.Errorf("status %d: err %v, want valid=%v", status, err, valid)
		}
		if valid != (s.completed == 1) || valid == (s.rolled == 1) {
			t.Errorf("status %d: %d completes, %d rollbacks", status, s.completed, s.rolled)
		}
	}
}

// TestClockRange: the readings a store's test clock may give, and the
// clamp of an expiry to MaxExpiry.
func TestClockRange(t *testing.T) {
	for _, c := range []struct {
		now   time.Time
		valid bool
	}{
		{backend.MinClock(), true},
		{backend.MinClock().Add(-1), false},
		{backend.MaxExpiry().Add(-1), true},
		{backend.MaxExpiry(), false},
	} {
		err := backend.CheckClock(c.now)
		if c.valid != (err == nil) || (!c.valid && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("backend.CheckClock(%v) = %v; want valid=%v", c.now, err, c.valid)
		}
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		now  time.Time
		ttl  time.Duration
		want time.Time
	}{
		{now, time.Hour, now.Add(time.Hour)},
		{now, math.MaxInt64, backend.MaxExpiry()},
		{backend.MaxExpiry().Add(-time.Second), time.Hour, backend.MaxExpiry()},
		{backend.MinClock(), math.MaxInt64, backend.MinClock().Add(math.MaxInt64)},
		{now, -1, now},
	} {
		if got := backend.Expiry(c.now, c.ttl); !got.Equal(c.want) {
			t.Errorf("backend.Expiry(%v, %v) = %v, want %v", c.now, c.ttl, got, c.want)
		}
	}
}

// TestReservationFields: what the core tells the store: the TTL, never a
// clock reading (the store's clock judges expiry), and the call's wait
// deadline.
func TestReservationFields(t *testing.T) {
	s := &fakeStore{}
	g := mustNew(t, s, &Config{TTL: time.Hour, WaitTimeout: -1})
	_, err := g.Do(context.Background(), Key{Scope: "s", ID: "k"}, "fp", func(int) (Response, error) {
		return Response{Status: 201}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := s.reserved[0]
	if left := time.Until(r.Deadline); left <= 0 || left > g.cfg.WaitTimeout {
		t.Fatalf("reservation's Deadline %v: want within WaitTimeout (%v) from now", r.Deadline, g.cfg.WaitTimeout)
	}
	r.Deadline = time.Time{} // a monotonic reading, checked above
	if want := (backend.Reservation{Key: Key{Scope: "s", ID: "k"}, Fingerprint: "fp", TTL: time.Hour, NoWait: true}); r != want || s.completed != 1 {
		t.Fatalf("reservation %+v, %d completions; want %+v, 1", r, s.completed, want)
	}
}

func TestReplayFromStore(t *testing.T) {
	rec := &backend.Record{Key: Key{ID: "k"}, Fingerprint: "fp", Status: 202, Header: http.Header{"A": {"b"}}, Body: []byte("x")}
	g := mustNew(t, &fakeStore{rec: rec}, nil)
	ran := false
	resp, err := g.Do(context.Background(), Key{ID: "k"}, "fp", func(int) (Response, error) { ran = true; return Response{}, nil })
	if err != nil || ran || !resp.Replayed || resp.Status != 202 || string(resp.Body) != "x" || resp.Header.Get("A") != "b" {
		t.Fatalf("got %+v, %v (fn ran: %v); want the record replayed", resp, err, ran)
	}
	if _, err := g.Do(context.Background(), Key{ID: "k"}, "other", func(int) (Response, error) { return Response{}, nil }); !errors.Is(err, ErrMismatch) {
		t.Fatalf("other fingerprint: %v, want ErrMismatch", err)
	}
}

func TestStoreErrorsGetErrStore(t *testing.T) {
	cause := errors.New("connection reset")
	g := mustNew(t, &fakeStore{err: cause}, nil)
	_, err := g.Do(context.Background(), Key{ID: "k"}, "fp", func(int) (Response, error) { return Response{Status: 200}, nil })
	if !errors.Is(err, ErrStore) || !errors.Is(err, cause) {
		t.Fatalf("got %v, want ErrStore and the cause", err)
	}
	g = mustNew(t, &fakeStore{err: fmt.Errorf("%w: held", ErrInProgress)}, &Config{WaitTimeout: -1})
	if _, err := g.Do(context.Background(), Key{ID: "k"}, "fp", nil); !errors.Is(err, ErrInvalidResponse) {
		t.Fatalf("nil fn: %v, want ErrInvalidResponse", err)
	}
	_, err = g.Do(context.Background(), Key{ID: "k"}, "fp", func(int) (Response, error) { return Response{Status: 200}, nil })
	if !errors.Is(err, ErrInProgress) || errors.Is(err, ErrStore) {
		t.Fatalf("held key: %v, want ErrInProgress and not ErrStore", err)
	}
}

func TestPurgeRetriesConflicts(t *testing.T) {
	calls := 0
	s := &fakeStore{purge: func(limit int) (int, error) {
		calls++
		switch calls {
		case 1:
			return limit, nil
		case 2, 3:
			return 0, fmt.Errorf("%w: busy", backend.ErrConflict)
		}
		return 1, nil
	}}
	g := mustNew(t, s, &Config{PurgeBatch: 10, RetryBackoff: time.Microsecond})
	n, err := g.Purge(context.Background())
	if err != nil || n != 11 || calls != 4 {
		t.Fatalf("Purge = %d, %v after %d batches; want 11, nil after 4", n, err, calls)
	}
	calls = 0
	s.purge = func(int) (int, error) { calls++; return 0, fmt.Errorf("%w: busy", backend.ErrConflict) }
	g = mustNew(t, s, &Config{MaxRetries: 2, RetryBackoff: time.Microsecond})
	if _, err := g.Purge(context.Background()); !errors.Is(err, backend.ErrConflict) || calls != 3 {
		t.Fatalf("Purge = %v after %d batches; want backend.ErrConflict after 3", err, calls)
	}
}

func TestTakeWaiterBound(t *testing.T) {
	g := mustNew(t, &fakeStore{}, &Config{MaxWaiters: 2})
	for i, want := range []bool{true, true, false} {
		if got := g.takeWaiter(); got != want {
			t.Fatalf("take %d: %v, want exactly 2 slots", i+1, got)
		}
	}
	g.releaseWaiter()
	if !g.takeWaiter() {
		t.Fatal("a released slot must be free again")
	}
	g = mustNew(t, &fakeStore{}, &Config{MaxWaiters: -1})
	for range 100 {
		if !g.takeWaiter() {
			t.Fatal("no bound: every take succeeds")
		}
	}
	g.releaseWaiter() // no-op without a bound
}

func TestBackoffLargestBase(t *testing.T) {
	for range 100 {
		if d := backoff(maxRetryBackoff, 50); d < 0 || d >= 32*maxRetryBackoff {
			t.Fatalf("backoff(maxRetryBackoff, 50) = %v", d)
		}
	}
}

// TestCancelAfterSuccess: a ctx that ends after the answer committed does
// not turn the success into an error.
func TestCancelAfterSuccess(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := mustNew(t, &fakeStore{}, nil)
	resp, err := g.Do(ctx, Key{ID: "k"}, "fp", func(int) (Response, error) {
		cancel() // the fake store's Complete ignores ctx: the call commits
		return Response{Status: 201}, nil
	})
	if err != nil || resp.Status != 201 {
		t.Fatalf("got %+v, %v; want the committed answer and no error", resp, err)
	}
}

// TestCtxErrorJoined: an error of a call whose ctx ended carries ctx's
// error too, whatever reported it.
func TestCtxErrorJoined(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cause := errors.New("broken pipe")
	g := mustNew(t, &fakeStore{}, nil)
	_, err := g.Do(ctx, Key{ID: "k"}, "fp", func(int) (Response, error) {
		cancel()
		return Response{}, cause // fn failed because its ctx ended
	})
	if !errors.Is(err, cause) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the cause and context.Canceled", err)
	}
}

// heldOnce reports the key held on the first Reserve (which must not
// wait) and hands out rec to the second (which must wait).
type heldOnce struct {
	fakeStore
	waits []time.Duration
}

func (h *heldOnce) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[int], *backend.Record, error) {
	h.mu.Lock()
	h.waits = append(h.waits, r.Wait)
	n := len(h.waits)
	h.mu.Unlock()
	if n == 1 {
		return nil, nil, fmt.Errorf("%w: held", ErrInProgress)
	}
	return nil, &backend.Record{Key: r.Key, Fingerprint: r.Fingerprint, Status: 201, Body: []byte("theirs")}, nil
}

// TestWaitsInStoreWhenHeldElsewhere: a key held elsewhere is asked for
// again with the rest of the wait bound, in a waiter slot.
func TestWaitsInStoreWhenHeldElsewhere(t *testing.T) {
	h := &heldOnce{}
	g := mustNew(t, h, &Config{WaitTimeout: time.Minute, MaxWaiters: 1})
	resp, err := g.Do(context.Background(), Key{ID: "k"}, "fp", func(int) (Response, error) {
		t.Fatal("fn must not run: the holder completed")
		return Response{}, nil
	})
	if err != nil || !resp.Replayed || string(resp.Body) != "theirs" {
		t.Fatalf("got %+v, %v; want the holder's answer", resp, err)
	}
	if len(h.waits) != 2 || h.waits[0] != 0 || h.waits[1] <= 50*time.Second || h.waits[1] > time.Minute {
		t.Fatalf("waits %v: want 0, then the rest of the minute", h.waits)
	}
	if !g.takeWaiter() {
		t.Fatal("the waiter slot was not given back")
	}
	// No slot free: refused at once, without a second Reserve.
	h2 := &heldOnce{}
	g2 := mustNew(t, h2, &Config{WaitTimeout: time.Minute, MaxWaiters: 1})
	g2.takeWaiter()
	if _, err := g2.Do(context.Background(), Key{ID: "k"}, "fp", answer200); !errors.Is(err, ErrInProgress) || len(h2.waits) != 1 {
		t.Fatalf("no free slot: %v after %d reservations; want ErrInProgress after 1", err, len(h2.waits))
	}
	// A negative WaitTimeout (do not wait): refused at once too.
	h3 := &heldOnce{}
	g3 := mustNew(t, h3, &Config{WaitTimeout: -1})
	if _, err := g3.Do(context.Background(), Key{ID: "k"}, "fp", answer200); !errors.Is(err, ErrInProgress) || len(h3.waits) != 1 {
		t.Fatalf("no wait: %v after %d reservations; want ErrInProgress after 1", err, len(h3.waits))
	}
}

func answer200(int) (Response, error) { return Response{Status: 200}, nil }

// slowConflicts is a store that waits each Reserve out (as a store waits
// for a lock it then gives up on) and reports a conflict, until heldAt: from
// then on, when heldAt is set, it reports the key in progress instead. An
// fn error wrapping errFnConflict is a conflict of the store (IsConflict).
type slowConflicts struct {
	fakeStore
	wait        time.Duration
	heldAt      bool // past r.Deadline, report ErrInProgress (the lock may be the key's)
	succeedFrom int  // from this Reserve on (1-based, 0: never), hand out the key
	deadlines   []time.Time
}

var errFnConflict = errors.New("fn met a deadlock")

func (s *slowConflicts) IsConflict(err error) bool { return errors.Is(err, errFnConflict) }

func (s *slowConflicts) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[int], *backend.Record, error) {
	s.mu.Lock()
	s.deadlines = append(s.deadlines, r.Deadline)
	n := len(s.deadlines)
	s.mu.Unlock()
	if s.succeedFrom > 0 && n >= s.succeedFrom {
		return fakeTxn{&s.fakeStore}, nil, nil
	}
	if err := sleep(ctx, s.wait); err != nil {
		return nil, nil, err
	}
	if s.heldAt && !time.Now().Before(r.Deadline) {
		return nil, nil, fmt.Errorf("%w: the lock (maybe the key's) stayed taken", ErrInProgress)
	}
	return nil, nil, fmt.Errorf("%w: lock wait timeout", backend.ErrConflict)
}

// TestWaitTimeoutBoundsConflicts: WaitTimeout bounds the whole call, the
// retries of conflicts and their backoff included. A store that waits 300ms
// and reports a conflict each try keeps Do about WaitTimeout (1s), not
// (MaxRetries+1) x 300ms = 3.3s: ErrStore with ErrConflict, since it never
// reported the key held; one that reports the key held at the bound gives
// ErrInProgress. Each reservation carries the call's deadline.
func TestWaitTimeoutBoundsConflicts(t *testing.T) {
	const bound, each = time.Second, 300 * time.Millisecond
	for _, held := range []bool{false, true} {
		s := &slowConflicts{wait: each, heldAt: held}
		var attempts int
		g := mustNew(t, s, &Config{WaitTimeout: bound, Observer: func(_ context.Context, ev observe.Event) { attempts = ev.Attempts }})
		start := time.Now()
		_, err := g.Do(context.Background(), Key{ID: "k"}, "fp", answer200)
		took := time.Since(start)
		switch {
		case took < bound || took > bound+each+300*time.Millisecond:
			t.Errorf("held %v: Do took %v (%d attempts); want %v..%v", held, took, attempts, bound, bound+each+300*time.Millisecond)
		case held && (!errors.Is(err, ErrInProgress) || errors.Is(err, ErrStore)):
			t.Errorf("held at the bound: %v; want ErrInProgress, not ErrStore", err)
		case !held && (!errors.Is(err, ErrStore) || !errors.Is(err, backend.ErrConflict) || errors.Is(err, ErrInProgress)):
			t.Errorf("conflicts to the bound: %v; want ErrStore with backend.ErrConflict", err)
		case attempts < 3:
			t.Errorf("held %v: %d attempts; want the conflicts retried until the bound", held, attempts)
		}
		for _, d := range s.deadlines {
			if d.Sub(start) < bound || d.Sub(start) > bound+100*time.Millisecond {
				t.Errorf("held %v: a reservation's Deadline was %v after the start, want %v", held, d.Sub(start), bound)
			}
		}
	}
}

// TestConflictRetriesNotCut: callers of keys nobody holds keep their
// retries. Fast conflicts are retried up to MaxRetries within the bound;
// and once fn has run (its time is not waiting), a conflict it meets past
// the bound is still retried.
func TestConflictRetriesNotCut(t *testing.T) {
	s := &slowConflicts{succeedFrom: 11} // 10 conflicts, then the key
	g := mustNew(t, s, &Config{WaitTimeout: time.Second, RetryBackoff: time.Microsecond})
	if _, err := g.Do(context.Background(), Key{ID: "k"}, "fp", answer200); err != nil || len(s.deadlines) != 11 {
		t.Fatalf("10 fast conflicts: %v after %d reservations; want success after 11", err, len(s.deadlines))
	}

	s = &slowConflicts{succeedFrom: 1}
	g = mustNew(t, s, &Config{WaitTimeout: 50 * time.Millisecond})
	runs := 0
	resp, err := g.Do(context.Background(), Key{ID: "k"}, "fp", func(int) (Response, error) {
		runs++
		if runs == 1 {
			time.Sleep(100 * time.Millisecond) // past the bound
			return Response{}, errFnConflict
		}
		return Response{Status: 201}, nil
	})
	if err != nil || resp.Status != 201 || runs != 2 {
		t.Fatalf("fn's conflict past the bound: %+v, %v after %d runs; want 201 after 2", resp, err, runs)
	}
}

// TestFollowersGetPrivateCopy: the callers that wait in memory for a call
// get its answer as it was committed, although the leader's caller changes
// the response it got (header and body) as soon as Do returns. The answer
// is copied for them only when some joined (see leave).
func TestFollowersGetPrivateCopy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g := mustNew(t, &fakeStore{}, nil)
	key := Key{ID: "k"}
	started, release := make(chan struct{}), make(chan struct{})
	fn := func(int) (Response, error) {
		close(started)
		<-release
		return Response{Status: 201, Header: http.Header{"A": {"x"}}, Body: []byte("body")}, nil
	}
	leader := make(chan error, 1)
	go func() {
		resp, err := g.Do(ctx, key, "fp", fn)
		if err == nil {
			resp.Header["A"][0] = "y" // the caller's own copy: any change
			resp.Header.Set("B", "z")
			resp.Body[0] = 'X'
		}
		leader <- err
	}()
	<-started
	const followers = 3
	got := make(chan Response, followers)
	errs := make(chan error, followers)
	for range followers {
		go func() {
			resp, err := g.Do(ctx, key, "fp", func(int) (Response, error) {
				return Response{}, errors.New("fn ran for a follower")
			})
			got <- resp
			errs <- err
		}()
	}
	for joined := 0; joined < followers; {
		g.fl.mu.Lock()
		if c := g.fl.calls[key]; c != nil {
			joined = c.followers
		}
		g.fl.mu.Unlock()
		if ctx.Err() != nil {
			t.Fatalf("%d followers joined, want %d", joined, followers)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-leader; err != nil {
		t.Fatalf("leader: %v", err)
	}
	for range followers {
		resp, err := <-got, <-errs
		if err != nil || !resp.Replayed || resp.Status != 201 || string(resp.Body) != "body" ||
			len(resp.Header) != 1 || len(resp.Header["A"]) != 1 || resp.Header["A"][0] != "x" {
			t.Fatalf("follower got %+v (body %q), %v; want 201 {A: x} \"body\", replayed", resp, resp.Body, err)
		}
	}
}
