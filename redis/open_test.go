package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestOpenRefusesBadURL: a value that is not a redis:// or rediss:// URL
// or a host:port is refused with ErrInvalidConfig, without a connection.
func TestOpenRefusesBadURL(t *testing.T) {
	ctx := testkit.Context(t, 10*time.Second)
	for _, url := range []string{
		"", "localhost", ":6379", "h:port", "h:70000", "http://h:6379",
		"unix:///tmp/redis.sock", "redis://h:6379/notadb",
	} {
		if c, err := Open(ctx, url); !errors.Is(err, idempotency.ErrInvalidConfig) {
			if c != nil {
				_ = c.Close()
			}
			t.Errorf("Open(%q): got %v, want ErrInvalidConfig", url, err)
		}
	}
}

// TestOpen: Open reaches the test server both as a URL and as a bare
// host:port; a server that does not answer is an error, not a bad URL.
func TestOpen(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	addr := testenv.RedisAddr(t)
	for _, url := range []string{addr, "redis://" + addr + "/0"} {
		c, err := Open(ctx, url)
		if err != nil {
			t.Errorf("Open(%q): %v", url, err)
			continue
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Errorf("Open(%q): ping: %v", url, err)
		}
		_ = c.Close()
	}
	if _, err := Open(ctx, "redis://127.0.0.1:1?dial_timeout=100ms&max_retries=-1"); err == nil || errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Open(closed port): got %v, want a connection error", err)
	}
}
