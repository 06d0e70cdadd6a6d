package mysql

import (
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestServerClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed, and a purger
// ahead deleted a record completed 0.1s earlier) on the server's clock: on
// every path of the store (look-up first or not, MariaDB's statement bound
// or MySQL's session one, folded or not), with the default Config, no
// statement carries a time of the application, so the instances' clocks
// cannot matter (testkit.ClockOnly).
func TestServerClockOnly(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ctx := testkit.Context(t, 60*time.Second)
			ca := &testkit.ClockArgs{}
			inner, err := gomysql.NewConnector(testConfig(t, func(c *gomysql.Config) { c.InterpolateParams = true }))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(&connector{inner: countingConnector{Connector: inner, n: new(atomic.Int64), seen: ca.SeeNamed}, interpolate: true})
			db.SetMaxOpenConns(4)
			t.Cleanup(func() { _ = db.Close() })
			f := newFixture(t, db, nil)
			testkit.ClockOnly(t, ctx, testkit.ClockOnlyCase[*sql.Tx]{
				Store: newStore(t, db, f.table, p),
				Other: newStore(t, db, f.table, p),
				Clocked: func() idempotency.KeyStore[*sql.Tx] {
					clocked := newStore(t, db, f.table, p)
					clocked.clock = time.Now
					return clocked
				},
				Effect: f.fx.Effect,
				Count:  f.fx.Count,
				Sent:   ca.Sent,
			})
		})
	}
}
