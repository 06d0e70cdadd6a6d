package main

import (
	"os"
	"testing"

	"github.com/go-idempotency/idempotency/internal/testenv"
)

// TestMain says, before the tests start, which server backends will not
// run here and the variable that enables each.
// With asMainEnv=1 the test binary is idemcheck itself.
func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
	}
	testenv.Main(m, testenv.Postgres, testenv.MySQL, testenv.Redis)
}
