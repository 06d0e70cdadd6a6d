package historycheck

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/redis"
	"github.com/go-idempotency/idempotency/sqlite"
)

// Stores are the stores a history can run on, as Open names them.
var Stores = []string{"postgres", "mysql", "sqlite", "redis"}

// Recorder records history number n: a [conformance.HistoryRig] of some
// transaction type.
type Recorder interface {
	Record(ctx context.Context, n uint64) (conformance.History, error)
}

// The variables that name the servers, as the module's tests read them.
const (
	envPostgres = "IDEMPOTENCY_POSTGRES_DSN"
	envMySQL    = "IDEMPOTENCY_MYSQL_DSN"
	envRedis    = "IDEMPOTENCY_REDIS_ADDR"
)

// ErrNoServer: the variable naming the store's server is not set.
var ErrNoServer = errors.New("historycheck: no server configured")

// Lanes returns lanes recorders on store, each with a fault proxy of its
// own in front of the server (none for SQLite, which has no network), on
// one keys table (or prefix) and one effects table made for the run. wrap,
// if not nil, wraps the store the calls run on (a broken store, in the
// tests). The returned func drops what was made and closes everything.
func Lanes(ctx context.Context, store string, lanes int, wrap func(any) any) ([]Recorder, func(), error) {
	c := &closer{}
	var recs []Recorder
	var err error
	switch store {
	case "postgres":
		recs, err = pgLanes(ctx, c, lanes, wrap)
	case "mysql":
		recs, err = mysqlLanes(ctx, c, lanes, wrap)
	case "sqlite":
		recs, err = sqliteLanes(ctx, c, lanes, wrap)
	case "redis":
		recs, err = redisLanes(ctx, c, lanes, wrap)
	default:
		err = fmt.Errorf("historycheck: unknown store %q (want one of %v)", store, Stores)
	}
	if err != nil {
		c.close()
		return nil, nil, err
	}
	return recs, c.close, nil
}

// closer runs its funcs in reverse order.
type closer struct{ fns []func() }

func (c *closer) add(f func()) { c.fns = append(c.fns, f) }
func (c *closer) close() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}

func name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func wrapped[Tx any](s idempotency.KeyStore[Tx], wrap func(any) any) idempotency.KeyStore[Tx] {
	if wrap == nil {
		return s
	}
	return wrap(s).(idempotency.KeyStore[Tx])
}

// proxied starts a fault proxy to upstream that counts its steps for rig.
func proxied[Tx any](c *closer, upstream string, rig *conformance.HistoryRig[Tx]) (*faultproxy.Proxy, error) {
	p, err := faultproxy.New(upstream, &faultproxy.Config{OnStep: rig.CountStep})
	if err != nil {
		return nil, err
	}
	c.add(func() { p.CutAll(); _ = p.Close() })
	rig.Proxy = p
	return p, nil
}

func pgLanes(ctx context.Context, c *closer, lanes int, wrap func(any) any) ([]Recorder, error) {
	dsn := os.Getenv(envPostgres)
	if dsn == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoServer, envPostgres)
	}
	table := name("hist_")
	fx := table + "_fx"
	open := func(addr string) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 8
		// A session whose client vanished mid-transaction ends soon.
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "1500"
		if addr != "" {
			host, port, _ := net.SplitHostPort(addr)
			p, _ := strconv.Atoi(port)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		c.add(pool.Close)
		return pool, nil
	}
	clean, err := open("")
	if err != nil {
		return nil, err
	}
	cs, err := postgres.New(clean, &postgres.Config{Table: table})
	if err != nil {
		return nil, err
	}
	if err := cs.Migrate(ctx); err != nil {
		return nil, err
	}
	c.add(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = clean.Exec(dctx, "DROP TABLE IF EXISTS "+table+", "+table+"_quota, "+fx)
	})
	if _, err := clean.Exec(ctx, "CREATE TABLE "+fx+" (tag TEXT)"); err != nil {
		return nil, err
	}
	effect := func(ctx context.Context, tx pgx.Tx, tag string) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+fx+" (tag) VALUES ($1)", tag)
		return err
	}
	count := func(ctx context.Context, tag string) (n int, err error) {
		err = clean.QueryRow(ctx, "SELECT count(*) FROM "+fx+" WHERE tag = $1", tag).Scan(&n)
		return n, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	upstream := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	var recs []Recorder
	for range lanes {
		rig := &conformance.HistoryRig[pgx.Tx]{Store: "postgres", Clean: conformance.Fixture[pgx.Tx]{Store: cs, Count: count}}
		p, err := proxied(c, upstream, rig)
		if err != nil {
			return nil, err
		}
		pool, err := open(p.Addr())
		if err != nil {
			return nil, err
		}
		fs, err := postgres.New(pool, &postgres.Config{Table: table})
		if err != nil {
			return nil, err
		}
		rig.Faulty = conformance.Fixture[pgx.Tx]{Store: wrapped[pgx.Tx](fs, wrap), Effect: effect}
		recs = append(recs, rig)
	}
	return recs, nil
}

// sqlEffects is an effects table on a database/sql database with ?
// placeholders.
type sqlEffects struct {
	db    *sql.DB
	table string
}

func (e sqlEffects) effect(ctx context.Context, tx *sql.Tx, tag string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+e.table+" (tag) VALUES (?)", tag)
	return err
}

func (e sqlEffects) count(ctx context.Context, tag string) (n int, err error) {
	err = e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.table+" WHERE tag = ?", tag).Scan(&n)
	return n, err
}

func mysqlLanes(ctx context.Context, c *closer, lanes int, wrap func(any) any) ([]Recorder, error) {
	dsn := os.Getenv(envMySQL)
	if dsn == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoServer, envMySQL)
	}
	table := name("hist_")
	open := func(dsn string) (*sql.DB, error) {
		db, err := mysql.Open(ctx, dsn)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(8)
		c.add(func() { _ = db.Close() })
		return db, nil
	}
	clean, err := open(dsn)
	if err != nil {
		return nil, err
	}
	cs, err := mysql.New(clean, &mysql.Config{Table: table})
	if err != nil {
		return nil, err
	}
	if err := cs.Migrate(ctx); err != nil {
		return nil, err
	}
	fx := sqlEffects{db: clean, table: table + "_fx"}
	c.add(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = clean.ExecContext(dctx, "DROP TABLE IF EXISTS "+table+", "+table+"_quota, "+fx.table)
	})
	if _, err := clean.ExecContext(ctx, "CREATE TABLE "+fx.table+" (tag VARCHAR(200))"); err != nil {
		return nil, err
	}
	mc, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	var recs []Recorder
	for range lanes {
		rig := &conformance.HistoryRig[*sql.Tx]{Store: "mysql", Clean: conformance.Fixture[*sql.Tx]{Store: cs, Count: fx.count}}
		p, err := proxied(c, mc.Addr, rig)
		if err != nil {
			return nil, err
		}
		pc := mc.Clone()
		pc.Addr = p.Addr()
		// A bound on every read: a Reserve whose first statement met a
		// lock rolls back with database/sql's Tx.Rollback, which takes no
		// context (mysql/reserve.go refusedAtOnce, mysql/connector.go
		// foldConn.end). With that ROLLBACK's reply dropped, it waited
		// for the reply forever, whatever the caller's deadline.
		pc.ReadTimeout = 3 * time.Second
		db, err := open(pc.FormatDSN())
		if err != nil {
			return nil, err
		}
		fs, err := mysql.New(db, &mysql.Config{Table: table})
		if err != nil {
			return nil, err
		}
		rig.Faulty = conformance.Fixture[*sql.Tx]{Store: wrapped[*sql.Tx](fs, wrap), Effect: fx.effect}
		recs = append(recs, rig)
	}
	return recs, nil
}

func sqliteLanes(ctx context.Context, c *closer, lanes int, wrap func(any) any) ([]Recorder, error) {
	dir, err := os.MkdirTemp("", "historycheck")
	if err != nil {
		return nil, err
	}
	c.add(func() { _ = os.RemoveAll(dir) })
	db, err := sqlite.Open(ctx, filepath.Join(dir, "keys.db"))
	if err != nil {
		return nil, err
	}
	c.add(func() { _ = db.Close() })
	s, err := sqlite.New(db, nil)
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		return nil, err
	}
	fx := sqlEffects{db: db, table: "fx"}
	if _, err := db.ExecContext(ctx, "CREATE TABLE fx (tag TEXT)"); err != nil {
		return nil, err
	}
	var recs []Recorder
	for range lanes {
		recs = append(recs, &conformance.HistoryRig[*sql.Tx]{Store: "sqlite",
			Faulty: conformance.Fixture[*sql.Tx]{Store: wrapped[*sql.Tx](s, wrap), Effect: fx.effect},
			Clean:  conformance.Fixture[*sql.Tx]{Store: s, Count: fx.count}})
	}
	return recs, nil
}

// redisLease is the lease of the Redis stores of the histories: a caller
// that died holds its key this long.
const redisLease = 300 * time.Millisecond

func redisLanes(ctx context.Context, c *closer, lanes int, wrap func(any) any) ([]Recorder, error) {
	addr := os.Getenv(envRedis)
	if addr == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoServer, envRedis)
	}
	prefix := name("hist:") + ":"
	fxKey := prefix + "fx"
	client := func(addr string) *goredis.Client {
		cl := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 2 * time.Second, PoolSize: 8, ContextTimeoutEnabled: true})
		c.add(func() { _ = cl.Close() })
		return cl
	}
	clean := client(addr)
	if err := clean.Ping(ctx).Err(); err != nil {
		return nil, err
	}
	cs, err := redis.New(clean, &redis.Config{Prefix: prefix, Lease: redisLease})
	if err != nil {
		return nil, err
	}
	c.add(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = clean.Del(dctx, fxKey).Err()
	})
	count := func(ctx context.Context, tag string) (int, error) {
		n, err := clean.HGet(ctx, fxKey, tag).Int()
		if errors.Is(err, goredis.Nil) {
			return 0, nil
		}
		return n, err
	}
	effect := func(ctx context.Context, tx *redis.Tx, tag string) error {
		return tx.HIncrBy(ctx, fxKey, tag, 1).Err()
	}
	var recs []Recorder
	for range lanes {
		rig := &conformance.HistoryRig[*redis.Tx]{Store: "redis", Clean: conformance.Fixture[*redis.Tx]{Store: cs, Count: count}}
		p, err := proxied(c, addr, rig)
		if err != nil {
			return nil, err
		}
		fs, err := redis.New(client(p.Addr()), &redis.Config{Prefix: prefix, Lease: redisLease})
		if err != nil {
			return nil, err
		}
		rig.Faulty = conformance.Fixture[*redis.Tx]{Store: wrapped[*redis.Tx](fs, wrap), Effect: effect}
		recs = append(recs, rig)
	}
	return recs, nil
}

// quietMySQL stops the MySQL driver's own log lines (a cut connection
// prints "unexpected EOF"): the histories record what the calls got.
func quietMySQL() { _ = gomysql.SetLogger(log.New(io.Discard, "", 0)) }

// Quiet stops the drivers' own log lines, for a command; call it once at
// its start.
func Quiet() { quietMySQL() }
