package mysql

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// clockArgs collects the statement arguments that look like a reading of
// the application's clock: a time.Time, or an integer within a day of now
// in Unix seconds, milliseconds, microseconds or nanoseconds.
type clockArgs struct {
	mu   sync.Mutex
	n    atomic.Int64 // statements seen
	seen []string
}

func (c *clockArgs) see(query string, args []driver.NamedValue) {
	c.n.Add(1)
	now := time.Now()
	near := func(v, unit int64) bool {
		d := v - now.UnixNano()/unit
		return d < int64(24*time.Hour)/unit && d > -int64(24*time.Hour)/unit
	}
	for _, a := range args {
		hit := false
		switch v := a.Value.(type) {
		case time.Time:
			hit = true
		case int64:
			hit = near(v, 1) || near(v, 1e3) || near(v, 1e6) || near(v, 1e9)
		}
		if hit {
			c.mu.Lock()
			c.seen = append(c.seen, fmt.Sprintf("%.50q: %v", query, a.Value))
			c.mu.Unlock()
		}
	}
}

func (c *clockArgs) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen...)
}

// TestServerClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed, and a purger
// ahead deleted a record completed 0.1s earlier) on the server's clock: on
// every path of the store (look-up first or not, MariaDB's statement bound
// or MySQL's session one, folded or not), with the default Config, no
// statement carries a time of the application (new key, replay, a waiter
// on a second Store, takeover of an expired row, Purge), so the instances'
// clocks cannot matter; the waiter replays the holder's answer, one
// effect, and a Purge at once deletes nothing. A Store with Config.Clock
// does send it (the check can fail).
func TestServerClockOnly(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			ctx := testkit.Context(t, 60*time.Second)
			ca := &clockArgs{}
			inner, err := gomysql.NewConnector(testConfig(t, func(c *gomysql.Config) { c.InterpolateParams = true }))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(&connector{inner: countingConnector{Connector: inner, n: new(atomic.Int64), seen: ca.see}, interpolate: true})
			db.SetMaxOpenConns(4)
			t.Cleanup(func() { _ = db.Close() })
			f := newFixture(t, db, nil)
			cfg := &idempotency.Config{TTL: 10 * time.Minute}
			newGuard := func(s *Store, cfg *idempotency.Config) *idempotency.Guard[*sql.Tx] {
				g, err := idempotency.New(s, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			holder, waiter := newGuard(newStore(t, db, f.table, p), cfg), newGuard(newStore(t, db, f.table, p), cfg)
			key := idempotency.Key{ID: "skew"}
			fn := func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Body: []byte("paid")}, f.fx.Effect(ctx, tx, "pay")
			}
			held, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := holder.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					close(held)
					<-release
					return fn(tx)
				})
				done <- err
			}()
			<-held
			type result struct {
				r   idempotency.Response
				err error
			}
			wdone := make(chan result, 1)
			go func() {
				r, err := waiter.Do(ctx, key, "fp", fn)
				wdone <- result{r, err}
			}()
			time.Sleep(300 * time.Millisecond) // the waiter waits on the key's row
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("holder: %v", err)
			}
			if w := <-wdone; w.err != nil || !w.r.Replayed || string(w.r.Body) != "paid" {
				t.Fatalf("waiter on another Store: %+v, %v; want the holder's answer replayed", w.r, w.err)
			}
			time.Sleep(100 * time.Millisecond)
			if n, err := waiter.Purge(ctx); err != nil || n != 0 {
				t.Fatalf("Purge 0.1s after the completion (TTL 10min): deleted %d, %v; want 0", n, err)
			}
			if r, err := holder.Do(ctx, key, "fp", fn); err != nil || !r.Replayed {
				t.Fatalf("retry after Purge: %+v, %v; want replayed", r, err)
			}
			testkit.MustCount(t, ctx, f.fx.Count, "pay", 1)

			// An expired row, on the server's clock: taken over, then purged.
			short := newGuard(newStore(t, db, f.table, p), &idempotency.Config{TTL: time.Millisecond})
			exp := idempotency.Key{ID: "short"}
			for i := range 2 {
				if r, err := short.Do(ctx, exp, "fp", fn); err != nil || r.Replayed {
					t.Fatalf("TTL 1ms, call %d 20ms apart: %+v, %v; want executed", i, r, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if n, err := short.Purge(ctx); err != nil || n != 1 {
				t.Fatalf("Purge of the expired key: %d, %v; want 1", n, err)
			}
			if sent := ca.list(); len(sent) != 0 || ca.n.Load() == 0 {
				t.Fatalf("%d statements, %d arguments like a time of the application, want none: %q", ca.n.Load(), len(sent), sent)
			}

			// The control: a test clock is sent.
			clocked := newStore(t, db, f.table, p)
			clocked.clock = time.Now
			if _, err := newGuard(clocked, nil).Do(ctx, idempotency.Key{ID: "clocked"}, "fp", fn); err != nil {
				t.Fatal(err)
			}
			if len(ca.list()) == 0 {
				t.Fatal("a Store with Config.Clock sent no time: the check sees nothing")
			}
		})
	}
}
