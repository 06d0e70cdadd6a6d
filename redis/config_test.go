package redis

import (
	"bytes"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

func TestConfigRefused(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	bad := []*Config{
		{Lease: time.Millisecond},
		{Lease: -time.Second},
		{Prefix: "new\nline:"},
		{Prefix: "empty{}tag:"},
		{Prefix: "open{tag:"},
		{Prefix: string(bytes.Repeat([]byte("p"), MaxPrefixLen+1))},
	}
	for _, c := range bad {
		if _, err := New(client, c); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("New(%+v): got %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("New(nil client): got %v, want ErrInvalidConfig", err)
	}
	s, err := New(client, nil)
	if err != nil || s.prefix != DefaultPrefix || s.lease != DefaultLease || s.renewEvery != DefaultLease/3 {
		t.Fatalf("defaults: got %+v, %v", s, err)
	}
	if _, err := New(client, &Config{Prefix: "app:{idem}:", Lease: MinLease}); err != nil {
		t.Fatalf("prefix with a hash tag: %v", err)
	}
}

// TestKeysShareASlot: the record, its channel and Tx.Key names hash to one
// slot whatever the scope and id contain, and a prefix tag wins.
func TestKeysShareASlot(t *testing.T) {
	for _, prefix := range []string{"p:", "a}b{c}:", "x{y}z:"} {
		s, err := New(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), &Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []idempotency.Key{{ID: "a"}, {Scope: "{x}", ID: "}{"}, {Scope: "ü", ID: "{}"}} {
			ks := s.keysFor(k)
			tx := &Tx{base: ks.base}
			want := hashSlot(ks.rec)
			for _, name := range []string{ks.wake(), tx.Key("effects"), tx.Key("{other}")} {
				if got := hashSlot(name); got != want {
					t.Fatalf("prefix %q key %+v: %q in slot %d, record %q in %d", prefix, k, name, got, ks.rec, want)
				}
			}
		}
	}
}

// hashSlot is Redis Cluster's key slot (CRC16/XMODEM of the hash tag).
func hashSlot(key string) uint16 {
	if i := bytes.IndexByte([]byte(key), '{'); i >= 0 {
		if j := bytes.IndexByte([]byte(key[i+1:]), '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

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
