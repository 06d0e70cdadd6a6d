package idemhttp

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/go-idempotency/idempotency/internal/certscope"
)

// ErrNoScope: [Middleware] was mounted without [Options].Scope (nil
// Options included). Without a scope every client would share one key
// space, and a client that sends another client's key and body would get
// that client's stored answer. Such a middleware answers every request of
// a guarded method 500 ProblemInternal, without running the handler or
// reaching the store. The error is in [RequestEvent].Err. It is reported once per
// [Middleware] to [Options].OnError (or to the http.Server's error log).
// [Options.Validate] returns it at set-up. Set Scope to the authenticated
// account, or to [SharedScope] for a service with a single tenant.
var ErrNoScope = errors.New("idemhttp: MISCONFIGURED: Options.Scope is not set, so every client would share one key space " +
	"and a client sending another client's key and body would get that client's stored answer; " +
	"set Options.Scope to the authenticated account (or to idemhttp.SharedScope for a single-tenant service). " +
	"Until then this middleware answers every guarded request 500 without running the handler")

// Validate reports whether [Middleware] would refuse c at run time: it
// returns [ErrNoScope] when c is nil or c.Scope is nil, and an error
// wrapping [idempotency.ErrInvalidConfig] for a field out of range (TTL,
// ProblemDocs, InProgressStatus, KeySchema) or an invalid [Options].Quota.
// Call it at start-up to fail there rather than on the first guarded
// request:
//
//	if err := cfg.Validate(); err != nil {
//		return err
//	}
func (c *Options) Validate() error {
	if c == nil || c.Scope == nil {
		return ErrNoScope
	}
	if c.Quota != nil {
		if err := c.Quota.Validate(); err != nil {
			return fmt.Errorf("idemhttp: Options.Quota: %w", err)
		}
	}
	return c.check()
}

// SharedScope is a [Options].Scope that puts every request in one key
// space (the empty scope). Any client that sends a key and the same
// request gets the answer stored for it, whoever sent it first. Use it
// only for a service whose clients are one tenant (an internal service
// behind a single caller); a service with accounts scopes by the
// authenticated account instead.
func SharedScope(*http.Request) (string, error) { return "", nil }

// ClientCertScope is a [Options].Scope that scopes keys by the client
// certificate the server verified. (The http.Server's TLSConfig sets
// ClientAuth to tls.VerifyClientCertIfGiven or
// tls.RequireAndVerifyClientCert.) The scope is the certificate's first URI
// SAN (a SPIFFE ID) if it has one, else its subject distinguished name
// ("CN=...,O=..."), as idemgrpc's PeerScope does. An identity longer than 255 bytes is replaced
// by "sha256:" and its hex SHA-256. A request without a verified client
// certificate (plain HTTP, no certificate, a certificate the server did
// not verify) is refused with 401 before anything is stored.
func ClientCertScope(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return "", &Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized,
			Detail: "This resource requires a verified TLS client certificate."}
	}
	return certscope.Of(r.TLS.PeerCertificates[0]), nil
}
