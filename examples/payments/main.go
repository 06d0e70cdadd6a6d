// Command payments is a small payment service guarded by idempotency keys.
//
// POST /payments takes {"orderId": int, "amount": int} and answers 201 with
// {"id": "...", "orderId": ..., "amount": ..., "status": "approved"}. The
// request must carry an Idempotency-Key header. The payment row, the key and
// the response commit in one transaction, so a retried request never pays
// twice. It gets the first response back, byte for byte.
//
//	go run ./examples/payments                      # SQLite file ./payments.db
//	go run ./examples/payments -store 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	curl -i -X POST localhost:8080/payments -H 'Content-Type: application/json' \
//	  -H 'Idempotency-Key: "order-42-attempt"' -d '{"orderId":42,"amount":1999}'
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	store := flag.String("store", "payments.db", "SQLite database file, or a PostgreSQL DSN (postgres://...)")
	flag.Parse()
	if err := run(*addr, *store); err != nil {
		log.Fatal(err)
	}
}

func run(addr, store string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := open(ctx, store, defaultTables)
	if err != nil {
		return err
	}
	defer a.close()

	// Expired keys are deleted once an hour.
	go func() {
		t := time.NewTicker(time.Hour)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if n, err := a.purge(ctx); err != nil {
					log.Printf("purge: %v (deleted %d keys)", err, n)
				}
			}
		}
	}()

	srv := &http.Server{Addr: addr, Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("payments: listening on http://%s (store %s)", addr, a.name)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// tables names the service's two tables.
type tables struct {
	Payments string // the payments
	Keys     string // the idempotency keys
}

var defaultTables = tables{Payments: "payments", Keys: "idempotency_keys"}

// app is the service on one store.
type app struct {
	name     string
	handler  http.Handler
	payments func(ctx context.Context) (int, error) // counts payment rows
	purge    func(ctx context.Context) (int, error)
	close    func()
}

// open builds the service on store: a PostgreSQL DSN (postgres:// or
// postgresql://) or a SQLite file path.
func open(ctx context.Context, store string, names tables) (*app, error) {
	if strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://") {
		return openPostgres(ctx, store, names)
	}
	return openSQLite(ctx, store, names)
}

// payment is the request body.
type payment struct {
	OrderID int64 `json:"orderId"`
	Amount  int64 `json:"amount"`
}

// receipt is the 201 response body.
type receipt struct {
	ID      string `json:"id"`
	OrderID int64  `json:"orderId"`
	Amount  int64  `json:"amount"`
	Status  string `json:"status"`
}

// newHandler is the service's router. insert adds one payment row through
// the transaction that holds the request's idempotency key.
func newHandler[Tx any](g *idempotency.Guard[Tx], insert func(ctx context.Context, tx Tx, p payment) (int64, error)) http.Handler {
	// This demo has no authentication: it says so with SharedScope, one key
	// space for all its clients. A real, multi-tenant service sets
	// Config.Scope to the authenticated account (the middleware refuses
	// to run without a Scope).
	guarded := idemhttp.Middleware(g, &idemhttp.Options{Scope: idemhttp.SharedScope})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", guarded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[Tx](r.Context())
		if !ok {
			http.Error(w, "no idempotency transaction", http.StatusInternalServerError)
			return
		}
		var p payment
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil || p.OrderID <= 0 || p.Amount <= 0 {
			detail := `send {"orderId": <positive integer>, "amount": <positive integer, in cents>}`
			if err != nil {
				detail = err.Error() + "; " + detail
			}
			// A 4xx is stored with the key like a success: the same request
			// gets the same answer.
			writeJSON(w, http.StatusBadRequest, "application/problem+json", idemhttp.Problem{
				Type: "https://payments.example/problems/invalid-payment", Title: "Invalid payment",
				Status: http.StatusBadRequest, Detail: detail,
			})
			return
		}
		id, err := insert(r.Context(), tx, p)
		if err != nil {
			// A 5xx rolls back the payment and the key: a retry runs again.
			http.Error(w, "payment failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", "/payments/"+strconv.FormatInt(id, 10))
		writeJSON(w, http.StatusCreated, "application/json", receipt{
			ID: strconv.FormatInt(id, 10), OrderID: p.OrderID, Amount: p.Amount, Status: "approved",
		})
	})))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, ctype string, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func openSQLite(ctx context.Context, path string, names tables) (*app, error) {
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	g, err := setupSQLite(ctx, db, names)
	if err != nil {
		db.Close()
		return nil, err
	}
	insert := func(ctx context.Context, tx *sql.Tx, p payment) (id int64, err error) {
		err = tx.QueryRowContext(ctx, `INSERT INTO `+names.Payments+` (order_id, amount) VALUES (?, ?) RETURNING id`,
			p.OrderID, p.Amount).Scan(&id)
		return id, err
	}
	return &app{
		name:    "sqlite:" + path,
		handler: newHandler(g, insert),
		payments: func(ctx context.Context) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+names.Payments).Scan(&n)
			return n, err
		},
		purge: g.Purge,
		close: func() { db.Close() },
	}, nil
}

func setupSQLite(ctx context.Context, db *sql.DB, names tables) (*idempotency.Guard[*sql.Tx], error) {
	store, err := sqlite.New(db, &sqlite.Config{Table: names.Keys})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+names.Payments+` (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		order_id INTEGER NOT NULL,
		amount INTEGER NOT NULL
	)`); err != nil {
		return nil, fmt.Errorf("creating %s: %w", names.Payments, err)
	}
	return idempotency.New(store, nil)
}

func openPostgres(ctx context.Context, dsn string, names tables) (*app, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	g, err := setupPostgres(ctx, pool, names)
	if err != nil {
		pool.Close()
		return nil, err
	}
	insert := func(ctx context.Context, tx pgx.Tx, p payment) (id int64, err error) {
		err = tx.QueryRow(ctx, `INSERT INTO `+names.Payments+` (order_id, amount) VALUES ($1, $2) RETURNING id`,
			p.OrderID, p.Amount).Scan(&id)
		return id, err
	}
	return &app{
		name:    "postgres",
		handler: newHandler(g, insert),
		payments: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+names.Payments).Scan(&n)
			return n, err
		},
		purge: g.Purge,
		close: pool.Close,
	}, nil
}

func setupPostgres(ctx context.Context, pool *pgxpool.Pool, names tables) (*idempotency.Guard[pgx.Tx], error) {
	store, err := postgres.New(pool, &postgres.Config{Table: names.Keys})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+names.Payments+` (
		id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		order_id BIGINT NOT NULL,
		amount BIGINT NOT NULL
	)`); err != nil {
		return nil, fmt.Errorf("creating %s: %w", names.Payments, err)
	}
	return idempotency.New(store, nil)
}
