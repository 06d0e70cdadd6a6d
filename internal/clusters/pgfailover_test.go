package clusters

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/postgres"
)

// pgService is one service instance on a PostgreSQL server: its pool, its
// Store and Guard, and the effect fn its calls run. With viaSQL the Guard's
// store is the one on database/sql (postgres.NewDB, pgx's stdlib driver),
// its fn on the *sql.Tx; the pool only counts the effects.
type pgService struct {
	pool  *pgxpool.Pool
	guard *idempotency.Guard[pgx.Tx]
	sql   *idempotency.Guard[*sql.Tx] // with viaSQL, instead of guard
}

const pgEffects = "ha_effects"

// pgPool opens a pool of up to maxConns connections to dsn, each dial
// bounded by connectTimeout (0: pgx's default), closed in t.Cleanup.
func pgPool(t testing.TB, ctx context.Context, dsn string, maxConns int32, connectTimeout time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	if connectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newPGService(t testing.TB, dsn string, migrate, viaSQL bool) *pgService {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool := pgPool(t, ctx, dsn, 12, 0)
	store, err := postgres.New(pool, &postgres.Config{Table: "ha_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if migrate { // the same table for both stores
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE `+pgEffects+` (n BIGSERIAL PRIMARY KEY, key_id TEXT NOT NULL, execution TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &idempotency.Config{WaitTimeout: 5 * time.Second}
	if viaSQL {
		db := stdlib.OpenDB(*pool.Config().ConnConfig)
		db.SetMaxOpenConns(12)
		t.Cleanup(func() { _ = db.Close() })
		dbStore, err := postgres.NewDB(db, &postgres.Config{Table: "ha_keys"})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.New(dbStore, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return &pgService{pool: pool, sql: g}
	}
	g, err := idempotency.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &pgService{pool: pool, guard: g}
}

// do runs one payment-like call: one effect row written through tx, an
// answer naming this execution.
func (s *pgService) do(ctx context.Context, key idempotency.Key) (idempotency.Response, error) {
	const insert = `INSERT INTO ` + pgEffects + ` (key_id, execution) VALUES ($1, $2)`
	answer := func(exec string) idempotency.Response {
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"key":%q,"execution":%q}`, key.ID, exec)}
	}
	if s.sql != nil {
		return s.sql.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			exec := rand.Text()[:12]
			if _, err := tx.ExecContext(ctx, insert, key.ID, exec); err != nil {
				return idempotency.Response{}, err
			}
			return answer(exec), nil
		})
	}
	return s.guard.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		exec := rand.Text()[:12]
		if _, err := tx.Exec(ctx, insert, key.ID, exec); err != nil {
			return idempotency.Response{}, err
		}
		return answer(exec), nil
	})
}

// checkOneEffectEach fails t unless every key of calls has exactly one
// effect row on the (promoted) server.
func (s *pgService) checkOneEffectEach(t testing.TB, calls []*call) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT key_id, count(*) FROM `+pgEffects+` GROUP BY key_id`)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int
	}, error) {
		var v struct {
			id string
			n  int
		}
		err := r.Scan(&v.id, &v.n)
		return v, err
	})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]int{}
	for _, c := range counts {
		byKey[c.id] = c.n
	}
	checkEffects(t, byKey, calls, "failover and retry")
}

// TestPostgresFailover runs calls on a primary, kills it (SIGKILL, the
// replication link cut) right after acknowledged commits, promotes the
// standby and retries every call with the same key there. Natural: the
// kill lands while 8 callers run at full speed. Lagging: the replication
// link is stalled first, so that the commits acknowledged afterwards exist
// only on the primary. DatabaseSQL runs each on the store on database/sql.
func TestPostgresFailover(t *testing.T) {
	for _, viaSQL := range []bool{false, true} {
		for _, c := range []struct {
			name      string
			sync, lag bool
		}{
			{"Sync/Natural", true, false},
			{"Sync/LaggingStandby", true, true},
			{"Async/Natural", false, false},
			{"Async/LaggingStandby", false, true},
		} {
			name := c.name
			if viaSQL {
				name = "DatabaseSQL/" + name
			}
			t.Run(name, func(t *testing.T) { pgFailover(t, c.sync, c.lag, viaSQL) })
		}
	}
}

func pgFailover(t *testing.T, syncRep, lag, viaSQL bool) {
	const workers, killAfter = 8, 300
	pair := StartPostgres(t, syncRep)
	primary := newPGService(t, pair.PrimaryDSN("test"), true, viaSQL)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := newLoad("pg")
	var kill sync.Once
	killNow := func() { kill.Do(pair.KillPrimary) }
	l.start(workers, func(k idempotency.Key) (idempotency.Response, error) { return primary.do(ctx, k) }, func(n int64) {
		if !lag && n == killAfter {
			killNow() // right after this acknowledged commit, others in flight
		}
	})
	l.waitAcks(t, killAfter, 60*time.Second)
	var acksBeforeStall int64
	if lag {
		l.stalled.Store(true)
		pair.Link.Partition(0)
		acksBeforeStall = l.acks.Load()
		time.Sleep(500 * time.Millisecond)
		killNow()
	}
	calls := l.stop()
	stalledAcks := l.acks.Load() - acksBeforeStall
	pair.Promote()

	standby := newPGService(t, pair.StandbyDSN("test"), false, viaSQL)
	s := retryAll(t, calls, func(k idempotency.Key) (idempotency.Response, error) { return standby.do(ctx, k) })
	t.Logf("sync=%v lag=%v: %v", syncRep, lag, s)
	standby.checkOneEffectEach(t, calls)

	switch {
	case syncRep:
		if s.lostAcks != 0 {
			t.Fatalf("synchronous replication: %d acknowledged answers lost in the failover, want 0", s.lostAcks)
		}
		if lag && s.ackedAfterStall != 0 {
			t.Fatalf("synchronous replication: %d calls started after the standby stalled were acknowledged, want 0", s.ackedAfterStall)
		}
	case lag:
		if s.ackedAfterStall == 0 || s.lostAfterStall != s.ackedAfterStall {
			t.Fatalf("asynchronous replication, stalled standby: %d of %d acknowledged answers started after the stall were lost; want all of them, and more than 0",
				s.lostAfterStall, s.ackedAfterStall)
		}
		t.Logf("asynchronous replication: %d answers acknowledged while the standby lagged (%v), all lost; every retry ran fn again", stalledAcks, 500*time.Millisecond)
	}
}
