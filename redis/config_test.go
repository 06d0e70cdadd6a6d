package redis

import (
	"bytes"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
)

func TestNewValidates(t *testing.T) {
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
			for _, name := range []string{ks.wake, tx.Key("effects"), tx.Key("{other}")} {
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
