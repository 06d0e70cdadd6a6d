package sqlite_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	sqlitestore "github.com/go-idempotency/idempotency/sqlite"
)

// TestStatementsPerCall counts what each kind of call sends to SQLite
// through database/sql (BEGIN, COMMIT, ROLLBACK, each statement run, each
// prepare), besides fn's one INSERT: SQLite runs in the process, so these
// are function calls rather than round trips, but each costs CPU, and the
// count does not depend on the machine's load.
func TestStatementsPerCall(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	var n counter
	db := sql.OpenDB(countingConnector(t, filepath.Join(t.TempDir(), "count.db")+"?"+sqlitestore.DSNOptions, &n))
	f := newFixture(t, db, 1) // one connection: every statement is prepared on it once
	g := guard(t, f.store, nil)
	gNoWait := guard(t, f.store, &idempotency.Config{WaitTimeout: -1})
	fn := func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201, Body: []byte("ok")}, f.fx.Effect(ctx, tx, "x")
	}
	do := func(g *idempotency.Guard[*sql.Tx], id string) []string {
		t.Helper()
		n.start()
		if _, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", fn); err != nil {
			t.Fatal(err)
		}
		return n.stop()
	}
	// Warm up: prepare every statement on the one connection.
	do(g, "warm")
	do(g, "warm")
	do(gNoWait, "warm-nowait")

	for _, c := range []struct {
		name string
		g    *idempotency.Guard[*sql.Tx]
		id   string
		want []string
	}{
		{"NewKey", g, "new", []string{"query lookup", "begin", "exec reserve", "exec effect", "exec complete", "commit"}},
		{"Replay", g, "new", []string{"query lookup"}},
		{"NewKeyNoWait", gNoWait, "new-nowait", []string{
			"query lookup", "query PRAGMA busy_timeout", "exec PRAGMA busy_timeout = 0", "begin", "exec reserve",
			"exec PRAGMA busy_timeout = 5000", "exec effect", "exec complete", "commit"}},
		// Config.Lookup's default: new keys in a row switch the look-up
		// off (the replay above set the tally at its top, 4; each new key
		// takes 1 off; it looks up while above 0).
		{"NewKeyLookUpStillOn", g, "run-1", []string{"query lookup", "begin", "exec reserve", "exec effect", "exec complete", "commit"}},
		{"NewKeyLookUpStillOn", g, "run-2", []string{"query lookup", "begin", "exec reserve", "exec effect", "exec complete", "commit"}},
		{"NewKeyLookUpStillOn", g, "run-3", []string{"query lookup", "begin", "exec reserve", "exec effect", "exec complete", "commit"}},
		{"NewKeyLookUpOff", g, "run-4", []string{"begin", "exec reserve", "exec effect", "exec complete", "commit"}},
		// A replay then takes the write path, and switches the look-up on.
		{"ReplayLookUpOff", g, "run-4", []string{"begin", "exec reserve", "query read", "rollback"}},
		{"ReplayLookUpOn", g, "run-4", []string{"query lookup"}},
	} {
		if got := do(c.g, c.id); strings.Join(got, "; ") != strings.Join(c.want, "; ") {
			t.Errorf("%s %s: sent %d:\n  %s\nwant %d:\n  %s", c.name, c.id, len(got), strings.Join(got, "\n  "), len(c.want), strings.Join(c.want, "\n  "))
		}
	}
}

// counter records the statements sent while it is started.
type counter struct {
	mu   sync.Mutex
	on   bool
	sent []string
	hook func(name string) // called before each statement runs, and with " done" appended after, if set
	// args, if set, is shown every statement run and its arguments.
	args func(query string, args []driver.NamedValue)
}

// see shows query and args to c.args, if set.
func (c *counter) see(query string, args []driver.NamedValue) {
	c.mu.Lock()
	f := c.args
	c.mu.Unlock()
	if f != nil {
		f(query, args)
	}
}

// setHook sets (or, with nil, removes) the function called with the name
// of each statement before it runs, and with the name and " done" after it
// ran.
func (c *counter) setHook(hook func(name string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = hook
}

func (c *counter) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on, c.sent = true, nil
}

func (c *counter) stop() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	return c.sent
}

// has reports whether the statement name was sent since start.
func (c *counter) has(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.sent, name)
}

// add records one statement, named by what it does: the Store's statements
// by their role, others by their text.
func (c *counter) add(kind, query string) (name string) {
	name = query
	switch {
	case strings.HasPrefix(query, "SELECT fingerprint, status"):
		name = "lookup"
	case strings.HasPrefix(query, "SELECT fingerprint, state"):
		name = "read"
	case strings.HasPrefix(query, "INSERT INTO") && strings.Contains(query, "'pending'"):
		name = "reserve"
	case strings.HasPrefix(query, "INSERT INTO"):
		name = "effect"
	case strings.HasPrefix(query, "UPDATE"):
		name = "complete"
	}
	if kind != "" {
		name = kind + " " + name
	}
	name = strings.TrimSpace(name)
	c.mu.Lock()
	hook := c.hook
	if c.on {
		c.sent = append(c.sent, name)
	}
	c.mu.Unlock()
	if hook != nil {
		hook(name)
	}
	return name
}

// done calls the hook, if set, after the statement name ran.
func (c *counter) done(name string) {
	c.mu.Lock()
	hook := c.hook
	c.mu.Unlock()
	if hook != nil {
		hook(name + " done")
	}
}

