package postgres

import (
	"context"
	"fmt"
)

// Purge implements [idempotency.KeyStore] with one DELETE, in its own
// implicit transaction. It deletes at most limit rows whose expires_at <=
// the server's clock_timestamp() (or the test clock, [Config.Clock]). It
// skips rows locked by open transactions.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	now, err := s.now()
	if err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, s.sql.purge, execMode, now, limit)
	if err != nil {
		return 0, s.mapError(ctx, fmt.Errorf("postgres: purge: %w", err), false)
	}
	return int(tag.RowsAffected()), nil
}
