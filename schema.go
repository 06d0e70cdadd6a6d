package idempotency

import (
	"context"

	"github.com/go-idempotency/idempotency/backend"
)

// CheckSchema verifies, before a service serves, that the store's schema
// is the one this version needs: the keys table exists with every column
// that calls, operations and key administration use, and with c.Quota the
// quota table too. It is a few catalog reads, meant to be called once at
// start-up (or in a readiness probe), never per request.
//
// It returns nil when the schema is in place, or when the store keeps no
// schema of its own (it does not implement [backend.SchemaChecker], as Redis). A
// missing table or column gives an error wrapping [ErrSchema] that names
// the table and what to run (the store's Migrate, or its Schema DDL in
// the service's own migrations). A store it cannot reach gives an error
// wrapping [ErrStore]; ctx bounds the check.
func (g *Guard[Tx]) CheckSchema(ctx context.Context, c SchemaCheck) error {
	sc, ok := g.store.(backend.SchemaChecker)
	if !ok {
		return nil
	}
	if err := sc.CheckSchema(ctx, backend.SchemaCheck(c)); err != nil {
		err, _ = storeError(ctx, err)
		return err
	}
	return nil
}
