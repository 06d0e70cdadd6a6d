// Package testenv finds the servers that tests run against. Library code
// never imports it.
//
// Each server comes from an environment variable. When the variable is unset
// and a Docker engine answers, the server is started with testcontainers-go
// (for machines with Docker); otherwise the test is skipped with a message
// naming the variable, or fails when IDEMPOTENCY_REQUIRE_ALL=1.
package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcmysql "github.com/testcontainers/testcontainers-go/modules/mysql"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// Environment variables read by this package.
const (
	PostgresEnv   = "IDEMPOTENCY_POSTGRES_DSN"
	MySQLEnv      = "IDEMPOTENCY_MYSQL_DSN"
	RedisEnv      = "IDEMPOTENCY_REDIS_ADDR"
	RequireAllEnv = "IDEMPOTENCY_REQUIRE_ALL"
)

// PostgresDSN returns a PostgreSQL DSN (pgx URL or keyword form).
func PostgresDSN(t testing.TB) string {
	return lookup(t, PostgresEnv, func(ctx context.Context) (testcontainers.Container, string, error) {
		c, err := tcpostgres.Run(ctx, "postgres:16-alpine", tcpostgres.BasicWaitStrategies())
		if err != nil {
			return c, "", err
		}
		dsn, err := c.ConnectionString(ctx, "sslmode=disable")
		return c, dsn, err
	})
}

// MySQLDSN returns a go-sql-driver/mysql DSN.
func MySQLDSN(t testing.TB) string {
	return lookup(t, MySQLEnv, func(ctx context.Context) (testcontainers.Container, string, error) {
		c, err := tcmysql.Run(ctx, "mariadb:10.11")
		if err != nil {
			return c, "", err
		}
		dsn, err := c.ConnectionString(ctx, "parseTime=true")
		return c, dsn, err
	})
}

// RedisAddr returns a Redis address (host:port).
func RedisAddr(t testing.TB) string {
	return lookup(t, RedisEnv, func(ctx context.Context) (testcontainers.Container, string, error) {
		c, err := tcredis.Run(ctx, "redis:7-alpine")
		if err != nil {
			return c, "", err
		}
		uri, err := c.ConnectionString(ctx)
		return c, strings.TrimPrefix(uri, "redis://"), err
	})
}

// RequireAll reports whether IDEMPOTENCY_REQUIRE_ALL=1: a server that cannot
// be reached then fails the test instead of skipping it.
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }

// started caches containers per variable for the life of the test binary.
var started sync.Map // env name -> *startResult

type startResult struct {
	once sync.Once
	val  string
	err  error
}

func lookup(t testing.TB, env string, start func(context.Context) (testcontainers.Container, string, error)) string {
	t.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	r, _ := started.LoadOrStore(env, &startResult{})
	res := r.(*startResult)
	res.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		// The container lives as long as the test binary; testcontainers'
		// reaper removes it afterwards.
		_, res.val, res.err = start(ctx)
	})
	if res.err != nil {
		msg := fmt.Sprintf("%s is not set and no container could be started (%v)", env, res.err)
		if RequireAll() {
			t.Fatalf("%s, and %s=1 requires every backend", msg, RequireAllEnv)
		}
		t.Skip(msg)
	}
	return res.val
}
