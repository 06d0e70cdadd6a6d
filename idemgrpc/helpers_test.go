package idemgrpc_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemgrpc"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/postgres"
	"github.com/go-idempotency/idempotency/sqlite"
)

// payMethod is the one method of the hand-registered test service: it takes
// and answers a structpb.Struct, so no code generation is needed.
const payMethod = "/idemgrpc.test.Payments/Pay"

type payer interface {
	pay(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)
}

var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "idemgrpc.test.Payments",
	HandlerType: (*payer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Pay",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return srv.(payer).pay(ctx, req.(*structpb.Struct)) }
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: payMethod}, h)
		},
	}},
}

// structReply is the test's ServerConfig.NewReply: the test service is not
// in the global registry.
func structReply(string) (proto.Message, error) { return &structpb.Struct{}, nil }

// backend is one store the tests run on.
type backend[Tx any] struct {
	guard  func(t *testing.T, cfg *idempotency.Config) *idempotency.Guard[Tx]
	insert func(ctx context.Context, tx Tx, amount int64) (int64, error)
	count  func(t *testing.T) int
}

func suffix() string { return fmt.Sprintf("%d_%d", time.Now().UnixNano(), os.Getpid()) }

func sqliteBackend(t *testing.T) backend[*sql.Tx] {
	ctx := t.Context()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return backend[*sql.Tx]{
		guard: func(t *testing.T, cfg *idempotency.Config) *idempotency.Guard[*sql.Tx] {
			store, err := sqlite.New(db, &sqlite.Config{Table: "keys_" + suffix()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { store.Close() })
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			g, err := idempotency.New(store, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return g
		},
		insert: func(ctx context.Context, tx *sql.Tx, amount int64) (int64, error) {
			res, err := tx.ExecContext(ctx, "INSERT INTO payments (amount) VALUES (?)", amount)
			if err != nil {
				return 0, err
			}
			return res.LastInsertId()
		},
		count: func(t *testing.T) int {
			var n int
			if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM payments").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func postgresBackend(t *testing.T) backend[pgx.Tx] {
	dsn := testenv.PostgresDSN(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sfx := suffix()
	payments := "idemgrpc_payments_" + sfx
	if _, err := pool.Exec(ctx, "CREATE TABLE "+payments+" (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var tables []string
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, tb := range append(tables, payments) {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	n := 0
	return backend[pgx.Tx]{
		guard: func(t *testing.T, cfg *idempotency.Config) *idempotency.Guard[pgx.Tx] {
			n++
			table := fmt.Sprintf("idemgrpc_keys_%s_%d", sfx, n)
			tables = append(tables, table)
			store, err := postgres.New(pool, &postgres.Config{Table: table})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			g, err := idempotency.New(store, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return g
		},
		insert: func(ctx context.Context, tx pgx.Tx, amount int64) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, "INSERT INTO "+payments+" (amount) VALUES ($1) RETURNING id", amount).Scan(&id)
			return id, err
		},
		count: func(t *testing.T) int {
			var n int
			if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+payments).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

// payServer implements the test service on a backend.
type payServer[Tx any] struct {
	insert  func(ctx context.Context, tx Tx, amount int64) (int64, error)
	delay   time.Duration
	started chan struct{} // if set, told when a run starts
	release chan struct{} // if set, a run waits for it
	decline bool          // insert, then fail with FailedPrecondition
	runs    atomic.Int64
}

// receiptBin is binary trailer metadata, not valid UTF-8.
const receiptBin = "\xff\x00\x01receipt"

func (s *payServer[Tx]) pay(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	tx, ok := idemgrpc.TxFrom[Tx](ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no transaction")
	}
	s.runs.Add(1)
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.release != nil {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	amount := int64(req.GetFields()["amount"].GetNumberValue())
	id, err := s.insert(ctx, tx, amount)
	if err != nil {
		return nil, err
	}
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-payment-id", fmt.Sprint(id))); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-receipt-bin", receiptBin, "x-note", "a", "x-note", "b")); err != nil {
		return nil, err
	}
	if s.decline {
		return nil, status.Error(codes.FailedPrecondition, "card declined")
	}
	return structpb.NewStruct(map[string]any{"payment": float64(id), "amount": float64(amount)})
}

// pki is a test CA with a server certificate for 127.0.0.1 and client
// certificates named by URI SANs.
type pki struct {
	pool   *x509.CertPool
	key    *ecdsa.PrivateKey
	cert   *x509.Certificate
	serial int64
}

func newPKI(t *testing.T) *pki {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idemgrpc test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{pool: x509.NewCertPool(), key: key, cert: cert, serial: 1}
	p.pool.AddCert(cert)
	return p
}

func (p *pki) issue(t *testing.T, uri string, server bool) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: uri},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p *pki) serverCreds(t *testing.T) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.issue(t, "", true)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		MinVersion:   tls.VersionTLS13,
	})
}

func (p *pki) clientCreds(t *testing.T, uri string) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.issue(t, uri, false)},
		RootCAs:      p.pool,
		MinVersion:   tls.VersionTLS13,
	})
}

// serve starts a gRPC server for srv on a free loopback port, with the
// interceptors in order, and stops it when the test ends.
func serve(t *testing.T, creds credentials.TransportCredentials, srv payer, interceptors ...grpc.UnaryServerInterceptor) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(creds), grpc.ChainUnaryInterceptor(interceptors...))
	s.RegisterService(&paymentsDesc, srv)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// dial returns a client connection to addr, closed when the test ends.
func dial(t *testing.T, addr string, creds credentials.TransportCredentials, opts ...grpc.DialOption) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// result is one call's outcome.
type result struct {
	reply           *structpb.Struct
	header, trailer metadata.MD
	err             error
}

func pay(ctx context.Context, conn *grpc.ClientConn, amount float64) result {
	var r result
	req, _ := structpb.NewStruct(map[string]any{"amount": amount})
	r.reply = new(structpb.Struct)
	r.err = conn.Invoke(ctx, payMethod, req, r.reply, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	return r
}

type sqlTx = *sql.Tx

// healthServer answers Check with one payment row written through the
// transaction, to test replays of a generated service's reply type.
type healthServer struct {
	grpc_health_v1.UnimplementedHealthServer
	insert func(ctx context.Context, tx *sql.Tx, amount int64) (int64, error)
	runs   atomic.Int64
}

func (h *healthServer) Check(ctx context.Context, req *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	tx, ok := idemgrpc.TxFrom[*sql.Tx](ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no transaction")
	}
	h.runs.Add(1)
	if _, err := h.insert(ctx, tx, 1); err != nil {
		return nil, err
	}
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

func serveHealth(t *testing.T, ic grpc.UnaryServerInterceptor, h grpc_health_v1.HealthServer) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(ic))
	grpc_health_v1.RegisterHealthServer(s, h)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// TestMain says, before the tests start, which server backends will not run
// here and the variable that enables each.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }
