package postgres

import (
	"context"
	"fmt"
)

// Purge implements [idempotency.KeyStore] with one DELETE, in its own
// implicit transaction. It deletes at most limit rows whose expires_at <=
// the server's clock_timestamp() (or the test clock, [Config.Clock]). It
// skips rows locked by open transactions, and the rows of unfinished
// operations (which never expire anyway). On a table of v0.1.0 not migrated
// yet, it deletes with the statement of v0.1.0.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	now, err := s.now()
	if err != nil {
		return 0, err
	}
	tag, err := s.q.exec(ctx, s.sql.purge, execMode, now, limit)
	if isUndefinedColumn(err) && ctx.Err() == nil {
		// A table of v0.1.0, not migrated yet: no row of it has progress.
		tag, err = s.q.exec(ctx, s.sql.purgeV1, execMode, now, limit)
	}
	if err != nil {
		return 0, s.mapError(ctx, fmt.Errorf("postgres: purge: %w", err), false)
	}
	return int(tag.RowsAffected()), nil
}
