package idempotency

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The tests of this file drive time with testing/synctest: inside a
// bubble the clock moves only when every goroutine of the bubble is
// blocked, so the waits and pauses they measure are exact and take no
// wall-clock time. Tests against real servers keep the real clock.

// TestWaitBoundPerWaiter: each waiter of one call gives up at its own
// bound, whoever came first: a waiter whose bound is later keeps waiting
// past the first one's, one whose bound is earlier gives up first, and all
// of them get the answer when the call ends before their bounds.
func TestWaitBoundPerWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c := &call{done: make(chan struct{}), ran: make(chan struct{})}
		start := time.Now()
		bounds := []time.Duration{60 * time.Millisecond, 180 * time.Millisecond, 20 * time.Millisecond}
		type result struct {
			err     error
			elapsed time.Duration
		}
		results := make([]result, len(bounds))
		var wg sync.WaitGroup
		for i, b := range bounds {
			wg.Go(func() {
				err := c.wait(ctx, nil, start.Add(b))
				results[i] = result{err, time.Since(start)}
			})
			synctest.Wait() // the waiters arrive in order
		}
		wg.Wait()
		for i, r := range results {
			if !errors.Is(r.err, ErrInProgress) || r.elapsed != bounds[i] {
				t.Errorf("waiter %d (bound %v): %v after %v; want ErrInProgress at its bound exactly", i, bounds[i], r.err, r.elapsed)
			}
		}

		// The call ends before any bound: every waiter returns nil at once.
		c = &call{done: make(chan struct{}), ran: make(chan struct{})}
		errs := make(chan error, len(bounds))
		for _, b := range bounds {
			go func() { errs <- c.wait(ctx, nil, time.Now().Add(b+time.Minute)) }()
		}
		synctest.Wait() // every waiter is blocked in wait
		ended := time.Now()
		(&Guard[int]{fl: &flight{calls: map[Key]*call{}}}).leave(Key{ID: "k"}, c, &answer{})
		for range bounds {
			if err := <-errs; err != nil {
				t.Errorf("waiter of a call that ended: %v, want nil", err)
			}
		}
		if d := time.Since(ended); d != 0 {
			t.Errorf("the waiters returned %v after the call ended, want at once", d)
		}
	})
}

// TestPurgePause: Purge pauses after each full batch, by default as long as
// the batch took; PurgePause sets the pause, a negative one none.
func TestPurgePause(t *testing.T) {
	for _, c := range []struct {
		pause, took, want time.Duration
	}{
		{0, 40 * time.Millisecond, 40 * time.Millisecond},
		{-1, 40 * time.Millisecond, 0},
		{5 * time.Millisecond, 40 * time.Millisecond, 5 * time.Millisecond},
	} {
		if got := purgePause(c.pause, c.took); got != c.want {
			t.Errorf("purgePause(%v, %v) = %v, want %v", c.pause, c.took, got, c.want)
		}
	}
	const batch = 20 * time.Millisecond
	for _, c := range []struct {
		pause time.Duration
		took  time.Duration // 3 full batches and a short one, and the pauses
	}{
		{0, 4*batch + 3*batch},
		{30 * time.Millisecond, 4*batch + 3*30*time.Millisecond},
		{-1, 4 * batch},
	} {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			s := &fakeStore{purge: func(limit int) (int, error) {
				calls++
				time.Sleep(batch)
				if calls <= 3 {
					return limit, nil
				}
				return 1, nil
			}}
			g := mustNew(t, s, &Config{PurgeBatch: 10, PurgePause: c.pause})
			start := time.Now()
			n, err := g.Purge(context.Background())
			if took := time.Since(start); err != nil || n != 31 || took != c.took {
				t.Errorf("PurgePause %v: Purge = %d, %v in %v; want 31, nil in %v exactly", c.pause, n, err, took, c.took)
			}
		})
	}
	// A pause ends with ctx.
	synctest.Test(t, func(t *testing.T) {
		s := &fakeStore{purge: func(limit int) (int, error) { return limit, nil }}
		g := mustNew(t, s, &Config{PurgeBatch: 10, PurgePause: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		if n, err := g.Purge(ctx); !errors.Is(err, context.DeadlineExceeded) || n != 10 || time.Since(start) != 50*time.Millisecond {
			t.Fatalf("Purge paused past ctx: %d, %v after %v; want 10, DeadlineExceeded after 50ms", n, err, time.Since(start))
		}
	})
}
