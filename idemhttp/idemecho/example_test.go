package idemecho_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/idemhttp/idemecho"
	"github.com/go-idempotency/idempotency/sqlite"
)

// exampleGuard returns a guard on a temporary SQLite file with a payments
// table, its database, and a function that removes them.
func exampleGuard() (*idempotency.Guard[*sql.Tx], *sql.DB, func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sqlite.Open(ctx, filepath.Join(dir, "payments.db"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	return guard, db, func() { db.Close(); os.RemoveAll(dir) }
}

// pay posts the same payment twice with one key and prints the answers and
// the number of payment rows.
// accountScope is the example's Config.Scope: the account of the
// request's credential, as the service's authentication verified it (here,
// standing for it, the bearer token), and 401 without one. Never a value
// the client may set to anything: that would let it pick another
// account's key space.
func accountScope(r *http.Request) (string, error) {
	if acct := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); acct != "" {
		return acct, nil
	}
	return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized}
}

func pay(url string, db *sql.DB) {
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1999}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", "pay-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(body)))
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
}

func ExampleMiddleware() {
	guard, db, cleanup := exampleGuard()
	defer cleanup()

	// readme:begin http-echo
	e := echo.New()
	e.Use(middleware.Recover())
	e.POST("/payments", func(c echo.Context) error {
		tx, ok := idemecho.TxFrom[*sql.Tx](c)
		if !ok { // not a guarded request: never act without the transaction
			return echo.NewHTTPError(http.StatusInternalServerError, "not guarded")
		}
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.Bind(&in); err != nil {
			return err // echo's 400, rendered inside the middleware: not stored
		}
		var id int64
		err := tx.QueryRowContext(c.Request().Context(), `INSERT INTO payments (amount) VALUES (?) RETURNING id`, in.Amount).Scan(&id)
		if err != nil {
			return echo.NewHTTPError(http.StatusBadGateway, "payment failed") // 5xx: rolled back
		}
		return c.JSON(http.StatusCreated, map[string]int64{"id": id})
	}, idemecho.Middleware(guard, &idemhttp.Options{Scope: accountScope}))
	// readme:end http-echo

	e.HideBanner, e.HidePort = true, true
	srv := httptest.NewServer(e)
	defer srv.Close()
	pay(srv.URL+"/payments", db)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// payments: 1
}
