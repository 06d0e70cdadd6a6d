package clusters

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/redis"
)

// restartService is one service instance on a Single: a Guard whose calls
// perform one effect each, and a way to count the effects per key.
type restartService struct {
	do     func(ctx context.Context, key idempotency.Key) (idempotency.Response, error)
	counts func(ctx context.Context) (map[string]int, error)
}

// restartLease is the Redis store's lease in the restart test: a
// reservation that was in flight when Redis died is on disk (appendfsync
// always) and holds its key, after the restart, until the lease runs out.
const restartLease = 2 * time.Second

// answer is the response every service gives: the key and a random
// execution id, so that two executions never give the same bytes.
func answer(key idempotency.Key) idempotency.Response {
	return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"key":%q,"execution":%q}`, key.ID, rand.Text()[:12])}
}

func newRestartService(t testing.TB, s *Single) *restartService {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := &idempotency.Config{WaitTimeout: 3 * time.Second}
	switch s.Kind {
	case KindPostgres:
		pool := pgPool(t, ctx, s.PostgresDSN(), 8, 2*time.Second)
		store, err := postgres.New(pool, &postgres.Config{Table: "restart_keys"})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE restart_effects (n BIGSERIAL PRIMARY KEY, key_id TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(store, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return &restartService{
			do: func(ctx context.Context, key idempotency.Key) (idempotency.Response, error) {
				return g.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
					_, err := tx.Exec(ctx, `INSERT INTO restart_effects (key_id) VALUES ($1)`, key.ID)
					return answer(key), err
				})
			},
			counts: func(ctx context.Context) (map[string]int, error) {
				rows, err := pool.Query(ctx, `SELECT key_id, count(*) FROM restart_effects GROUP BY key_id`)
				if err != nil {
					return nil, err
				}
				return collectCounts(func(dst ...any) error { return rows.Scan(dst...) }, rows.Next, rows.Err)
			},
		}
	case KindMariaDB:
		db, err := mysql.Open(ctx, s.MySQLDSN())
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		t.Cleanup(func() { _ = db.Close() })
		store, err := mysql.New(db, &mysql.Config{Table: "restart_keys"})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE restart_effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, key_id VARCHAR(64) NOT NULL) ENGINE=InnoDB`); err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(store, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return &restartService{
			do: func(ctx context.Context, key idempotency.Key) (idempotency.Response, error) {
				return g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					_, err := tx.ExecContext(ctx, `INSERT INTO restart_effects (key_id) VALUES (?)`, key.ID)
					return answer(key), err
				})
			},
			counts: func(ctx context.Context) (map[string]int, error) {
				rows, err := db.QueryContext(ctx, `SELECT key_id, COUNT(*) FROM restart_effects GROUP BY key_id`)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				return collectCounts(rows.Scan, rows.Next, rows.Err)
			},
		}
	case KindRedis:
		client := goredis.NewClient(&goredis.Options{Addr: s.Addr(), DialTimeout: time.Second, PoolSize: 8, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		g := redisGuard(t, client, &redis.Config{Prefix: "restart:", Lease: restartLease}, cfg.WaitTimeout)
		const effects = "restart:effects"
		return &restartService{
			do: func(ctx context.Context, key idempotency.Key) (idempotency.Response, error) {
				return g.Do(ctx, key, "fp", func(tx *redis.Tx) (idempotency.Response, error) {
					tx.HIncrBy(ctx, effects, key.ID, 1)
					return answer(key), nil
				})
			},
			counts: func(ctx context.Context) (map[string]int, error) {
				m, err := client.HGetAll(ctx, effects).Result()
				if err != nil {
					return nil, err
				}
				out := make(map[string]int, len(m))
				for k, v := range m {
					n, err := strconv.Atoi(v)
					if err != nil {
						return nil, err
					}
					out[k] = n
				}
				return out, nil
			},
		}
	}
	t.Fatalf("no service for %s", s.Kind)
	return nil
}

