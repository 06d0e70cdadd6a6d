package postgres_test

import (
	"testing"

	"github.com/go-idempotency/idempotency/internal/testenv"
)

// TestMain says, before the tests start, which server backends will not
// run here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }
