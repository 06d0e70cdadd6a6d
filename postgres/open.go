package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
)

// Open parses dsn, a postgres:// (or postgresql://) URL or a key=value
// connection string, opens a pool on it and pings the server under ctx. A
// DSN the driver cannot parse is refused with an error wrapping
// [idempotency.ErrInvalidConfig] before anything is sent; a failed ping
// closes the pool and is returned. The pool is the driver's, with the
// settings dsn gives (pool_max_conns and the like): the store needs no
// other. The caller closes the returned pool.
func Open(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres DSN: %w", idempotency.ErrInvalidConfig, err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	return pool, nil
}
