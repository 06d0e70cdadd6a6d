-- The keys table of github.com/go-idempotency/idempotency/sqlite.
-- Times are unix nanoseconds; scope and id compare byte by byte (BINARY).
-- progress is set (NOT NULL) on an unfinished multi-step operation, whose
-- lease is owner's until lease_ends.
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
	progress    BLOB,
	owner       TEXT,
	lease_ends  INTEGER,
	tries       INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS "idempotency_keys_expires_at" ON "idempotency_keys" (expires_at);
CREATE INDEX IF NOT EXISTS "idempotency_keys_lease_ends" ON "idempotency_keys" (lease_ends) WHERE progress IS NOT NULL;
CREATE INDEX IF NOT EXISTS "idempotency_keys_unfinished" ON "idempotency_keys" (scope, id) WHERE progress IS NOT NULL;
