// Command webhooks receives webhook events exactly once in effect, although
// providers deliver them at least once.
//
// POST /webhooks/{provider} takes an event signed the Standard Webhooks way.
// Its headers are webhook-id (the provider's event id), webhook-timestamp
// (Unix seconds) and webhook-signature ("v1,<base64 HMAC-SHA256>" entries,
// space-separated). The HMAC is keyed with the provider's secret over
// "id.timestamp.body". The receiver
//
//  1. checks the signature (and that the timestamp is within 5 minutes)
//     before anything is stored: a forged or replayed-late request gets 401
//     and leaves no trace;
//
//  2. runs the event's effect under the idempotency key {Scope: provider,
//     ID: event id}, in the transaction that stores the key, so the effect
//     and the key commit together: a duplicate delivery (concurrent, or after
//     a crash) finds the key and does nothing;
//
//  3. answers 2xx only after that commit. A crash before it leaves neither
//     the effect nor the key, and the provider's next delivery runs it.
//
// Run it with the provider's signing secret:
//
//	WEBHOOK_SECRET=whsec go run ./examples/webhooks -provider acme
//	WEBHOOK_SECRET=whsec go run ./examples/webhooks -provider acme -store 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// Headers of a Standard Webhooks delivery.
const (
	headerID        = "Webhook-Id"
	headerTimestamp = "Webhook-Timestamp"
	headerSignature = "Webhook-Signature"
)

// tolerance is how far a delivery's timestamp may be from the clock.
const tolerance = 5 * time.Minute

func main() {
	addr := flag.String("addr", "localhost:8081", "address to listen on")
	store := flag.String("store", "webhooks.db", "SQLite database file, or a PostgreSQL DSN (postgres://...)")
	provider := flag.String("provider", "acme", "provider name: the path /webhooks/{provider} and the key's scope")
	flag.Parse()
	secret := os.Getenv("WEBHOOK_SECRET")
	if secret == "" {
		log.Fatal("set WEBHOOK_SECRET to the provider's signing secret")
	}
	if err := run(*addr, *store, map[string][]byte{*provider: []byte(secret)}); err != nil {
		log.Fatal(err)
	}
}

