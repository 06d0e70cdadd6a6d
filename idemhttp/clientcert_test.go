package idemhttp_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// testCA issues client certificates for the ClientCertScope test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// client returns a TLS client certificate for cn, with uri as its URI SAN
// if not empty.
func (ca *testCA) client(t *testing.T, serial int64, cn, uri string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientCertScope: over real TLS, two clients with verified
// certificates and the same key and body get their own answers; a client
// without a certificate, or with one the server did not verify, is refused
// with 401 before the handler runs.
func TestClientCertScope(t *testing.T) {
	t.Parallel()
	e := sqliteEnv(t)
	ca := newTestCA(t)
	alice := ca.client(t, 2, "alice", "spiffe://example.org/alice")
	bob := ca.client(t, 3, "bob", "")
	var runs atomic.Int64
	handler := idemhttp.Middleware(e.newGuard(nil), &idemhttp.Options{Scope: idemhttp.ClientCertScope})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			tx, _ := idempotency.TxFrom[*sql.Tx](r.Context())
			key, _ := idempotency.KeyFrom(r.Context())
			if err := e.effect(r.Context(), tx, key.Scope+"/"+key.ID); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"run":%d}`, n)
		}))
	start := func(auth tls.ClientAuthType) *httptest.Server {
		srv := httptest.NewUnstartedServer(handler)
		srv.TLS = &tls.Config{ClientAuth: auth, ClientCAs: ca.pool}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv
	}
	post := func(srv *httptest.Server, cert *tls.Certificate) result {
		t.Helper()
		tr := srv.Client().Transport.(*http.Transport).Clone()
		if cert != nil {
			tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
		}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":100}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultKeyHeader, "same-key")
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return result{resp.StatusCode, resp.Header, b}
	}

	verified := start(tls.VerifyClientCertIfGiven)
	a := post(verified, &alice)
	wantStatus(t, a, http.StatusCreated)
	b := post(verified, &bob)
	wantStatus(t, b, http.StatusCreated)
	if string(a.body) == string(b.body) || b.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Errorf("bob got %q (replayed %q), alice %q: two certificates shared one answer", b.body, b.header.Get(idemhttp.HeaderReplayed), a.body)
	}
	wantReplay(t, a, post(verified, &alice))
	wantProblem(t, post(verified, nil), http.StatusUnauthorized, "about:blank")
	// A certificate the server asked for but did not verify is no identity.
	wantProblem(t, post(start(tls.RequireAnyClientCert), &alice), http.StatusUnauthorized, "about:blank")
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (alice once, bob once)", n)
	}
	ctx := t.Context()
	for tag, want := range map[string]int{"spiffe://example.org/alice/same-key": 1, "CN=bob/same-key": 1, "/same-key": 0} {
		if got := e.count(ctx, tag); got != want {
			t.Errorf("%d effects for %q, want %d", got, tag, want)
		}
	}
}
