package mysql_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/mysql"
)

// faultIdleTimeout is how long the fault fixtures' sessions may sit idle
// (idle_transaction_timeout on MariaDB, wait_timeout on MySQL) before the
// server ends them: a session whose client vanished behind a partition (the
// server never sees the connection close) holds its key until then. Without
// it the key stays held for wait_timeout, 8 hours by default, or until TCP
// keepalives notice.
const faultIdleTimeout = 2 * time.Second

// TestFaults runs the fault-injection suite (a cut connection, a lost
// reply, a partition and a slow step at every round trip of a call) on a
// warm and on a cold pool: see conformance.RunFaultsWarmAndCold.
func TestFaults(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	upstream := cfg.Addr
	idle := faultIdleParam(t, cfg)
	conformance.RunFaultsWarmAndCold(t, conformance.FaultHarness[*sql.Tx]{
		Upstream: upstream,
		NewFixture: func(t testing.TB, addr, ns string) conformance.Fixture[*sql.Tx] {
			return faultFixture(t, cfg, addr, ns, idle, addr == upstream)
		},
		CallTimeout:    time.Second,
		Bound:          3 * time.Second,
		PartitionBound: faultIdleTimeout + 1500*time.Millisecond,
	})
}

// faultIdleParam returns the session variable that ends a session idle in a
// transaction: MariaDB's idle_transaction_timeout, else (MySQL) the
// wait_timeout of every idle session.
func faultIdleParam(t *testing.T, cfg *gomysql.Config) string {
	t.Helper()
	db, err := mysql.Open(testkit.Context(t, 30*time.Second), cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(version, "MariaDB") {
		return "idle_transaction_timeout"
	}
	return "wait_timeout"
}

// faultFixture is a store on table faults_<ns> and an effects table
// faults_<ns>_fx, on a pool that dials addr. The fixture on the server
// itself (owner) creates and drops both tables.
func faultFixture(t testing.TB, base *gomysql.Config, addr, ns, idle string, owner bool) conformance.Fixture[*sql.Tx] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := base.Clone()
	cfg.Addr, cfg.Net = addr, "tcp"
	cfg.Timeout = 2 * time.Second
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params[idle] = strconv.Itoa(int(faultIdleTimeout.Seconds()))
	db, err := mysql.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(faultIdleTimeout / 2) // wait_timeout: never reuse a session the server may have ended
	table := "faults_" + ns
	effects := "`" + table + "_fx`"
	store, err := mysql.New(db, &mysql.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if owner {
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+effects+" (n BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARCHAR(64) NOT NULL) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if owner {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+effects+", `"+table+"`")
		}
		_ = db.Close()
	})
	fx := testkit.Effects{DB: db, Table: effects}
	return conformance.Fixture[*sql.Tx]{Store: store, Effect: fx.Effect, Count: fx.Count}
}
