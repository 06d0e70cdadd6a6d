package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/redis"
)

// TestOpenRedacts: no error of Open holds the URL's password, whether the
// URL is refused before a connection (go-redis's parser quotes it whole) or
// the server refuses the password.
func TestOpenRedacts(t *testing.T) {
	t.Parallel()
	const secret = "Planted-S3cret"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, url := range []string{
		"redis://u:" + secret + "@[::1/0",
		"redis://u:" + secret + "@h:99999x/0",
		"redis://u:" + secret + "@h:6379/notadb",
		"u:" + secret + "@h:6379",
		"redis://u:" + secret + "@127.0.0.1:1/0?dial_timeout=1s",
	} {
		_, err := redis.Open(ctx, url)
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) = %v: want an error without the password", url, err)
		}
		if !strings.Contains(url, "127.0.0.1:1") && !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("Open(%q) = %v: want ErrInvalidConfig", url, err)
		}
	}
}
