package idempotency

import (
	"context"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// trace gathers what a call's [observe.Event] reports besides its outcome. The
// goroutine of the call that owns it is the only one that touches it.
type trace struct {
	waited  time.Duration // waits for another holder of the key
	age     time.Duration // age of the record replayed from the store
	afterFn bool          // the last attempt's Complete failed
}

// recordAge is how old rec is by the application's clock, zero if the
// store did not say or the clocks make it negative.
func recordAge(rec *backend.Record) time.Duration {
	if rec.CreatedAt.IsZero() {
		return 0
	}
	return max(0, time.Since(rec.CreatedAt))
}

// observePurge tells the Observer about one batch of Purge.
func (g *Guard[Tx]) observePurge(ctx context.Context, deleted int, took time.Duration, err error) {
	if g.cfg.Observer == nil {
		return
	}
	g.cfg.Observer(ctx, observe.Event{Outcome: observe.Purged, Deleted: deleted, Duration: took, Attempts: 1, Err: err})
}
