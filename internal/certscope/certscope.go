// Package certscope names the key scope of a verified client certificate,
// for the HTTP and gRPC integrations, which must agree on it.
package certscope

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"

	"github.com/go-idempotency/idempotency/backend"
)

// Of is the key scope that a verified client certificate names:
// its first URI SAN, else its subject's distinguished name. A name longer
// than [backend.MaxScopeLen] is replaced by "sha256:" and its hex SHA-256. The HTTP
// and gRPC integrations scope keys by it; the caller must have verified
// the certificate's chain.
func Of(leaf *x509.Certificate) string {
	id := leaf.Subject.String()
	if len(leaf.URIs) > 0 {
		id = leaf.URIs[0].String()
	}
	if len(id) > backend.MaxScopeLen {
		sum := sha256.Sum256([]byte(id))
		id = "sha256:" + hex.EncodeToString(sum[:])
	}
	return id
}
