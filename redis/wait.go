package redis

import (
	"context"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	goredis "github.com/redis/go-redis/v9"
)

// wait returns when the local holder h ends, with its record if it
// completed. It also returns after a message on w's channel, or a
// resubscription after a reconnect (which may have lost one). Otherwise it
// returns after d, or with ctx's error. Either
// h or w may be nil.
func wait(ctx context.Context, h *hold, w *waiter, d time.Duration) (*backend.Record, error) {
	var done <-chan struct{}
	if h != nil {
		h.waiters.Add(1)
		defer h.waiters.Add(-1)
		done = h.done
	}
	var msgs <-chan any
	if w != nil {
		msgs = w.msgs
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return h.record(), nil
	case _, ok := <-msgs:
		if !ok {
			w.msgs = nil // closed with the client: rely on the timer
		}
		return nil, nil
	case <-t.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// waiter is a subscription to one key's wake-up channel.
type waiter struct {
	ps   *goredis.PubSub
	msgs <-chan any
}

// subscribe subscribes to channel and waits (at most d) until Redis has
// confirmed the subscription.
func (s *Store) subscribe(ctx context.Context, channel string, d time.Duration) (*waiter, error) {
	ps := s.client.Subscribe(ctx, channel)
	w := &waiter{ps: ps, msgs: ps.ChannelWithSubscriptions()}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				w.msgs = nil
				return w, nil
			}
			if _, ok := m.(*goredis.Subscription); ok {
				return w, nil
			}
		case <-t.C:
			return w, nil // unconfirmed: the caller looks again and polls
		case <-ctx.Done():
			w.close()
			return nil, ctx.Err()
		}
	}
}

func (w *waiter) close() {
	if w != nil {
		_ = w.ps.Close()
	}
}
