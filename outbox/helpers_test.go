package outbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

const requireAllEnv = "IDEMPOTENCY_REQUIRE_ALL"

// env returns the variable's value, or skips the test (fails it when
// IDEMPOTENCY_REQUIRE_ALL=1) when it is unset.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// db is one database under test: an outbox, a guard on the same database,
// and counters of the effect table "<outbox>_effects" and of the outbox.
type db struct {
	name    string
	ob      *outbox.Outbox
	newRely func(pub outbox.Publisher, cfg *outbox.RelayConfig) (*outbox.Relay, error)
	// do runs guard.Do with an effect (one row in the effects table) and
	// the events written through the same tx; fail makes fn fail after
	// writing them.
	do func(ctx context.Context, key idempotency.Key, fp string, events []outbox.Event, fail error) (idempotency.Response, error)
	// count runs a COUNT(*) query.
	count func(ctx context.Context, query string) int
	// exec runs a statement outside any transaction.
	exec func(ctx context.Context, query string) error
	// q quotes a table name.
	q func(string) string
}

func newPostgres(t *testing.T, maxConns int32) *db {
	dsn := testenv.PostgresDSN(t)
	ctx := testCtx(t, time.Minute)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := testkit.Name("outbox_")
	ob, err := outbox.New(outbox.Postgres, &outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.MigratePgx(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(pool, &postgres.Config{Table: table + "_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE "`+table+`_effects" (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tag TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, s := range []string{"", "_keys", "_effects"} {
			if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "`+table+s+`"`); err != nil {
				t.Errorf("drop %s%s: %v", table, s, err)
			}
		}
	})
	guard, err := idempotency.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &db{
		name: "postgres",
		ob:   ob,
		newRely: func(pub outbox.Publisher, cfg *outbox.RelayConfig) (*outbox.Relay, error) {
			return outbox.NewRelay(ob, pool, pub, cfg)
		},
		do: func(ctx context.Context, key idempotency.Key, fp string, events []outbox.Event, fail error) (idempotency.Response, error) {
			return guard.Do(ctx, key, fp, func(tx pgx.Tx) (idempotency.Response, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO "`+table+`_effects" (tag) VALUES ($1)`, key.ID); err != nil {
					return idempotency.Response{}, err
				}
				if err := ob.Write(ctx, tx, events...); err != nil {
					return idempotency.Response{}, err
				}
				if fail != nil {
					return idempotency.Response{}, fail
				}
				return idempotency.Response{Status: 201, Body: []byte(key.ID)}, nil
			})
		},
		count: func(ctx context.Context, query string) int {
			var n int
			if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
			return n
		},
		exec: func(ctx context.Context, query string) error {
			_, err := pool.Exec(ctx, query)
			return err
		},
		q: func(s string) string { return `"` + s + `"` },
	}
}

// newSQL builds the db of a database/sql store: mysql or sqlite.
func newSQL(t *testing.T, dialect outbox.Dialect) *db {
	ctx := testCtx(t, time.Minute)
	table := testkit.Name("outbox_")
	var (
		sdb   *sql.DB
		store idempotency.KeyStore[*sql.Tx]
		q     func(string) string
		ph    = "?"
		err   error
	)
	switch dialect {
	case outbox.MySQL:
		sdb, err = mysql.Open(ctx, testenv.MySQLDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		sdb.SetMaxOpenConns(8)
		s, err := mysql.New(sdb, &mysql.Config{Table: table + "_keys"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		store = s
		q = func(s string) string { return "`" + s + "`" }
	case outbox.SQLite:
		sdb, err = sqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := sqlite.New(sdb, &sqlite.Config{Table: table + "_keys"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		store = s
		q = func(s string) string { return `"` + s + `"` }
	}
	t.Cleanup(func() { _ = sdb.Close() })
	ob, err := outbox.New(dialect, &outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx, sdb); err != nil {
		t.Fatal(err)
	}
	auto := "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"
	if dialect == outbox.SQLite {
		auto = "INTEGER PRIMARY KEY"
	}
	if _, err := sdb.ExecContext(ctx, `CREATE TABLE `+q(table+"_effects")+` (id `+auto+`, tag VARCHAR(255) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if dialect == outbox.MySQL {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, s := range []string{"", "_keys", "_effects"} {
				if _, err := sdb.ExecContext(ctx, "DROP TABLE IF EXISTS "+q(table+s)); err != nil {
					t.Errorf("drop %s%s: %v", table, s, err)
				}
			}
		})
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &db{
		name: dialect.String(),
		ob:   ob,
		newRely: func(pub outbox.Publisher, cfg *outbox.RelayConfig) (*outbox.Relay, error) {
			return outbox.NewSQLRelay(ob, sdb, pub, cfg)
		},
		do: func(ctx context.Context, key idempotency.Key, fp string, events []outbox.Event, fail error) (idempotency.Response, error) {
			return guard.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+q(table+"_effects")+` (tag) VALUES (`+ph+`)`, key.ID); err != nil {
					return idempotency.Response{}, err
				}
				if err := ob.WriteSQL(ctx, tx, events...); err != nil {
					return idempotency.Response{}, err
				}
				if fail != nil {
					return idempotency.Response{}, fail
				}
				return idempotency.Response{Status: 201, Body: []byte(key.ID)}, nil
			})
		},
		count: func(ctx context.Context, query string) int {
			var n int
			if err := sdb.QueryRowContext(ctx, query).Scan(&n); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
			return n
		},
		exec: func(ctx context.Context, query string) error {
			_, err := sdb.ExecContext(ctx, query)
			return err
		},
		q: q,
	}
}

// recorder is a Publisher that records every message it is given.
type recorder struct {
	mu      sync.Mutex
	msgs    []outbox.Message
	batches [][]int64
}

func (r *recorder) Publish(_ context.Context, msgs []outbox.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	seqs := make([]int64, len(msgs))
	for i, m := range msgs {
		seqs[i] = m.Seq
	}
	r.msgs = append(r.msgs, msgs...)
	r.batches = append(r.batches, seqs)
	return nil
}

func (r *recorder) byID() map[string][]outbox.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string][]outbox.Message{}
	for _, msg := range r.msgs {
		m[msg.MsgID] = append(m[msg.MsgID], msg)
	}
	return m
}
