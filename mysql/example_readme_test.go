package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/readmekit"
	"github.com/go-idempotency/idempotency/mysql"
)

// readmeQuickStart is the README's MySQL/MariaDB quick start: it opens the
// store on dsn and pays amount once per key.
func readmeQuickStart(ctx context.Context, dsn string, key idempotency.Key, fp string, amount int) (idempotency.Response, error) {
	// readme:begin readme-quickstart-mysql
	db, err := mysql.Open(ctx, dsn) // dsn: "app:secret@tcp(db:3306)/shop" or "mysql://app:secret@db:3306/shop"
	if err != nil {
		return idempotency.Response{}, err
	}
	defer db.Close()
	store, err := mysql.New(db, nil) // InnoDB on MySQL 8.0+ or MariaDB 10.6+; mysql.Config{Table: ...}
	if err != nil {
		return idempotency.Response{}, err
	}
	if err := store.Migrate(ctx); err != nil {
		return idempotency.Response{}, err
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		return idempotency.Response{}, err
	}

	return guard.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
		res, err := tx.ExecContext(ctx, "INSERT INTO payments (amount) VALUES (?)", amount)
		if err != nil {
			return idempotency.Response{}, err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
	})
	// readme:end readme-quickstart-mysql
}

// TestReadmeQuickStart runs the README's quick start in a database of its
// own: one payment for two calls with one key, and the same key with
// another request refused.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	cfg, err := gomysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 30*time.Second)
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	name := testkit.Name("readme_")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	if _, err := admin.ExecContext(ctx, "CREATE TABLE "+name+".payments (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	dsn := cfg.FormatDSN()

	key := idempotency.Key{Scope: "customer-7", ID: "order-42"}
	first := readmekit.CheckQuickStart(t, func(fp string, amount int) (idempotency.Response, error) {
		return readmeQuickStart(ctx, dsn, key, fp, amount)
	})
	var n int
	var maxID sql.NullInt64
	if err := admin.QueryRowContext(ctx, "SELECT count(*), max(id) FROM "+name+".payments").Scan(&n, &maxID); err != nil {
		t.Fatal(err)
	}
	if body := fmt.Sprintf(`{"id":%d}`, maxID.Int64); n != 1 || body != string(first.Body) {
		t.Errorf("%d payments (last %s), want 1 named by the response %s", n, body, first.Body)
	}
}
