package main

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/sqlite"
)

// runCmd runs the command with args under a deadline and returns its exit
// status and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code = run(ctx, args, &out, &errb)
	t.Logf("idemcheck %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out.String(), errb.String())
	return code, out.String(), errb.String()
}

// checkLibraryRow asserts exit 0 and the expected row for the library (one payment, 20 identical 201s, 422).
func checkLibraryRow(t *testing.T, store string, n, code int, stdout string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	want := "| this library (" + store + ") | 1 | " + strconv.Itoa(n) + " x 201, same payment | 422 |\n"
	if !strings.Contains(stdout, want) {
		t.Errorf("stdout has no line %q", want)
	}
	if !strings.Contains(stdout, "\n| naive check-then-write | ") {
		t.Errorf("stdout has no naive row")
	}
	if !strings.Contains(stdout, "This library: 1 executed, "+strconv.Itoa(n-1)+" replayed.") {
		t.Errorf("stdout does not say 1 executed, %d replayed", n-1)
	}
}

func TestDefaultSQLite(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	code, stdout, _ := runCmd(t)
	checkLibraryRow(t, "sqlite", 20, code, stdout)
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("temporary directory not removed: %s holds %v", tmp, left)
	}
}

// TestTimeoutCleansUp: a run that cannot finish in time fails with exit
// status 1 and still removes its temporary database.
func TestTimeoutCleansUp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	code, stdout, stderr := runCmd(t, "-timeout", "1ns")
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if stdout != "" || !strings.Contains(stderr, "deadline exceeded") {
		t.Errorf("want no table and a deadline error; got stdout %q, stderr %q", stdout, stderr)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("temporary directory not removed: %s holds %v", tmp, left)
	}
}

func TestSQLiteFileAndFewCallers(t *testing.T) {
	t.Parallel()
	// A database the user already has keeps its data and loses only the
	// run's tables.
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE app_data (x INTEGER); INSERT INTO app_data VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := runCmd(t, "-store", "sqlite:"+path, "-n", "3")
	checkLibraryRow(t, "sqlite", 3, code, stdout)
	var tables, x int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM sqlite_schema WHERE name LIKE 'idemcheck%'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d idemcheck tables or indexes left in %s, want 0", tables, path)
	}
	if err := db.QueryRowContext(t.Context(), `SELECT x FROM app_data`).Scan(&x); err != nil || x != 7 {
		t.Errorf("app_data: got %d, %v; want 7", x, err)
	}

	// A database file the run created is removed.
	dir := t.TempDir()
	code, stdout, _ = runCmd(t, "-store", filepath.Join(dir, "new.db"), "-n", "2")
	checkLibraryRow(t, "sqlite", 2, code, stdout)
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the database the run created was not removed: %s holds %v", dir, left)
	}
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	ctx := testkit.Context(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	countTables := func() int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'idemcheck\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := countTables()
	for _, name := range []string{"postgres", "postgres+sql"} { // the store on pgx, then on database/sql
		store := dsn
		if name == "postgres+sql" {
			store = strings.Replace(dsn, "://", "+sql://", 1)
		}
		code, stdout, _ := runCmd(t, "-store", store)
		checkLibraryRow(t, name, 20, code, stdout)
		if after := countTables(); after != before {
			t.Errorf("%s: idemcheck tables: %d before the run, %d after, want them dropped", name, before, after)
		}
	}
}

