package certscope_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/certscope"
)

// TestCertScope: the first URI SAN, else the subject; a name longer than
// MaxScopeLen becomes its SHA-256, still a valid scope.
func TestCertScope(t *testing.T) {
	subject := pkix.Name{CommonName: "alice", Organization: []string{"Acme"}}
	spiffe, _ := url.Parse("spiffe://acme/billing")
	long, _ := url.Parse("spiffe://acme/" + strings.Repeat("x", backend.MaxScopeLen))
	for _, c := range []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"subject", &x509.Certificate{Subject: subject}, "CN=alice,O=Acme"},
		{"uri", &x509.Certificate{Subject: subject, URIs: []*url.URL{spiffe}}, "spiffe://acme/billing"},
		{"long", &x509.Certificate{URIs: []*url.URL{long}}, ""},
	} {
		got := certscope.Of(c.cert)
		if c.want != "" && got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
		if c.want == "" && (!strings.HasPrefix(got, "sha256:") || len(got) != len("sha256:")+64) {
			t.Errorf("%s: got %q, want sha256: and 64 hex digits", c.name, got)
		}
		if err := (idempotency.Key{Scope: got, ID: "k"}).Validate(); err != nil {
			t.Errorf("%s: scope %q is not valid: %v", c.name, got, err)
		}
	}
}
