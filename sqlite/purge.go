package sqlite

import (
	"context"
	"time"
)

// Purge implements [idempotency.KeyStore]: it deletes at most limit keys
// whose ExpiresAt <= before in one statement (its own transaction). A key
// held by an open transaction is not visible to it. SQLite has one writer
// at a time, so Purge queues for the Store's write turn like any of its
// writers (while ctx lives), then for SQLite's lock against writers outside
// the Store, under the busy timeout of the pool's connection and ctx; a
// database still busy then gives an error wrapping
// [idempotency.ErrConflict]. Keys are random, so a batch of n deletions
// touches about n pages of the primary key's index: keep batches small
// ([idempotency.Config.PurgeBatch]) when Do must stay fast during a purge.
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	if err := s.acquire(ctx, false, time.Time{}); err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, s.q.purge, before.UnixNano(), limit)
	<-s.writer
	if err != nil {
		return 0, mapError(ctx, "purge", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, mapError(ctx, "purge", err)
	}
	return int(n), nil
}
