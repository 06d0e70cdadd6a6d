package idempotency

import (
	"context"
	"errors"
)

// ErrSchema: the store's table is missing, or lacks a column this version
// needs: it was never migrated, [Config]'s table name has a typo, the
// table is that of an older version, or the service connects to another
// database or schema than the one migrated. Stores wrap the database's
// "no such table" and "no such column" errors of their own statements with
// it; the message names the table (or the column) and says to run the
// store's Migrate or apply its Schema. [Guard.CheckSchema] returns it
// before a service serves.
//
// It is a configuration error, not a transient failure: retrying does not
// help until the schema is fixed, so it is never wrapped in [ErrStore]
// (whose message says a retry is safe). Nothing was written: the key is
// not taken, fn did not run, and after the migration the same key runs as
// a new one. [Event].Outcome is [Failed]; idemhttp answers it with 500,
// not 503 with Retry-After.
var ErrSchema = errors.New("idempotency: the store's schema is missing or out of date")

// SchemaCheck says what [Guard.CheckSchema] (and
// [SchemaChecker.CheckSchema]) verifies besides the keys table.
type SchemaCheck struct {
	// Quota: the service uses quotas ([Guard.Admit], idemhttp's
	// Config.Quota), so the store's quota table must exist too. A service
	// without quotas may have applied Schema without the quota table's
	// DDL; it leaves Quota false.
	Quota bool
}

// CheckSchema verifies, before a service serves, that the store's schema
// is the one this version needs: the keys table exists with every column
// that calls, operations and key administration use, and with c.Quota the
// quota table too. It is a few catalog reads, meant to be called once at
// start-up (or in a readiness probe), never per request.
//
// It returns nil when the schema is in place, or when the store keeps no
// schema of its own (it does not implement [SchemaChecker], as Redis). A
// missing table or column gives an error wrapping [ErrSchema] that names
// the table and what to run (the store's Migrate, or its Schema DDL in
// the service's own migrations). A store it cannot reach gives an error
// wrapping [ErrStore]; ctx bounds the check.
func (g *Guard[Tx]) CheckSchema(ctx context.Context, c SchemaCheck) error {
	sc, ok := g.store.(SchemaChecker)
	if !ok {
		return nil
	}
	if err := sc.CheckSchema(ctx, c); err != nil {
		err, _ = storeError(ctx, err)
		return err
	}
	return nil
}
