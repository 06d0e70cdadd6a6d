package idemgrpc

import (
	"context"
	"crypto/rand"
	"encoding/json"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ClientConfig configures [UnaryClientInterceptor]. Nil or the zero value
// means the defaults.
type ClientConfig struct {
	// Guarded reports whether calls to the full method name get a key.
	// Defaults to nil: every unary call.
	Guarded func(fullMethod string) bool
	// NewKey returns a new key. Defaults to [NewKey].
	NewKey func() string
}

// NewKey returns a new random key: 26 characters of base32 holding 128
// random bits (crypto/rand.Text).
func NewKey() string { return rand.Text() }

// WithKey returns a context whose calls carry id as their idempotency key.
// It replaces any key ctx already had. Use it for the caller's own key,
// such as one derived with [idempotency.Key.Derive]. Or use it for a key
// kept with the operation it names, so that a retry after a restart of the
// client sends it again.
func WithKey(ctx context.Context, id string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(MetadataKey, id)
	return metadata.NewOutgoingContext(ctx, md)
}

// UnaryClientInterceptor returns an interceptor that gives every guarded
// call (see [ClientConfig].Guarded) one idempotency key. It keeps the
// caller's own key if the outgoing metadata already has one ([WithKey]).
// Else it generates a new one, once per call, before its first attempt. grpc sends the same
// metadata on every attempt of its own retries, so all the attempts of a
// call carry one key. Retries that the application makes itself, with a new
// call, must reuse the key through [WithKey].
func UnaryClientInterceptor(cfg *ClientConfig) grpc.UnaryClientInterceptor {
	if cfg == nil {
		cfg = &ClientConfig{}
	}
	guarded, newKey := cfg.Guarded, cfg.NewKey
	if newKey == nil {
		newKey = NewKey
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if guarded != nil && !guarded(method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, ok := metadata.FromOutgoingContext(ctx); !ok || len(md.Get(MetadataKey)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, newKey())
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// RetryServiceConfig returns a gRPC service config (JSON, for
// grpc.WithDefaultServiceConfig) with a retry policy. It covers the calls
// of the named services ("package.Service"; none: every service). It
// retries up to 5 attempts, with exponential backoff from 100ms to 2s, on:
//
//   - UNAVAILABLE: the store or the network failed;
//   - ABORTED: a call with the same key is in progress; the server's
//     grpc-retry-pushback-ms trailer sets the delay.
//
// Together with [UnaryClientInterceptor] every attempt carries the same key.
func RetryServiceConfig(services ...string) string {
	type name struct {
		Service string `json:"service,omitempty"`
	}
	names := []name{{}}
	if len(services) > 0 {
		names = names[:0]
		for _, s := range services {
			names = append(names, name{Service: s})
		}
	}
	cfg := map[string]any{
		"methodConfig": []any{map[string]any{
			"name": names,
			"retryPolicy": map[string]any{
				"maxAttempts":          5,
				"initialBackoff":       "0.1s",
				"maxBackoff":           "2s",
				"backoffMultiplier":    2,
				"retryableStatusCodes": []string{"UNAVAILABLE", "ABORTED"},
			},
		}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		// The value above always marshals.
		return "{}"
	}
	return string(b)
}
