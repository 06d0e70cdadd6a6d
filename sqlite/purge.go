package sqlite

import (
	"context"
	"time"
)

// Purge implements [idempotency.KeyStore]: it deletes at most limit keys
// whose ExpiresAt <= SQLite's clock (or the test clock, [Config].Clock, read
// once). It deletes purgeChunk keys per statement, each statement its own
// transaction. A key held by an open transaction is not visible to it. An
// unfinished key (with progress: see [Store.Acquire]) is never deleted; on
// a v0.1.0 table, which has none, Purge works before [Store.Migrate]
// upgrades it.
// SQLite has one writer at a time. So each statement queues for the Store's
// write turn like any of its writers (while ctx lives), and gives it back
// at once. A Do waits for one small statement of a purge, not for a whole
// batch. Each statement then waits for SQLite's lock against writers outside
// the Store, under the busy timeout of the pool's connection and ctx. A
// database still busy then gives an error wrapping
// [backend.ErrConflict], with the count of keys deleted so far.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	before, err := s.testNow()
	if err != nil {
		return 0, err
	}
	deleted := 0
	for deleted < limit {
		chunk := min(limit-deleted, purgeChunk)
		n, err := s.deleteExpired(ctx, before, chunk)
		deleted += n
		if err != nil || n < chunk {
			return deleted, err
		}
	}
	return deleted, nil
}

// purgeChunk is how many keys one statement of Purge deletes at most.
// Keys are random, so a statement of n deletions touches about n pages of
// the primary key's index: about 0.4 ms for 100 here, during which every
// writer of the database waits.
const purgeChunk = 100

// deleteExpired deletes at most limit expired keys in one statement.
func (s *Store) deleteExpired(ctx context.Context, before any, limit int) (int, error) {
	if err := s.acquire(ctx, nil, false, time.Time{}, forever); err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, s.q.purge, before, limit)
	if err != nil && ctx.Err() == nil && noProgressColumn(err) {
		// A v0.1.0 table, not yet upgraded by Migrate: it has no
		// unfinished rows.
		res, err = s.db.ExecContext(ctx, s.q.purgeV1, before, limit)
	}
	s.releaseTurn()
	if err != nil {
		return 0, mapError(ctx, "purge", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, mapError(ctx, "purge", err)
	}
	return int(n), nil
}
