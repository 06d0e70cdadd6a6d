-- The keys table of github.com/go-idempotency/idempotency/sqlite.
-- Times are unix nanoseconds; scope and id compare byte by byte (BINARY).
CREATE TABLE IF NOT EXISTS "idempotency_keys" (
	scope       TEXT    NOT NULL COLLATE BINARY,
	id          TEXT    NOT NULL COLLATE BINARY,
	fingerprint TEXT    NOT NULL,
	state       TEXT    NOT NULL CHECK (state IN ('pending', 'completed')),
	status      INTEGER NOT NULL DEFAULT 0,
	header      BLOB,
	body        BLOB,
	created_at  INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at" ON "idempotency_keys" (expires_at);
