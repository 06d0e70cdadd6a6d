package clusters

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/mysql"
)

// spread is a KeyStore over the three nodes of a Galera cluster, one
// mysql.Store (and pool) per node, as three service instances behind a
// load balancer would be: each call goes to the next node in turn, or
// always to node pin when pin >= 0. It is also the mysql store's
// backend.Stepper, KeyAdmin and KeyLister, each call of those on the
// next node in the same way: the phases of one operation, an Abandoned
// and the Acquires that follow it, an Inspect or a Forget of a key another
// node holds, all meet on different nodes.
type spread struct {
	stores []*mysql.Store
	pin    int
	next   atomic.Uint64
	// onNode counts the reservations and acquisitions sent to each node.
	onNode [GaleraNodes]atomic.Int64
}

var (
	_ idempotency.KeyStore[*sql.Tx] = (*spread)(nil)
	_ backend.ConflictClassifier    = (*spread)(nil)
	_ backend.Migrator              = (*spread)(nil)
	_ backend.Stepper[*sql.Tx]      = (*spread)(nil)
	_ backend.KeyAdmin              = (*spread)(nil)
	_ backend.KeyLister             = (*spread)(nil)
)

func (s *spread) node() int {
	if s.pin >= 0 {
		return s.pin
	}
	return int(s.next.Add(1) % uint64(len(s.stores)))
}

func (s *spread) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*sql.Tx], *backend.Record, error) {
	i := s.node()
	s.onNode[i].Add(1)
	return s.stores[i].Reserve(ctx, r)
}

// Acquire takes one phase on the next node: the Phase it returns runs
// every statement of that phase there.
func (s *spread) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*sql.Tx], *backend.Record, error) {
	i := s.node()
	s.onNode[i].Add(1)
	return s.stores[i].Acquire(ctx, a)
}

// Abandoned lists the abandoned keys as the next node has them.
func (s *spread) Abandoned(ctx context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	return s.stores[s.node()].Abandoned(ctx, q)
}

// Inspect reads the key on the next node: its probe for an open
// transaction sees only that node's (see mysql.Store.Inspect).
func (s *spread) Inspect(ctx context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	return s.stores[s.node()].Inspect(ctx, key, body)
}

// Forget deletes the key on the next node, which refuses it only if a
// transaction there (a local one, or an applier's) holds its row.
func (s *spread) Forget(ctx context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	return s.stores[s.node()].Forget(ctx, key)
}

// List reads one page on the next node.
func (s *spread) List(ctx context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	return s.stores[s.node()].List(ctx, q)
}

// Stats counts the records on the next node.
func (s *spread) Stats(ctx context.Context) (backend.Stats, error) {
	return s.stores[s.node()].Stats(ctx)
}

func (s *spread) Purge(ctx context.Context, limit int) (int, error) {
	return s.stores[s.node()].Purge(ctx, limit)
}

// IsConflict is the mysql store's: 1213 (a certification failure, or a
// brute-force abort by the replication applier, both reported as
// deadlocks) is retried.
func (s *spread) IsConflict(err error) bool { return s.stores[0].IsConflict(err) }

// Schema is the mysql store's DDL, the same on every node.
func (s *spread) Schema() string { return s.stores[0].Schema() }

// Migrate runs the store's Migrate on the next node, as a service instance
// does at start-up: Galera replicates the DDL to the other nodes (total
// order isolation), and CREATE TABLE IF NOT EXISTS run on several nodes at
// once changes nothing.
func (s *spread) Migrate(ctx context.Context) error { return s.stores[s.node()].Migrate(ctx) }

// galeraFixture is one keys table and one effects table on the cluster,
// with a pool and a Store per node.
type galeraFixture struct {
	table, effects string
	dbs            []*sql.DB
	stores         []*mysql.Store
	count          *sql.DB         // node 1, reads wait for the cluster (wsrep_sync_wait)
	fx             testkit.Effects // on the effects table, counted through count
}

func newGaleraFixture(t testing.TB, g *Galera, maxConns int, dsnExtra string, clock func() time.Time) *galeraFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &galeraFixture{table: testkit.Name("ha_")}
	f.effects = f.table + "_fx"
	for i := range GaleraNodes {
		db, err := mysql.Open(ctx, g.DSN(i, "test")+dsnExtra)
		if err != nil {
			t.Fatal(err)
		}
		if maxConns > 0 {
			db.SetMaxOpenConns(maxConns)
		}
		db.SetMaxIdleConns(max(maxConns, 16))
		t.Cleanup(func() { _ = db.Close() })
		s, err := mysql.New(db, &mysql.Config{Table: f.table, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		f.dbs = append(f.dbs, db)
		f.stores = append(f.stores, s)
	}
	count, err := sql.Open("mysql", g.DSN(0, "test")+"&wsrep_sync_wait=1")
	if err != nil {
		t.Fatal(err)
	}
	f.count = count
	f.fx = testkit.Effects{DB: count, Table: "`" + f.effects + "`", Binary: true}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, tb := range []string{f.table, f.effects} {
			_, _ = count.ExecContext(ctx, "DROP TABLE IF EXISTS `"+tb+"`")
		}
		_ = count.Close()
	})
	if err := f.stores[0].Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Galera wants a primary key on every replicated table.
	if _, err := f.dbs[0].ExecContext(ctx, "CREATE TABLE `"+f.effects+"` (n BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARBINARY(1024) NOT NULL, KEY (tag)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	// DDL returns on node 1 before the other nodes have applied it: a
	// first call there would find no table (1146).
	for i, db := range f.dbs {
		if err := awaitTables(ctx, db, f.table, f.effects); err != nil {
			t.Fatalf("node %d: the fixture's tables, created on node 1: %v", i+1, err)
		}
	}
	return f
}

// erNoSuchTable is ER_NO_SUCH_TABLE.
const erNoSuchTable = 1146

// awaitTables polls db until every table in tables exists there.
func awaitTables(ctx context.Context, db *sql.DB, tables ...string) error {
	for _, tb := range tables {
		for {
			_, err := db.ExecContext(ctx, "SELECT 1 FROM `"+tb+"` LIMIT 0")
			var me *gomysql.MySQLError
			if err == nil {
				break
			}
			if !errors.As(err, &me) || me.Number != erNoSuchTable {
				return fmt.Errorf("table %s: %w", tb, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("table %s still missing: %w (%w)", tb, ctx.Err(), err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

func (f *galeraFixture) spread(pin int) *spread { return &spread{stores: f.stores, pin: pin} }
