package postgres_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/internal/testkit/readmekit"
	"github.com/go-idempotency/idempotency/postgres"
)

// A payment runs once per idempotency key: the payment row, the key and the
// response commit in one transaction. (It needs a server, so it is only
// compiled.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.New(pool, &postgres.Config{Table: "idempotency_keys"})
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

	body := []byte(`{"amount": 100, "currency": "EUR"}`)
	fp, err := idempotency.FingerprintJSON(body)
	if err != nil {
		log.Fatal(err)
	}
	key := idempotency.Key{Scope: "customer-42", ID: "3f1c9a7e-order-7"}
	resp, err := guard.Do(ctx, key, fp, func(tx pgx.Tx) (idempotency.Response, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO payments (customer, amount) VALUES ($1, $2) RETURNING id`, "customer-42", 100).Scan(&id)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   fmt.Appendf(nil, `{"payment": %d}`, id),
		}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, resp.Replayed)
}

// The DDL of a keys table, for a migration tool.
func ExampleSchema() {
	ddl, err := postgres.Schema("billing.idempotency_keys")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_keys" (
	// 	scope       TEXT COLLATE "C" NOT NULL,
	// 	id          TEXT COLLATE "C" NOT NULL,
	// 	fingerprint TEXT NOT NULL,
	// 	state       TEXT NOT NULL CHECK (state IN ('pending', 'completed')),
	// 	status      INTEGER,
	// 	header      BYTEA,
	// 	body        BYTEA,
	// 	created_at  TIMESTAMPTZ NOT NULL,
	// 	expires_at  TIMESTAMPTZ NOT NULL,
	// 	progress    BYTEA,
	// 	owner       TEXT,
	// 	lease_ends  TIMESTAMPTZ,
	// 	tries       INTEGER NOT NULL DEFAULT 0,
	// 	PRIMARY KEY (scope, id)
	// );
	// DO $idempotency$ BEGIN
	// 	IF (SELECT count(*) FROM pg_attribute WHERE attrelid = '"billing"."idempotency_keys"'::regclass
	// 		AND attname IN ('progress', 'owner', 'lease_ends', 'tries') AND NOT attisdropped) < 4 THEN
	// 		ALTER TABLE "billing"."idempotency_keys"
	// 			ADD COLUMN IF NOT EXISTS progress   BYTEA,
	// 			ADD COLUMN IF NOT EXISTS owner      TEXT,
	// 			ADD COLUMN IF NOT EXISTS lease_ends TIMESTAMPTZ,
	// 			ADD COLUMN IF NOT EXISTS tries      INTEGER NOT NULL DEFAULT 0;
	// 	END IF;
	// END $idempotency$;
	// CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at_idx" ON "billing"."idempotency_keys" (expires_at);
	// CREATE INDEX IF NOT EXISTS "idempotency_keys_lease_ends_idx" ON "billing"."idempotency_keys" (lease_ends) WHERE progress IS NOT NULL;
}

// readmeQuickStart is the README's PostgreSQL quick start: it opens the
// store on dsn and pays amount once per key.
func readmeQuickStart(ctx context.Context, dsn string, key idempotency.Key, fp string, amount int) (idempotency.Response, error) {
	// readme:begin readme-quickstart-postgres
	pool, err := postgres.Open(ctx, dsn) // dsn: "postgres://app@db:5432/app"; pinged
	if err != nil {
		return idempotency.Response{}, err
	}
	defer pool.Close()
	store, err := postgres.New(pool, nil) // postgres.Config{Table: "billing.idempotency_keys", TxOptions: ...}
	if err != nil {
		return idempotency.Response{}, err
	}
	if err := store.Migrate(ctx); err != nil {
		return idempotency.Response{}, err
	}
	guard, err := idempotency.New(store, &idempotency.Config{TTL: 72 * time.Hour})
	if err != nil {
		return idempotency.Response{}, err
	}

	return guard.Do(ctx, key, fp, func(tx pgx.Tx) (idempotency.Response, error) {
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO payments (amount) VALUES ($1) RETURNING id", amount).Scan(&id); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
	})
	// readme:end readme-quickstart-postgres
}

// TestReadmeQuickStart runs the README's quick start in a schema of its own
// (through search_path): one payment for two calls with one key, and the
// same key with another request refused.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := testkit.Name("readme_")
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s; CREATE TABLE %s.payments (id BIGSERIAL PRIMARY KEY, amount INT NOT NULL)`, schema, schema)); err != nil {
		t.Fatal(err)
	}
	pgkit.DropAtCleanup(t, dsn, "SCHEMA", schema)
	dsn = withSearchPath(t, dsn, schema)

	key := idempotency.Key{Scope: "customer-7", ID: "order-42"}
	first := readmekit.CheckQuickStart(t, func(fp string, amount int) (idempotency.Response, error) {
		return readmeQuickStart(ctx, dsn, key, fp, amount)
	})
	var n int
	var body string
	if err := admin.QueryRow(ctx, `SELECT count(*), coalesce(max('{"id":' || id || '}'), '') FROM `+schema+`.payments`).Scan(&n, &body); err != nil {
		t.Fatal(err)
	}
	if n != 1 || body != string(first.Body) {
		t.Errorf("%d payments (%s), want 1 named by the response %s", n, body, first.Body)
	}
	var keys int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.idempotency_keys`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != 1 {
		t.Errorf("%d keys in the schema's idempotency_keys, want 1", keys)
	}
}

// withSearchPath returns dsn with search_path set to schema, in URL or
// keyword form.
func withSearchPath(t *testing.T, dsn, schema string) string {
	t.Helper()
	if !strings.Contains(dsn, "://") {
		return dsn + " search_path=" + schema
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
