package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/storedsn"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/redis"
	"github.com/go-idempotency/idempotency/sqlite"
)

// admin is what idemctl asks of a Guard, whatever its store.
type admin interface {
	Inspect(ctx context.Context, key idempotency.Key, body bool) (*idempotency.KeyInfo, error)
	Forget(ctx context.Context, key idempotency.Key) (*idempotency.KeyInfo, error)
	List(ctx context.Context, q idempotency.ListQuery) (idempotency.KeyPage, error)
	Stats(ctx context.Context) (idempotency.Stats, error)
	Purge(ctx context.Context) (int, error)
}

// guardConfig is the Guard idemctl runs on a store: with the Codec of
// -keyring, it opens a sealed body.
func guardConfig(o options) *idempotency.Config {
	cfg := &idempotency.Config{PurgeBatch: o.batch}
	if o.codec != nil {
		cfg.Codec = o.codec
	}
	return cfg
}

// open connects to the store o names and returns a Guard on it, and what
// closes the connections. It creates nothing: no file, no table.
func open(ctx context.Context, o options) (admin, func(), error) {
	t := o.store
	switch t.Kind {
	case storedsn.Postgres:
		if t.DatabaseSQL {
			return openPostgresSQL(ctx, t.Postgres, o)
		}
		return openPostgres(ctx, t.Postgres, o)
	case storedsn.MySQL:
		db, err := mysql.Open(ctx, t.MySQL)
		if err != nil {
			return nil, nil, err
		}
		s, err := mysql.New(db, &mysql.Config{Table: o.table})
		return guard(s, err, o, func() { _ = db.Close() })
	case storedsn.SQLite:
		if st, err := os.Stat(t.Path); errors.Is(err, fs.ErrNotExist) || err == nil && !st.Mode().IsRegular() {
			return nil, nil, usagef("SQLite: no database file at %s (idemctl never creates one)", t.Path)
		} else if err != nil {
			return nil, nil, fmt.Errorf("SQLite: %w", err)
		}
		db, err := sqlite.Open(ctx, t.Path)
		if err != nil {
			return nil, nil, err
		}
		s, err := sqlite.New(db, &sqlite.Config{Table: o.table})
		return guard(s, err, o, func() { _ = db.Close() })
	case storedsn.Redis:
		client := goredis.NewClient(t.Redis)
		if err := client.Ping(ctx).Err(); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("redis: %s: %w", t.Redis.Addr, err), client.Close())
		}
		s, err := redis.New(client, &redis.Config{Prefix: o.prefix})
		return guard(s, err, o, func() { _ = client.Close() })
	}
	return nil, nil, fmt.Errorf("unknown store kind %q", t.Kind)
}

func openPostgres(ctx context.Context, cfg *pgxpool.Config, o options) (admin, func(), error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	s, err := postgres.New(pool, &postgres.Config{Table: o.table})
	return guard(s, err, o, pool.Close)
}

// openPostgresSQL is openPostgres for a postgres+sql:// value: the store on
// database/sql (postgres.NewDB), with pgx's stdlib driver.
func openPostgresSQL(ctx context.Context, cfg *pgxpool.Config, o options) (admin, func(), error) {
	db := stdlib.OpenDB(*cfg.ConnConfig)
	if err := db.PingContext(ctx); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("postgres: %w", err), db.Close())
	}
	s, err := postgres.NewDB(db, &postgres.Config{Table: o.table})
	return guard(s, err, o, func() { _ = db.Close() })
}

// guard builds the Guard on store s (made with err), closing the
// connections if either fails.
func guard[Tx any](s idempotency.KeyStore[Tx], err error, o options, closeConns func()) (admin, func(), error) {
	if err != nil {
		closeConns()
		return nil, nil, err
	}
	g, err := idempotency.New(s, guardConfig(o))
	if err != nil {
		closeConns()
		return nil, nil, err
	}
	return g, closeConns, nil
}
