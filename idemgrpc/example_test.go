package idemgrpc_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemgrpc"
	"github.com/go-idempotency/idempotency/sqlite"
)

// examplePayments is a handler of the hand-registered test service.
type examplePayments struct{}

// readme:begin grpc-handler
func (examplePayments) pay(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	tx, ok := idemgrpc.TxFrom[*sql.Tx](ctx) // the transaction that holds the call's key
	if !ok {
		return nil, status.Error(codes.Internal, "not behind idemgrpc")
	}
	amount := int64(req.GetFields()["amount"].GetNumberValue())
	res, err := tx.ExecContext(ctx, "INSERT INTO payments (amount) VALUES (?)", amount)
	if err != nil {
		return nil, err // rolled back; the key stays free
	}
	id, err := res.LastInsertId()
	if err != nil {
		return nil, err
	}
	// Stored with the reply and replayed with it.
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-payment-id", fmt.Sprint(id))); err != nil {
		return nil, err
	}
	return structpb.NewStruct(map[string]any{"payment": float64(id), "amount": float64(amount)})
}

// readme:end grpc-handler

// A unary method guarded by the server interceptor; the client interceptor
// gives the call one key, and a second call with the same key is a replay.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemgrpc-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}

	// readme:begin grpc-server
	srv := grpc.NewServer(
		grpc.Creds(insecure.NewCredentials()), // production: credentials.NewTLS with verified client certificates
		grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(guard, &idemgrpc.ServerConfig{
			// The default scope is the verified client certificate (PeerScope).
			// Without mTLS, return the principal your auth interceptor found.
			Scope: func(ctx context.Context) (string, error) { return "customer-42", nil },
			// Generated code needs no NewReply: the reply type is found in the
			// protobuf registry.
			NewReply: structReply,
		})),
	)
	// readme:end grpc-server
	srv.RegisterService(&paymentsDesc, examplePayments{})
	go srv.Serve(lis)
	defer srv.Stop()

	// readme:begin grpc-client
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)), // one key per call, kept across grpc's retries
		grpc.WithDefaultServiceConfig(idemgrpc.RetryServiceConfig("idemgrpc.test.Payments")))
	// readme:end grpc-client
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	// readme:begin grpc-call
	// An application-level retry (a new call) reuses the key explicitly.
	callCtx := idemgrpc.WithKey(ctx, "order-42-payment")
	req, _ := structpb.NewStruct(map[string]any{"amount": 1999})
	for range 2 {
		var header, trailer metadata.MD
		reply := new(structpb.Struct)
		if err := conn.Invoke(callCtx, "/idemgrpc.test.Payments/Pay", req, reply,
			grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			log.Fatal(err)
		}
		fmt.Println(reply.AsMap()["payment"], trailer.Get("x-payment-id"), header.Get(idemgrpc.MetadataReplayed))
	}
	// readme:end grpc-call
	var payments int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM payments").Scan(&payments); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", payments)
	// Output:
	// 1 [1] []
	// 1 [1] [true]
	// payments: 1
}
