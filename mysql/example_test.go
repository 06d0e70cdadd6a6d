package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"

	"github.com/go-idempotency/idempotency"
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
	//   PRIMARY KEY (scope, id),
	//   KEY expires_at_idx (expires_at)
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
