// Command sqlx shows sqlx (github.com/jmoiron/sqlx) writing inside the
// transaction that holds an idempotency key. sqlx binds the statement
// (sqlx.Named, db.Rebind) and it runs on the *sql.Tx that Guard.Do gives fn,
// so the order row, the key and the stored response
// commit together, and an error from fn rolls back all three.
//
// It runs on the stores that give fn a *sql.Tx: SQLite (the sqlite store),
// MySQL or MariaDB (the mysql store) and PostgreSQL (the postgres store on
// database/sql, postgres.NewDB, with pgx's stdlib driver). Only the store's
// construction differs: placeOrder is the same on all three.
//
//	go run . -store app.db
//	go run . -store 'mysql:root@tcp(127.0.0.1:3306)/test'
//	go run . -store 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// Order is one order row.
type Order struct {
	ID       string `db:"id"`
	Customer string `db:"customer"`
	Amount   int64  `db:"amount"`
}

// errDeclined is what placeOrder's check returns for a refused order.
var errDeclined = errors.New("order declined")

// readme:begin orm-sqlx
// placeOrder creates one order under key. check runs after the insert, in
// the same transaction: an error from it rolls back the order and the key.
func placeOrder(ctx context.Context, g *idempotency.Guard[*sql.Tx], db *sqlx.DB, table string, key idempotency.Key,
	order Order, check func(Order) error) (idempotency.Response, error) {
	fp := idempotency.Fingerprint([]byte(order.ID), []byte(order.Customer), fmt.Append(nil, order.Amount))
	return g.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
		// sqlx binds the struct's fields; the statement runs on the guard's tx.
		q, args, err := sqlx.Named("INSERT INTO "+table+" (id, customer, amount) VALUES (:id, :customer, :amount)", order)
		if err != nil {
			return idempotency.Response{}, err
		}
		if _, err := tx.ExecContext(ctx, db.Rebind(q), args...); err != nil {
			return idempotency.Response{}, err
		}
		if err := check(order); err != nil {
			return idempotency.Response{}, err // rolls back the order and the key
		}
		return idempotency.Response{Status: http.StatusCreated, Body: fmt.Appendf(nil, `{"order":%q}`, order.ID)}, nil
	})
}

// readme:end orm-sqlx

func main() {
	store := flag.String("store", "app.db", "SQLite file, mysql:DSN or a postgres:// URL")
	flag.Parse()
	ctx := context.Background()
	a, err := setup(ctx, *store, "orders", "idempotency_keys")
	if err != nil {
		log.Fatal(err)
	}
	defer a.close()
	key := idempotency.Key{Scope: "customer-42", ID: "order-1"}
	for range 2 {
		resp, err := placeOrder(ctx, a.guard, a.db, "orders", key, Order{ID: "o-1", Customer: "customer-42", Amount: 1999}, func(Order) error { return nil })
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Status, string(resp.Body), "replayed:", resp.Replayed)
	}
}

// keyStore is what setup needs of a store.
type keyStore interface {
	idempotency.KeyStore[*sql.Tx]
	Migrate(ctx context.Context) error
}

// app is sqlx and a guard on one database.
type app struct {
	guard *idempotency.Guard[*sql.Tx]
	db    *sqlx.DB
	close func()
}

// setup opens store ("mysql:" and a DSN, a postgres:// URL, or a SQLite
// file), sqlx on it, the orders table and the keys table.
func setup(ctx context.Context, store, ordersTable, keysTable string) (*app, error) {
	var (
		db      *sql.DB
		driver  string
		ks      keyStore
		closeKS = func() {}
		err     error
	)
	switch dsn, isMySQL := strings.CutPrefix(store, "mysql:"); {
	case isMySQL:
		if db, err = mysql.Open(ctx, dsn); err != nil {
			return nil, err
		}
		driver = "mysql"
		ks, err = mysql.New(db, &mysql.Config{Table: keysTable})
	case strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://"):
		if db, err = sql.Open("pgx", store); err != nil {
			return nil, err
		}
		driver = "pgx"
		ks, err = postgres.NewDB(db, &postgres.Config{Table: keysTable})
	default:
		if db, err = sqlite.Open(ctx, store); err != nil {
			return nil, err
		}
		driver = "sqlite"
		var s *sqlite.Store
		if s, err = sqlite.New(db, &sqlite.Config{Table: keysTable}); err == nil {
			ks, closeKS = s, func() { s.Close() }
		}
	}
	if err == nil {
		err = ks.Migrate(ctx)
	}
	if err != nil {
		closeKS()
		db.Close()
		return nil, err
	}
	xdb := sqlx.NewDb(db, driver)
	closeAll := func() { closeKS(); db.Close() }
	if _, err := xdb.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+ordersTable+" (id VARCHAR(64) PRIMARY KEY, customer VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)"); err != nil {
		closeAll()
		return nil, fmt.Errorf("create %s: %w", ordersTable, err)
	}
	g, err := idempotency.New(ks, nil)
	if err != nil {
		closeAll()
		return nil, err
	}
	return &app{guard: g, db: xdb, close: closeAll}, nil
}
