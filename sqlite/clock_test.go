package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	sqlitestore "github.com/go-idempotency/idempotency/sqlite"
)

// TestServerClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed, and a purger
// ahead deleted a record completed 0.1s earlier) on SQLite's clock: with
// the default Config, no statement of two Stores on two pools of one file
// (as two processes would be) carries a time of the application
// (testkit.ClockOnly).
func TestServerClockOnly(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	ca := &testkit.ClockArgs{}
	n := &counter{args: ca.SeeNamed}
	path := filepath.Join(t.TempDir(), "clock.db") + "?" + sqlitestore.DSNOptions
	f := newFixture(t, sql.OpenDB(countingConnector(t, path, n)), 0)
	db2 := sql.OpenDB(countingConnector(t, path, n))
	t.Cleanup(func() { _ = db2.Close() })
	store := func(cfg *sqlitestore.Config) idempotency.KeyStore[*sql.Tx] {
		s, err := sqlitestore.New(db2, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	testkit.ClockOnly(t, ctx, testkit.ClockOnlyCase[*sql.Tx]{
		Store: f.store,
		Other: store(&sqlitestore.Config{Table: f.table}),
		Clocked: func() idempotency.KeyStore[*sql.Tx] {
			return store(&sqlitestore.Config{Table: f.table, Clock: time.Now})
		},
		Effect: f.fx.Effect,
		Count:  f.fx.Count,
		Sent:   ca.Sent,
	})
}
