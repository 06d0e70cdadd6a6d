// Command gorm shows GORM (gorm.io/gorm) writing inside the transaction that
// holds an idempotency key. onTx binds a GORM session to the *sql.Tx that
// Guard.Do gives fn, the way gorm's own Begin does. So the order row, the
// key and the stored response commit together, and an error from fn rolls
// back all three.
//
// It runs on MySQL or MariaDB (the mysql store) and on PostgreSQL (the
// postgres store on database/sql, postgres.NewDB, with pgx's stdlib
// driver, which GORM's postgres driver uses too): GORM (database/sql) can
// use the *sql.Tx both give fn. Only setup differs; placeOrder is the same.
//
//	go run . -dsn 'root@tcp(127.0.0.1:3306)/test'
//	go run . -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
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

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/stdlib"
	gormmysql "gorm.io/driver/mysql"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/mysql"
	"github.com/go-idempotency/idempotency/postgres"
)

// Order is one order row.
type Order struct {
	ID       int64
	Customer string `gorm:"size:255;not null"`
	Amount   int64  `gorm:"not null"`
}

// errDeclined is what placeOrder's check returns for a refused order.
var errDeclined = errors.New("order declined")

// readme:begin orm-gorm
// onTx returns a GORM session that runs its statements on tx, the
// transaction that holds the idempotency key (what gorm's Begin does with a
// transaction it starts itself).
func onTx(ctx context.Context, gdb *gorm.DB, tx *sql.Tx) *gorm.DB {
	s := gdb.Session(&gorm.Session{Context: ctx, NewDB: true, SkipDefaultTransaction: true})
	s.Statement.ConnPool = tx
	return s
}

// placeOrder creates one order under key. check runs after the insert, in
// the same transaction: an error from it rolls back the order and the key.
func placeOrder(ctx context.Context, g *idempotency.Guard[*sql.Tx], gdb *gorm.DB, table string, key idempotency.Key,
	order Order, check func(Order) error) (idempotency.Response, error) {
	fp := idempotency.Fingerprint([]byte(order.Customer), fmt.Append(nil, order.Amount))
	return g.Do(ctx, key, fp, func(tx *sql.Tx) (idempotency.Response, error) {
		if err := onTx(ctx, gdb, tx).Table(table).Create(&order).Error; err != nil {
			return idempotency.Response{}, err
		}
		if err := check(order); err != nil {
			return idempotency.Response{}, err // rolls back the order and the key
		}
		return idempotency.Response{Status: http.StatusCreated, Body: fmt.Appendf(nil, `{"order":%d}`, order.ID)}, nil
	})
}

// readme:end orm-gorm

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/test", "MySQL / MariaDB DSN, or a postgres:// URL")
	flag.Parse()
	ctx := context.Background()
	g, gdb, db, err := setup(ctx, *dsn, "orders", "idempotency_keys")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	key := idempotency.Key{Scope: "customer-42", ID: "order-1"}
	for range 2 {
		resp, err := placeOrder(ctx, g, gdb, "orders", key, Order{Customer: "customer-42", Amount: 1999}, func(Order) error { return nil })
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

// setup opens the pool (MySQL, or PostgreSQL for a postgres:// URL), GORM
// on it, the orders table and the keys table.
func setup(ctx context.Context, dsn, ordersTable, keysTable string) (*idempotency.Guard[*sql.Tx], *gorm.DB, *sql.DB, error) {
	var (
		db      *sql.DB
		dialect gorm.Dialector
		store   keyStore
		err     error
	)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		cfg, perr := pgx.ParseConfig(dsn)
		if perr != nil {
			return nil, nil, nil, perr
		}
		db = stdlib.OpenDB(*cfg)
		dialect = gormpostgres.New(gormpostgres.Config{Conn: db})
		store, err = postgres.NewDB(db, &postgres.Config{Table: keysTable})
	} else {
		if db, err = mysql.Open(ctx, dsn); err != nil {
			return nil, nil, nil, err
		}
		dialect = gormmysql.New(gormmysql.Config{Conn: db})
		store, err = mysql.New(db, &mysql.Config{Table: keysTable})
	}
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	g, gdb, err := func() (*idempotency.Guard[*sql.Tx], *gorm.DB, error) {
		gdb, err := gorm.Open(dialect, &gorm.Config{})
		if err != nil {
			return nil, nil, err
		}
		if err := gdb.WithContext(ctx).Table(ordersTable).AutoMigrate(&Order{}); err != nil {
			return nil, nil, fmt.Errorf("migrate %s: %w", ordersTable, err)
		}
		if err := store.Migrate(ctx); err != nil {
			return nil, nil, err
		}
		g, err := idempotency.New(store, nil)
		return g, gdb, err
	}()
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	return g, gdb, db, nil
}
