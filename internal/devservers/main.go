// Command devservers starts the servers the module's tests run against
// (PostgreSQL 16, MariaDB 10.11 and Redis 7) in Docker containers with
// testcontainers-go. It prints the environment variables that point the
// tests at them. It keeps them running until it is interrupted (Ctrl-C),
// then removes them.
//
// It lives in a module of its own so that testcontainers-go, the Docker
// client and OpenTelemetry stay out of the library's requirement graph. Run
// it from the repository root, in a second terminal:
//
//	go run -C internal/devservers .
//
// then paste the printed export lines into the terminal that runs
// `go test ./...`. -only starts a subset: -only postgres,redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcmysql "github.com/testcontainers/testcontainers-go/modules/mysql"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"

	"github.com/go-idempotency/idempotency/internal/testenv"
)

// Images started, the versions the README names.
const (
	postgresImage = "postgres:16-alpine"
	mariadbImage  = "mariadb:10.11"
	redisImage    = "redis:7-alpine"
)

// server is one backend that devservers can start.
type server struct {
	name string // for -only
	env  string // the variable the tests read
	// start runs the container and returns it with the variable's value.
	start func(ctx context.Context) (testcontainers.Container, string, error)
}

func servers() []server {
	return []server{
		{"postgres", testenv.PostgresEnv, startPostgres},
		{"mysql", testenv.MySQLEnv, startMariaDB},
		{"redis", testenv.RedisEnv, startRedis},
	}
}

func startPostgres(ctx context.Context) (testcontainers.Container, string, error) {
	c, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return c, "", err
	}
	dsn, err := c.ConnectionString(ctx, "sslmode=disable")
	return c, dsn, err
}

func startMariaDB(ctx context.Context) (testcontainers.Container, string, error) {
	// root, so that the tests may read information_schema.INNODB_TRX.
	c, err := tcmysql.Run(ctx, mariadbImage,
		tcmysql.WithDatabase("test"), tcmysql.WithUsername("root"), tcmysql.WithPassword("test"))
	if err != nil {
		return c, "", err
	}
	dsn, err := c.ConnectionString(ctx)
	return c, dsn, err
}

func startRedis(ctx context.Context) (testcontainers.Container, string, error) {
	c, err := tcredis.Run(ctx, redisImage)
	if err != nil {
		return c, "", err
	}
	uri, err := c.ConnectionString(ctx)
	return c, strings.TrimPrefix(uri, "redis://"), err
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "devservers: %v\n", err)
		stop()
		os.Exit(1)
	}
}

// selectServers returns the servers named in only (comma-separated; empty
// means all).
func selectServers(only string) ([]server, error) {
	all := servers()
	if only == "" {
		return all, nil
	}
	var picked []server
	for name := range strings.SplitSeq(only, ",") {
		i := slices.IndexFunc(all, func(s server) bool { return s.name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("-only: unknown server %q (want postgres, mysql or redis)", name)
		}
		picked = append(picked, all[i])
	}
	return picked, nil
}

// run starts the servers, prints the export lines to stdout and waits for
// ctx to end, then removes the containers.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("devservers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	only := fs.String("only", "", "comma-separated `servers` to start: postgres, mysql, redis (default all)")
	timeout := fs.Duration("timeout", 5*time.Minute, "time allowed to pull and start the images")
	if err := fs.Parse(args); err != nil {
		return err
	}
	picked, err := selectServers(*only)
	if err != nil {
		return err
	}

	var started []testcontainers.Container
	defer func() {
		for _, c := range started {
			err = errors.Join(err, testcontainers.TerminateContainer(c))
		}
	}()
	startCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var exports []string
	for _, s := range picked {
		fmt.Fprintf(stderr, "devservers: starting %s...\n", s.name)
		c, val, err := s.start(startCtx)
		if c != nil {
			started = append(started, c)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		exports = append(exports, fmt.Sprintf("export %s='%s'", s.env, val))
	}
	for _, e := range exports {
		fmt.Fprintln(stdout, e)
	}
	fmt.Fprintf(stdout, "export %s=1\n", testenv.RequireAllEnv)
	fmt.Fprintf(stderr, "devservers: paste the lines above into the shell that runs go test; Ctrl-C removes the containers\n")
	<-ctx.Done()
	return nil
}
