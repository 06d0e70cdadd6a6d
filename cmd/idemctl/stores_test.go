package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/redis"
	"github.com/go-idempotency/idempotency/sqlite"
)

func clock() time.Time { return seedClock }

// newStoreCase opens the store name on the test servers, in a table (or
// key prefix) of its own dropped at the end, and seeds through a store
// that reads seedClock.
func newStoreCase(t *testing.T, ctx context.Context, name string) storeCase {
	t.Helper()
	table := testkit.Name("idemctl_")
	cleanup := func(what string, err error) {
		if err != nil {
			t.Errorf("cleanup %s: %v", what, err)
		}
	}
	switch name {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "keys.db")
		db, err := sqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cleanup("sqlite", db.Close()) })
		s, err := sqlite.New(db, &sqlite.Config{Table: table, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return storeCase{name: name, args: []string{"-store", "sqlite:" + path, "-table", table}, seed: newGuards(t, s), held: []string{"notfound"}}
	case "postgres", "postgres+sql": // idemctl reads through the store on pgx or on database/sql
		dsn := testenv.PostgresDSN(t)
		pool, err := postgres.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
			cleanup("postgres", err)
			pool.Close()
		})
		s, err := postgres.New(pool, &postgres.Config{Table: table, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		arg := dsn
		if name == "postgres+sql" {
			arg = strings.Replace(dsn, "://", "+sql://", 1)
		}
		return storeCase{name: name, args: []string{"-store", arg, "-table", table}, seed: newGuards(t, s), held: []string{"in_progress"}}
	case "mysql":
		dsn := testenv.MySQLDSN(t)
		db, err := mysql.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
			cleanup("mysql", err)
			_ = db.Close()
		})
		s, err := mysql.New(db, &mysql.Config{Table: table, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return storeCase{name: name, args: []string{"-store", dsn, "-table", table}, seed: newGuards(t, s), held: []string{"in_progress"}}
	case "redis":
		addr := testenv.RedisAddr(t)
		client := goredis.NewClient(&goredis.Options{Addr: addr})
		prefix := "idemctl:{" + table + "}:"
		t.Cleanup(func() {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				cleanup("redis", client.Del(ctx, iter.Val()).Err())
			}
			cleanup("redis", iter.Err())
			_ = client.Close()
		})
		s, err := redis.New(client, &redis.Config{Prefix: prefix, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return storeCase{name: name, args: []string{"-store", "redis://" + addr, "-prefix", prefix}, seed: newGuards(t, s), held: []string{"in_progress"}}
	}
	t.Fatalf("unknown store %q", name)
	return storeCase{}
}