func run(addr, store string, secrets map[string][]byte) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := open(ctx, store, defaultTables, secrets, hooks{})
	if err != nil {
		return err
	}
	defer a.close()
	srv := &http.Server{Addr: addr, Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("webhooks: listening on http://%s (store %s)", addr, a.name)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// tables names the receiver's two tables.
type tables struct {
	Orders string // the effect: one row per paid order event
	Keys   string // the idempotency keys
}

var defaultTables = tables{Orders: "paid_orders", Keys: "webhook_keys"}

// hooks let the tests stop the receiver at its crash points.
type hooks struct {
	afterEffect func() // in the transaction, after the effect, before the commit
	afterCommit func() // after the commit, before the 2xx
}

// app is the receiver on one store.
type app struct {
	name    string
	handler http.Handler
	effects func(ctx context.Context) (int, error) // counts effect rows
	close   func()
}

// event is the body the receiver understands.
type event struct {
	Type   string `json:"type"`
	Order  int64  `json:"order"`
	Amount int64  `json:"amount"`
}

// verify checks a delivery's signature and timestamp.
func verify(secret []byte, id, timestamp, signatures string, body []byte, now time.Time) error {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("bad %s %q", headerTimestamp, timestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%s %d is %v away from now", headerTimestamp, ts, d.Round(time.Second))
	}
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%s.", id, timestamp)
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range strings.Fields(signatures) {
		version, sig, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid v1 signature")
}

// sign returns the webhook-signature value of a delivery: what a provider
// sends.
func sign(secret []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%s.", id, timestamp)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// readme:begin webhooks-handler
// newHandler is the receiver. apply does the event's effect through the
// transaction that holds the event's key.
func newHandler[Tx any](g *idempotency.Guard[Tx], secrets map[string][]byte, h hooks,
	apply func(ctx context.Context, tx Tx, ev event) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhooks/{provider}", func(w http.ResponseWriter, r *http.Request) {
		provider := r.PathValue("provider")
		secret, known := secrets[provider]
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if !known || err != nil {
			http.Error(w, "unknown provider or unreadable body", http.StatusBadRequest)
			return
		}
		id := r.Header.Get(headerID)
		// 1. The signature, before anything is stored.
		if err := verify(secret, id, r.Header.Get(headerTimestamp), r.Header.Get(headerSignature), body, time.Now()); err != nil {
			http.Error(w, "invalid signature: "+err.Error(), http.StatusUnauthorized)
			return
		}
		var ev event
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, "invalid event: "+err.Error(), http.StatusBadRequest)
			return
		}
		// 2. The provider and its event id are the key; the effect commits
		// with it. Concurrent duplicates wait for the first and replay it.
		key := idempotency.Key{Scope: provider, ID: id}
		_, err = g.Do(r.Context(), key, idempotency.Fingerprint(body), func(tx Tx) (idempotency.Response, error) {
			if err := apply(r.Context(), tx, ev); err != nil {
				return idempotency.Response{}, err // rolled back: the next delivery runs it
			}
			if h.afterEffect != nil {
				h.afterEffect()
			}
			return idempotency.Response{Status: http.StatusNoContent}, nil
		})
		switch {
		case errors.Is(err, idempotency.ErrInvalidKey):
			http.Error(w, "invalid webhook-id", http.StatusBadRequest)
			return
		case errors.Is(err, idempotency.ErrMismatch):
			// Same event id, another body: not a redelivery. Tell the
			// provider without retrying forever.
			http.Error(w, "event id reused with another payload", http.StatusUnprocessableEntity)
			return
		case err != nil:
			// Nothing committed: a 5xx makes the provider deliver again.
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		if h.afterCommit != nil {
			h.afterCommit()
		}
		// 3. 2xx only now, after the commit (a first delivery or a replay).
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// readme:end webhooks-handler

// open builds the receiver on store: a PostgreSQL DSN (postgres:// or
// postgresql://) or a SQLite file path.
func open(ctx context.Context, store string, names tables, secrets map[string][]byte, h hooks) (*app, error) {
	if strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://") {
		return openPostgres(ctx, store, names, secrets, h)
	}
	return openSQLite(ctx, store, names, secrets, h)
}

func openSQLite(ctx context.Context, path string, names tables, secrets map[string][]byte, h hooks) (*app, error) {
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	store, err := sqlite.New(db, &sqlite.Config{Table: names.Keys})
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS "`+names.Orders+`" (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL, amount INTEGER NOT NULL)`)
	}
	var g *idempotency.Guard[*sql.Tx]
	if err == nil {
		g, err = idempotency.New(store, nil)
	}
	if err != nil {
		if store != nil {
			store.Close()
		}
		db.Close()
		return nil, err
	}
	apply := func(ctx context.Context, tx *sql.Tx, ev event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO "`+names.Orders+`" (order_id, amount) VALUES (?, ?)`, ev.Order, ev.Amount)
		return err
	}
	return &app{
		name:    "sqlite " + path,
		handler: newHandler(g, secrets, h, apply),
		effects: func(ctx context.Context) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM "`+names.Orders+`"`).Scan(&n)
			return n, err
		},
		close: func() { store.Close(); db.Close() },
	}, nil
}

func openPostgres(ctx context.Context, dsn string, names tables, secrets map[string][]byte, h hooks) (*app, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	store, err := postgres.New(pool, &postgres.Config{Table: names.Keys})
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS "`+names.Orders+`" (id bigserial PRIMARY KEY, order_id bigint NOT NULL, amount bigint NOT NULL)`)
	}
	var g *idempotency.Guard[pgx.Tx]
	if err == nil {
		g, err = idempotency.New(store, nil)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	apply := func(ctx context.Context, tx pgx.Tx, ev event) error {
		_, err := tx.Exec(ctx, `INSERT INTO "`+names.Orders+`" (order_id, amount) VALUES ($1, $2)`, ev.Order, ev.Amount)
		return err
	}
	return &app{
		name:    "postgres",
		handler: newHandler(g, secrets, h, apply),
		effects: func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM "`+names.Orders+`"`).Scan(&n)
			return n, err
		},
		close: pool.Close,
	}, nil
}