func collectCounts(scan func(...any) error, next func() bool, rerr func() error) (map[string]int, error) {
	out := map[string]int{}
	for next() {
		var id string
		var n int
		if err := scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rerr()
}

// TestRestart crashes a store's server (SIGKILL) while 6 callers run at
// full speed, starts it again on the same port and data, lets the callers
// go on, and then retries every call with its key: every acknowledged
// answer must come back byte for byte (replayed), every key must have
// exactly one effect, and every call that failed meanwhile must have said
// so with idempotency.ErrStore (or its context's error) in the chain.
func TestRestart(t *testing.T) {
	for _, k := range []Kind{KindPostgres, KindMariaDB, KindRedis} {
		t.Run(string(k), func(t *testing.T) { restart(t, k) })
	}
}

func restart(t *testing.T, k Kind) {
	const workers, crashAfter, after = 6, 150, 100
	start := time.Now()
	srv := StartSingle(t, k)
	svc := newRestartService(t, srv)
	booted := time.Since(start)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := newLoad("rs-" + string(k))
	var crash sync.Once
	crashed := make(chan struct{})
	l.start(workers, func(key idempotency.Key) (idempotency.Response, error) {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		return svc.do(cctx, key)
	}, func(n int64) {
		if n == crashAfter {
			crash.Do(func() { srv.Crash(); close(crashed) }) // right after this acknowledged answer, others in flight
		}
	})
	l.waitAcks(t, crashAfter, 30*time.Second)
	<-crashed
	down := time.Now()
	time.Sleep(300 * time.Millisecond) // callers meet the dead server
	srv.Start()
	restarted := time.Since(down)
	l.waitAcks(t, crashAfter+after, 30*time.Second)
	calls := l.stop()

	// Every call that failed said why in a way the caller can act on.
	var failed, untyped int
	for _, c := range calls {
		if c.err == nil {
			continue
		}
		failed++
		if !errors.Is(c.err, idempotency.ErrStore) && !errors.Is(c.err, context.DeadlineExceeded) {
			untyped++
			if untyped <= 3 {
				t.Errorf("a call during the restart failed with an untyped error: %v", c.err)
			}
		}
	}

	// Retry every call with its key; while the pool replaces its dead
	// connections and in-flight reservations end, ErrStore and
	// ErrInProgress are retried.
	var keptAcks, lostAcks, replayedUnacked, executedUnacked, retryErrors int
	for _, c := range calls {
		var resp idempotency.Response
		var err error
		for attempt := 0; ; attempt++ {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err = svc.do(rctx, c.key)
			rcancel()
			if err == nil || attempt == 100 || !(errors.Is(err, idempotency.ErrStore) || errors.Is(err, idempotency.ErrInProgress)) {
				break
			}
			retryErrors++
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("retry of %s after the restart: %v", c.key.ID, err)
		}
		switch {
		case c.acked && !resp.Replayed:
			lostAcks++
		case c.acked && !bytes.Equal(resp.Body, c.body):
			t.Fatalf("key %s: acknowledged %s, replayed %s after the restart", c.key.ID, c.body, resp.Body)
		case c.acked:
			keptAcks++
		case resp.Replayed:
			replayedUnacked++
		default:
			executedUnacked++
		}
	}
	counts, err := svc.counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkEffects(t, counts, calls, "the restart and the retry")
	if lostAcks != 0 {
		t.Errorf("%d acknowledged answers lost in the restart (the retry ran fn again), want 0", lostAcks)
	}
	t.Logf("%s: booted in %v, back %v after the crash; %d calls: %d acknowledged (%d replayed byte-exact after the restart, %d lost), %d failed (%d untyped); unacknowledged retries: %d replayed (committed before the crash), %d executed; %d retries met ErrStore/ErrInProgress first",
		k, booted.Round(time.Millisecond), restarted.Round(time.Millisecond), len(calls), keptAcks+lostAcks, keptAcks, lostAcks,
		failed, untyped, replayedUnacked, executedUnacked, retryErrors)
}
