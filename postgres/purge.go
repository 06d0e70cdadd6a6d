package postgres

import (
	"context"
	"fmt"
	"time"
)

// Purge implements [idempotency.KeyStore]: one DELETE (its own implicit
// transaction) of at most limit rows whose expires_at <= before, skipping
// rows locked by open transactions.
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.sql.purge, execMode, before.Truncate(time.Microsecond), limit)
	if err != nil {
		return 0, s.mapError(ctx, fmt.Errorf("postgres: purge: %w", err), false)
	}
	return int(tag.RowsAffected()), nil
}
