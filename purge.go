package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
)

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
