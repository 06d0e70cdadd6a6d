package postgres_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/postgres"
)

// The store on database/sql: fn gets the *sql.Tx that holds the key, so
// code written for database/sql (GORM, bun, sqlx, sqlc) moves between
// SQLite, MySQL and PostgreSQL by changing only the store's construction.
// (It needs a server, so it is only compiled.)
func ExampleNewDB() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	// readme:begin orm-postgres-db
	db, err := sql.Open("pgx", dsn) // import _ "github.com/jackc/pgx/v5/stdlib"; or "postgres" with lib/pq
	if err != nil {
		log.Fatal(err)
	}
	store, err := postgres.NewDB(db, &postgres.Config{Table: "idempotency_keys"})
	if err != nil {
		log.Fatal(err)
	}
	g, err := idempotency.New(store, nil) // *idempotency.Guard[*sql.Tx], as with mysql.New or sqlite.New
	// readme:end orm-postgres-db
	if err != nil {
		log.Fatal(err)
	}
	_, _ = g.Do(ctx, idempotency.Key{Scope: "acct", ID: "k"}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 204}, nil
	})
}
