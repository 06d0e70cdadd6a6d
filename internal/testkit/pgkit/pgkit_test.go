package pgkit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// recordT runs cleanups on demand and records errors.
type recordT struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	errs     []string
}

func (r *recordT) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *recordT) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordT) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestDropAtCleanup(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx := testkit.Context(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	a, b, schema := testkit.Name("pgkit_"), testkit.Name("pgkit_"), testkit.Name("pgkit_s_")
	if _, err := conn.Exec(ctx, "CREATE TABLE "+a+" (x INT); CREATE TABLE "+b+" (x INT); CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".t (x INT)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // in case DropAtCleanup fails
		_, _ = conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+a+", "+b+"; DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	})
	exists := func(q, name string) bool {
		var n int
		if err := conn.QueryRow(ctx, q, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	const tableQ, schemaQ = `SELECT count(*) FROM pg_tables WHERE tablename = $1`, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`

	rt := &recordT{}
	DropAtCleanup(rt, dsn, "TABLE", a, b, testkit.Name("pgkit_never_"))
	DropAtCleanup(rt, dsn, "SCHEMA", schema)
	if !exists(tableQ, a) || !exists(schemaQ, schema) {
		t.Fatal("dropped before cleanup")
	}
	rt.cleanup()
	if len(rt.errs) != 0 {
		t.Fatalf("errors: %q", rt.errs)
	}
	if exists(tableQ, a) || exists(tableQ, b) || exists(schemaQ, schema) {
		t.Fatal("still there after cleanup")
	}

	rt = &recordT{}
	DropAtCleanup(rt, dsn, "TABLE", "not a name")
	rt.cleanup()
	if len(rt.errs) != 1 || !strings.HasPrefix(rt.errs[0], "drop TABLE not a name: ") {
		t.Fatalf("a failed drop: errors %q", rt.errs)
	}
}
