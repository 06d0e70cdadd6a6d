-- The example's own table; the idempotency keys table is the postgres
-- store's (postgres.Schema / Store.Migrate).
CREATE TABLE IF NOT EXISTS orders (
    id       bigserial PRIMARY KEY,
    customer text   NOT NULL,
    amount   bigint NOT NULL
);
