package idemhttp_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// TestAsyncRefusesBadConfig: Async and AsyncStatus refuse, when they are
// built, every configuration they cannot serve, with an error that names
// the field; they answered 500 to every request and said why nowhere.
func TestAsyncRefusesBadConfig(t *testing.T) {
	g, err := idempotency.New[*memstore.Tx](memstore.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	op := labelOp(nil, nil)
	for _, c := range []struct {
		name   string
		change func(*idemhttp.AsyncOptions)
		op     *idempotency.Operation[*memstore.Tx]
		want   string
	}{
		{"no StatusPath", func(c *idemhttp.AsyncOptions) { c.StatusPath = "" }, op, "StatusPath"},
		{"relative StatusPath", func(c *idemhttp.AsyncOptions) { c.StatusPath = "ops/" }, op, "StatusPath"},
		{"no Config", func(c *idemhttp.AsyncOptions) { c.Options = nil }, op, "Scope"},
		{"no Scope", func(c *idemhttp.AsyncOptions) { c.Options = &idemhttp.Options{} }, op, "Scope"},
		{"no Secrets", func(c *idemhttp.AsyncOptions) { c.Secrets = nil }, op, "Secrets"},
		{"short secret", func(c *idemhttp.AsyncOptions) { c.Secrets = [][]byte{[]byte("short")} }, op, "Secrets[0]"},
		{"short old secret", func(c *idemhttp.AsyncOptions) { c.Secrets = append(c.Secrets, nil) }, op, "Secrets[1]"},
		{"negative Wait", func(c *idemhttp.AsyncOptions) { c.Wait = -time.Second }, op, "Wait"},
		{"KeyOptional", func(c *idemhttp.AsyncOptions) { c.Options.KeyOptional = true }, op, "KeyOptional"},
		{"Quota", func(c *idemhttp.AsyncOptions) { c.Options.Quota = &idempotency.Quota{MaxKeys: 1, Window: time.Minute} }, op, "Quota"},
		{"bad TTL", func(c *idemhttp.AsyncOptions) { c.Options.TTL = -time.Second }, op, "TTL"},
		{"bad InProgressStatus", func(c *idemhttp.AsyncOptions) { c.Options.InProgressStatus = 500 }, op, "InProgressStatus"},
		{"nil op", func(*idemhttp.AsyncOptions) {}, nil, "nil operation"},
		{"op without Finish", func(*idemhttp.AsyncOptions) {}, &idempotency.Operation[*memstore.Tx]{Name: "x"}, "Finish"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := asyncConfig(time.Second)
			c.change(cfg)
			h, err := idemhttp.Async(g, c.op, cfg)
			if h != nil || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Async: %v, %v; want an error naming %q", h, err, c.want)
			}
			if !errors.Is(err, idempotency.ErrInvalidConfig) && !errors.Is(err, idemhttp.ErrNoScope) {
				t.Fatalf("Async: %v; want ErrInvalidConfig or ErrNoScope", err)
			}
			if c.op == nil || c.op.Finish == nil {
				return // AsyncStatus takes no operation
			}
			if h, err := idemhttp.AsyncStatus(g, cfg); h != nil || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("AsyncStatus: %v, %v; want an error naming %q", h, err, c.want)
			}
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate: %v; want an error naming %q", err, c.want)
			}
		})
	}
	if _, err := idemhttp.Async[*memstore.Tx](nil, op, asyncConfig(time.Second)); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("Async with a nil Guard: %v", err)
	}
	if _, err := idemhttp.AsyncStatus[*memstore.Tx](nil, asyncConfig(time.Second)); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("AsyncStatus with a nil Guard: %v", err)
	}
	if _, err := idemhttp.Async(g, op, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("Async with a nil config: %v", err)
	}
	cfg := asyncConfig(time.Second)
	cfg.Secrets = [][]byte{bytes.Repeat([]byte{1}, idemhttp.MinStatusSecretLen)}
	if _, err := idemhttp.Async(g, op, cfg); err != nil {
		t.Fatalf("a good config: %v", err)
	}
}
