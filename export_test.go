package idempotency

import "github.com/go-idempotency/idempotency/internal/canonical"

// The canonical forms the fingerprints hash, for the tests of this
// directory (package idempotency_test) to check them by the names they
// had before they moved to internal/canonical.
var (
	CanonicalJSON = canonical.JSON
	CanonicalForm = canonical.Form
)