// countingConnector opens dsn with modernc.org/sqlite and records in n
// what each connection is sent.
func countingConnector(t *testing.T, dsn string, n *counter) driver.Connector {
	t.Helper()
	inner, err := sqlite.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return connector{inner, n}
}

type connector struct {
	inner driver.Connector
	n     *counter
}

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{dc, c.n}, nil
}

func (c connector) Driver() driver.Driver { return c.inner.Driver() }

// conn forwards to the driver's connection, which implements every
// context interface, and counts.
type conn struct {
	driver.Conn
	n *counter
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.n.add("prepare", query)
	s, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &stmt{s, query, c.n}, nil
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.add("", "begin")
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &tx_{tx, c.n}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.n.add("exec", query)
	c.n.see(query, args)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.n.add("query", query)
	c.n.see(query, args)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *conn) Ping(ctx context.Context) error { return c.Conn.(driver.Pinger).Ping(ctx) }

func (c *conn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *conn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

type tx_ struct {
	driver.Tx
	n *counter
}

func (t *tx_) Commit() error   { t.n.add("", "commit"); return t.Tx.Commit() }
func (t *tx_) Rollback() error { t.n.add("", "rollback"); return t.Tx.Rollback() }

type stmt struct {
	driver.Stmt
	query string
	n     *counter
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	name := s.n.add("exec", s.query)
	s.n.see(s.query, args)
	res, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	s.n.done(name)
	return res, err
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	name := s.n.add("query", s.query)
	s.n.see(s.query, args)
	rows, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	return &rowsDone{rows, func() { s.n.done(name) }}, nil
}

// rowsDone calls done once its rows are closed: a query (such as an
// UPDATE ... RETURNING of the steps) has run by then.
type rowsDone struct {
	driver.Rows
	done func()
}

func (r *rowsDone) Close() error {
	err := r.Rows.Close()
	r.done()
	return err
}

// TestLookupPolicies: what a replay sends under each Config.Lookup, with
// the Store's write turn free, and with it held by a caller of another key
// (its fn blocked): then the look-up comes first under every policy, and
// the replay is answered without waiting for that writer.
func TestLookupPolicies(t *testing.T) {
	bad := openBare(t, filepath.Join(t.TempDir(), "bad.db"))
	t.Cleanup(func() { _ = bad.Close() })
	if _, err := sqlitestore.New(bad, &sqlitestore.Config{Lookup: 99}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("Config.Lookup 99: %v, want ErrInvalidConfig", err)
	}
	writePath := []string{"begin", "exec reserve", "query read", "rollback"}
	lookUp := []string{"query lookup"}
	for _, c := range []struct {
		policy backend.LookupPolicy
		free   []string
	}{
		{backend.LookupNever, writePath},
		{backend.LookupAlways, lookUp},
		// Adaptive after a new key and its replay: the replay came first
		// through the write path (a fresh Store does not look up), and
		// switched the look-up on.
		{backend.LookupAdaptive, lookUp},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			var n counter
			db := sql.OpenDB(countingConnector(t, filepath.Join(t.TempDir(), "count.db")+"?"+sqlitestore.DSNOptions, &n))
			f := newFixture(t, db, 2)
			store, err := sqlitestore.New(db, &sqlitestore.Config{Table: f.table, Lookup: c.policy})
			if err != nil {
				t.Fatal(err)
			}
			g := guard(t, store, nil)
			do := func(id string, fn func(*sql.Tx) (idempotency.Response, error)) (idempotency.Response, []string) {
				t.Helper()
				n.start()
				resp, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", fn)
				sent := n.stop()
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				// Each connection prepares a statement the first time it
				// runs it; that says nothing about the policy.
				return resp, slices.DeleteFunc(sent, func(s string) bool { return strings.HasPrefix(s, "prepare") })
			}
			effect := func(tx *sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{Status: 201, Body: []byte("done")}, f.fx.Effect(ctx, tx, "done")
			}
			do("done", effect)
			do("done", mustNotRun)
			if _, got := do("done", mustNotRun); !slices.Equal(got, c.free) {
				t.Errorf("replay, turn free: sent %q, want %q", got, c.free)
			}

			// Another key's caller holds the write turn, blocked in fn.
			entered, release := make(chan struct{}), make(chan struct{})
			free := sync.OnceFunc(func() { close(release) })
			t.Cleanup(free) // a failing test frees the holder before the fixture checks its connections
			held := make(chan error, 1)
			go func() {
				_, err := g.Do(ctx, idempotency.Key{ID: "slow"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					close(entered)
					<-release
					return idempotency.Response{Status: 201}, f.fx.Effect(ctx, tx, "slow")
				})
				held <- err
			}()
			select {
			case <-entered:
			case err := <-held:
				t.Fatalf("holder ended before its fn ran: %v", err)
			case <-ctx.Done():
				t.Fatalf("holder never ran its fn: %v", ctx.Err())
			}
			resp, got := do("done", mustNotRun)
			free()
			if !slices.Equal(got, lookUp) || string(resp.Body) != "done" {
				t.Errorf("replay, turn held by another key: sent %q, body %q; want %q, %q", got, resp.Body, lookUp, "done")
			}
			if err := <-held; err != nil {
				t.Fatalf("holder: %v", err)
			}
			for _, tag := range []string{"done", "slow"} {
				if got, err := f.fx.Count(ctx, tag); err != nil || got != 1 {
					t.Fatalf("effects %q: %d (%v), want 1", tag, got, err)
				}
			}
		})
	}
}
