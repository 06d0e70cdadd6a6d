package mysql

import (
	"database/sql/driver"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/testkit"
	gomysql "github.com/go-sql-driver/mysql"
)

// TestOpenInterpolates: Open turns interpolateParams on unless the DSN sets
// it, as the server's count of prepared statements shows.
func TestOpenInterpolates(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	base := testConfig(t, nil).FormatDSN()
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	for _, c := range []struct {
		dsn      string
		prepares int64
	}{
		{base, 0},
		{base + sep + "interpolateParams=false", 1},
		{base + sep + "interpolateParams=true", 0},
	} {
		db, err := Open(ctx, c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		prepared := func() int64 {
			var name string
			var n int64
			if err := conn.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := prepared()
		var one int
		if err := conn.QueryRowContext(ctx, "SELECT ?", 1).Scan(&one); err != nil || one != 1 {
			t.Fatalf("SELECT ?: %d, %v", one, err)
		}
		if got := prepared() - before; got != c.prepares {
			t.Errorf("Open(%q): a statement with an argument prepared %d statements, want %d", c.dsn, got, c.prepares)
		}
		_ = conn.Close()
		_ = db.Close()
	}
}

func TestSetsParam(t *testing.T) {
	cases := []struct {
		dsn  string
		want bool
	}{
		{"u@tcp(h:3306)/db", false},
		{"u@tcp(h:3306)/db?interpolateParams=false", true},
		{"u@tcp(h:3306)/db?parseTime=true&interpolateParams=true", true},
		{"u@tcp(h:3306)/db?xinterpolateParams=true", false},
		{"u:pw?interpolateParams=1@tcp(h:3306)/db?parseTime=true", false},
	}
	for _, c := range cases {
		if got := setsParam(c.dsn, "interpolateParams"); got != c.want {
			t.Errorf("setsParam(%q) = %v, want %v", c.dsn, got, c.want)
		}
	}
}

// TestOpenRaw: code that reaches the driver's connection through
// sql.Conn.Raw, as the driver documents for its mysql.Result, still works
// on a pool of Open.
func TestOpenRaw(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	db, err := Open(ctx, testConfig(t, nil).FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		//lint:ignore SA1019 the driver documents this use
		ex, ok := dc.(driver.Execer)
		if !ok {
			return fmt.Errorf("%T is not a driver.Execer", dc)
		}
		res, err := ex.Exec("DO 1", nil)
		if err != nil {
			return err
		}
		if _, ok := res.(gomysql.Result); !ok {
			return fmt.Errorf("result %T is not a mysql.Result", res)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
