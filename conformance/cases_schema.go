package conformance

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// ruleSchemaCheck is the sentence of [backend.SchemaChecker] that
// SchemaCheck checks; TestSchemaRuleQuotesTheSource keeps it verbatim.
var ruleSchemaCheck = rule{"backend/contract.go", "CheckSchema reads the database's catalog, writes nothing, and returns nil when the " +
	"store's keys table exists with every column this version's statements use"}

// schemaCheck: a fixture's store, migrated, passes its own start-up check
// ([backend.SchemaChecker]), with its quota table when it counts
// quotas, while a key is held (the check reads the catalog, writes
// nothing, waits for no key and needs no connection besides the holder's).
// A store without a SchemaChecker passes [idempotency.Guard.CheckSchema].
func (s *suite[Tx]) schemaCheck(t *testing.T) {
	e := s.setup(t, Options{MaxConns: 2})
	g := e.guard(nil)
	_, quota := e.f.Store.(backend.QuotaCounter)
	check := idempotency.SchemaCheck{Quota: quota}
	if err := g.CheckSchema(e.ctx, check); err != nil {
		t.Fatalf("CheckSchema(%+v) of the fixture's store: %v; want nil: a migrated store passes its own check", check, err)
	}
	release, done := e.hold(g, idempotency.Key{ID: uniq("k")}, "schema")
	var err error
	within(t, 10*time.Second, "CheckSchema while a key is held", func() { err = g.CheckSchema(e.ctx, check) })
	if err != nil {
		t.Fatalf("CheckSchema while a key is held: %v; want nil", err)
	}
	release()
	if r := <-done; r.err != nil {
		t.Fatalf("the holder: %v", r.err)
	}
	e.count("schema", 1, "the holder's effect, once")
}
