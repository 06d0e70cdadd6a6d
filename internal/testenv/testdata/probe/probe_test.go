// Package probe is run by testenv's tests through `go test`, to see the
// line testenv.Main prints as a user sees it.
package probe

import (
	"testing"

	"github.com/go-idempotency/idempotency/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres, testenv.Redis) }

func TestRedis(t *testing.T) { t.Log("redis at", testenv.RedisAddr(t)) }