func TestMySQL(t *testing.T) {
	t.Parallel()
	dsn := testenv.MySQLDSN(t)
	ctx := testkit.Context(t, 30*time.Second)
	db, err := mysql.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	countTables := func() int {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'idemcheck\\_%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := countTables()
	code, stdout, _ := runCmd(t, "-store", dsn)
	checkLibraryRow(t, "mysql", 20, code, stdout)
	// The same server as a mysql:// URL.
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u := &url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd == "" {
		u.User = url.User(cfg.User)
	}
	code, stdout, _ = runCmd(t, "-store", u.String(), "-n", "5")
	checkLibraryRow(t, "mysql", 5, code, stdout)
	if after := countTables(); after != before {
		t.Errorf("idemcheck tables: %d before the runs, %d after, want them dropped", before, after)
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	ctx := testkit.Context(t, 30*time.Second)
	// Database 5, of this test alone: the secrets test runs idemcheck on
	// database 0 at the same time, and its keys would count here.
	client := goredis.NewClient(&goredis.Options{Addr: addr, DB: 5})
	defer client.Close()
	countKeys := func() int {
		keys, err := client.Keys(ctx, "idemcheck:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	before := countKeys()
	code, stdout, _ := runCmd(t, "-store", "redis://"+addr+"/5")
	checkLibraryRow(t, "redis", 20, code, stdout)
	if !strings.Contains(stdout, "Redis: the key and an effect in another store are never committed together") {
		t.Errorf("stdout does not state the Redis limit")
	}
	if after := countKeys(); after != before {
		t.Errorf("idemcheck keys: %d before the run, %d after, want them deleted", before, after)
	}
}

func TestBadArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-bogus"},
		{"-n", "0"},
		{"-n", "1001"},
		{"-n", "x"},
		{"-timeout", "0s"},
		{"extra"},
		{"-store", "ftp://host/db"},
		{"-store", "postgres://user@host:notaport/db"},
		{"-store", "mysql://root@127.0.0.1:3306/"},
		{"-store", "mysql://root@127.0.0.1:3306/test?parseTime=maybe"},
		{"-store", "redis://127.0.0.1:6379/notadb"},
		{"-store", "sqlite:"},
		{"-store", "root@tcp(127.0.0.1:3306)/"},
		{"-store", "root@tcp(127.0.0.1:3306)/test?autocommit=0"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, &out, &errb)
		if code != 2 {
			t.Errorf("%q: exit status %d, want 2", args, code)
		}
		if out.Len() != 0 {
			t.Errorf("%q: wrote to stdout: %q", args, out.String())
		}
		if errb.Len() == 0 {
			t.Errorf("%q: no message on stderr", args)
		}
	}
}

// TestLibraryProblems checks that every deviation from the expected row makes
// the command fail.
func TestLibraryProblems(t *testing.T) {
	t.Parallel()
	body := paymentBody("7", amount)
	good := func() outcome {
		return outcome{
			replies:  []reply{{status: 201, body: body}, {status: 201, body: body, replayed: true}},
			payments: []string{"7"},
			second:   reply{err: idempotency.ErrMismatch},
			after:    1,
		}
	}
	if p := libraryProblems(good()); len(p) != 0 {
		t.Fatalf("the expected row: problems %q, want none", p)
	}
	for name, spoil := range map[string]func(*outcome){
		"two payments":      func(o *outcome) { o.payments = []string{"7", "8"}; o.after = 2 },
		"no payment":        func(o *outcome) { o.payments = nil; o.after = 0 },
		"a caller failed":   func(o *outcome) { o.replies[1] = reply{err: errors.New("boom")} },
		"a 409":             func(o *outcome) { o.replies[1] = reply{status: 409, body: body} },
		"bodies differ":     func(o *outcome) { o.replies[1].body = paymentBody("8", amount) },
		"body names other":  func(o *outcome) { o.payments = []string{"9"}; o.after = 1 },
		"second accepted":   func(o *outcome) { o.second = reply{status: 201, body: body} },
		"second failed":     func(o *outcome) { o.second = reply{err: idempotency.ErrInProgress} },
		"second paid again": func(o *outcome) { o.after = 2 },
	} {
		o := good()
		o.replies = append([]reply(nil), o.replies...)
		spoil(&o)
		if p := libraryProblems(o); len(p) == 0 {
			t.Errorf("%s: no problem reported", name)
		}
	}
}

func TestResponsesCell(t *testing.T) {
	t.Parallel()
	a, b := paymentBody("1", amount), paymentBody("2", amount)
	for _, tc := range []struct {
		replies []reply
		want    string
	}{
		{[]reply{{status: 201, body: a}, {status: 201, body: a}}, "2 x 201, same payment"},
		{[]reply{{status: 201, body: a}, {status: 201, body: b}}, "2 x 201, 2 different payments"},
		{[]reply{{status: 201, body: a}, {err: errors.New("x\n|y")}, {err: errors.New("z")}}, "1 x 201, same payment; 2 errors: x /y"},
		{[]reply{{err: errors.New("z")}}, "1 error: z"},
	} {
		if got := responsesCell(tc.replies); got != tc.want {
			t.Errorf("responsesCell = %q, want %q", got, tc.want)
		}
	}
}
