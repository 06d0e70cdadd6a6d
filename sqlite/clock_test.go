package sqlite_test

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	sqlitestore "github.com/go-idempotency/idempotency/sqlite"
)

// clockArgs collects the statement arguments that look like a reading of
// the application's clock: a time.Time, or an integer within a day of now
// in Unix seconds, milliseconds, microseconds or nanoseconds.
type clockArgs struct {
	mu   sync.Mutex
	n    int // statements seen
	seen []string
}

func (c *clockArgs) see(query string, args []driver.NamedValue) {
	now := time.Now()
	near := func(v, unit int64) bool {
		d := v - now.UnixNano()/unit
		return d < int64(24*time.Hour)/unit && d > -int64(24*time.Hour)/unit
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	for _, a := range args {
		hit := false
		switch v := a.Value.(type) {
		case time.Time:
			hit = true
		case int64:
			hit = near(v, 1) || near(v, 1e3) || near(v, 1e6) || near(v, 1e9)
		}
		if hit {
			c.seen = append(c.seen, fmt.Sprintf("%.50q: %v", query, a.Value))
		}
	}
}

func (c *clockArgs) list() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, append([]string(nil), c.seen...)
}

// TestSQLiteClockOnly is the filed report (two instances 2h apart, TTL
// 10min: a waiter ran fn again when the holder committed, and a purger
// ahead deleted a record completed 0.1s earlier) on SQLite's clock: with
// the default Config, no statement of two Stores on two pools of one file
// (as two processes would be) carries a time of the application (new key,
// replay, a waiter on the other Store, takeover of an expired row, Purge);
// the waiter replays the holder's answer, one effect, and a Purge at once
// deletes nothing. A Store with Config.Clock does send it (the check can
// fail).
func TestSQLiteClockOnly(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	ca := &clockArgs{}
	n := &counter{args: ca.see}
	path := filepath.Join(t.TempDir(), "clock.db") + "?" + sqlitestore.DSNOptions
	f := newFixture(t, sql.OpenDB(countingConnector(t, path, n)), 0)
	db2 := sql.OpenDB(countingConnector(t, path, n))
	t.Cleanup(func() { _ = db2.Close() })
	other, err := sqlitestore.New(db2, &sqlitestore.Config{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &idempotency.Config{TTL: 10 * time.Minute}
	holder, waiter := guard(t, f.store, cfg), guard(t, other, cfg)
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
	time.Sleep(300 * time.Millisecond) // the waiter waits for the write lock
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

	// An expired row, on SQLite's clock: taken over, then purged.
	short := guard(t, f.store, &idempotency.Config{TTL: time.Millisecond})
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
	if stmts, sent := ca.list(); len(sent) != 0 || stmts == 0 {
		t.Fatalf("%d statements, %d arguments like a time of the application, want none: %q", stmts, len(sent), sent)
	}

	// The control: a test clock is sent.
	clocked, err := sqlitestore.New(db2, &sqlitestore.Config{Table: f.table, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := guard(t, clocked, nil).Do(ctx, idempotency.Key{ID: "clocked"}, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if _, sent := ca.list(); len(sent) == 0 {
		t.Fatal("a Store with Config.Clock sent no time: the check sees nothing")
	}
}
