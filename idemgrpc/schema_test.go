package idemgrpc_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemgrpc"
	"github.com/go-idempotency/idempotency/sqlite"
)

// TestSchemaMissing: a keys table that does not exist (never migrated)
// answers Internal, not Unavailable (which clients and grpc retry
// policies retry), and the handler does not run; OnError gets the
// ErrSchema that names the table, the client does not.
func TestSchemaMissing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "schema.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlite.New(db, &sqlite.Config{Table: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		causes []error
	)
	p := newPKI(t)
	srv := &payServer[*sql.Tx]{insert: func(context.Context, *sql.Tx, int64) (int64, error) { return 1, nil }}
	addr := serve(t, p.serverCreds(t), srv, idemgrpc.UnaryServerInterceptor(g, &idemgrpc.ServerConfig{NewReply: structReply,
		OnError: func(_ context.Context, _ string, err error) {
			mu.Lock()
			defer mu.Unlock()
			causes = append(causes, err)
		}}))
	conn := dial(t, addr, p.clientCreds(t, "spiffe://test/client-a"))
	r := pay(idemgrpc.WithKey(ctx, "k"), conn, 5)
	s, _ := status.FromError(r.err)
	if s.Code() != codes.Internal || strings.Contains(s.Message(), "never_migrated") {
		t.Fatalf("got %v; want Internal, without the table's name", r.err)
	}
	if srv.runs.Load() != 0 {
		t.Errorf("the handler ran %d times; want 0", srv.runs.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(causes) != 1 || !errors.Is(causes[0], idempotency.ErrSchema) || errors.Is(causes[0], idempotency.ErrStore) ||
		!strings.Contains(causes[0].Error(), "never_migrated") {
		t.Errorf("OnError got %v; want one ErrSchema naming the table, not ErrStore", causes)
	}
}
