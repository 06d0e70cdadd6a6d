package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/readmekit"
	"github.com/go-idempotency/idempotency/mysql"
)

// A payment handler's core: the payment row and the idempotency key commit
// together. (Needs a server, so it is compiled but not run.)
func Example() {
	ctx := context.Background()
	db, err := mysql.Open(ctx, "app:secret@tcp(127.0.0.1:3306)/shop?interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := mysql.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	key := idempotency.Key{Scope: "customer-42", ID: "3f2c1b9e-7a61-4a3f-9d1e-5b0c8e2f4a77"}
	fp := idempotency.Fingerprint([]byte("POST /payments"), []byte(`{"amount":100}`))
	resp, err := guard.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (customer, amount) VALUES (?, ?)", 42, 100); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"status":"paid"}`)}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, resp.Replayed)
}

func ExampleSchema() {
	ddl, err := mysql.Schema("idempotency_keys")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS `idempotency_keys` (
	//   scope       VARBINARY(255) NOT NULL,
	//   id          VARBINARY(255) NOT NULL,
	//   fingerprint VARBINARY(255) NOT NULL,
	//   state       VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
	//   status      INT NOT NULL DEFAULT 0,
	//   header      LONGBLOB NULL,
	//   body        LONGBLOB NULL,
	//   created_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',
	//   expires_at  BIGINT NOT NULL COMMENT 'Unix nanoseconds',
	//   progress    MEDIUMBLOB NULL,
	//   owner       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
	//   lease_ends  BIGINT NULL COMMENT 'Unix nanoseconds',
	//   tries       INT NOT NULL DEFAULT 0,
	//   PRIMARY KEY (scope, id),
	//   KEY expires_at_idx (expires_at),
	//   KEY lease_ends_idx (lease_ends)
	// ) ENGINE=InnoDB
}

func ExampleParseDSN() {
	for _, dsn := range []string{
		"app@tcp(db:3306)/shop?interpolateParams=true",
		"mysql://app:secret@db/shop?parseTime=true",
		"app@tcp(db:3306)/shop?autocommit=0",
	} {
		_, err := mysql.ParseDSN(dsn)
		fmt.Println(err == nil)
	}
	// Output:
	// true
	// true
	// false
}

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
