package idemgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemgrpc"
)

func TestSQLite(t *testing.T)   { runBackend(t, sqliteBackend) }
func TestPostgres(t *testing.T) { runBackend(t, postgresBackend) }

func runBackend[Tx any](t *testing.T, newBackend func(*testing.T) backend[Tx]) {
	t.Run("Concurrent20", func(t *testing.T) { testConcurrent(t, newBackend(t)) })
	t.Run("ReplayMismatchScope", func(t *testing.T) { testReplayMismatchScope(t, newBackend(t)) })
	t.Run("InProgress", func(t *testing.T) { testInProgress(t, newBackend(t)) })
	t.Run("HandlerErrorRollsBack", func(t *testing.T) { testHandlerError(t, newBackend(t)) })
	t.Run("ClientKeyAcrossGRPCRetries", func(t *testing.T) { testGRPCRetries(t, newBackend(t)) })
}

func marshal(t *testing.T, m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// 20 concurrent calls with one key: one effect, 20 identical replies and
// trailers, 19 of them replays.
func testConcurrent[Tx any](t *testing.T, b backend[Tx]) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	p := newPKI(t)
	srv := &payServer[Tx]{insert: b.insert, delay: 50 * time.Millisecond}
	addr := serve(t, p.serverCreds(t), srv,
		idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{NewReply: structReply}))
	conn := dial(t, addr, p.clientCreds(t, "spiffe://test/client-a"),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))

	const n = 20
	results := make([]result, n)
	var wg sync.WaitGroup
	kctx := idemgrpc.WithKey(ctx, "order-42")
	for i := range n {
		wg.Go(func() { results[i] = pay(kctx, conn, 1999) })
	}
	wg.Wait()

	replays := 0
	var first []byte
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("call %d: %v", i, r.err)
		}
		got := marshal(t, r.reply)
		if first == nil {
			first = got
		} else if !bytes.Equal(got, first) {
			t.Errorf("call %d replied %x, call 0 %x", i, got, first)
		}
		if r.header.Get(idemgrpc.MetadataReplayed) != nil {
			replays++
		}
		if got := r.header.Get("x-payment-id"); len(got) != 1 || got[0] != "1" {
			t.Errorf("call %d: header x-payment-id = %q, want [1]", i, got)
		}
		if got := r.trailer.Get("x-receipt-bin"); len(got) != 1 || got[0] != receiptBin {
			t.Errorf("call %d: trailer x-receipt-bin = %q, want [%q]", i, got, receiptBin)
		}
		if got := r.trailer.Get("x-note"); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("call %d: trailer x-note = %q, want [a b]", i, got)
		}
	}
	if replays != n-1 {
		t.Errorf("%d replays, want %d", replays, n-1)
	}
	if got := results[0].reply.GetFields()["payment"].GetNumberValue(); got != 1 {
		t.Errorf("payment = %v, want 1", got)
	}
	if got := b.count(t); got != 1 {
		t.Errorf("%d payment rows, want 1", got)
	}
	if got := srv.runs.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
}

func errorInfo(t *testing.T, err error) (codes.Code, *errdetails.ErrorInfo, *errdetails.RetryInfo) {
	t.Helper()
	s, ok := status.FromError(err)
	if !ok {
		t.Fatalf("%v is not a gRPC status", err)
	}
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range s.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	return s.Code(), info, retry
}

func testReplayMismatchScope[Tx any](t *testing.T, b backend[Tx]) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := newPKI(t)
	srv := &payServer[Tx]{insert: b.insert}
	addr := serve(t, p.serverCreds(t), srv,
		idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{NewReply: structReply}))
	a := dial(t, addr, p.clientCreds(t, "spiffe://test/client-a"))
	bc := dial(t, addr, p.clientCreds(t, "spiffe://test/client-b"))
	kctx := idemgrpc.WithKey(ctx, "k1")

	first := pay(kctx, a, 100)
	again := pay(kctx, a, 100)
	if first.err != nil || again.err != nil {
		t.Fatalf("first: %v, again: %v", first.err, again.err)
	}
	if !bytes.Equal(marshal(t, first.reply), marshal(t, again.reply)) || again.header.Get(idemgrpc.MetadataReplayed)[0] != "true" {
		t.Fatalf("replay %v (header %v), first %v", again.reply, again.header, first.reply)
	}
	if first.header.Get(idemgrpc.MetadataReplayed) != nil {
		t.Errorf("first call has header %v", first.header)
	}

	// Same key, another amount: refused, nothing runs.
	other := pay(kctx, a, 200)
	code, info, _ := errorInfo(t, other.err)
	if code != codes.FailedPrecondition || info == nil || info.Reason != idemgrpc.ReasonKeyReused || info.Domain != idemgrpc.ErrorDomain {
		t.Errorf("other request with the same key: %v (info %v), want FailedPrecondition %s", other.err, info, idemgrpc.ReasonKeyReused)
	}

	// Same key from another client certificate: another scope, a new effect.
	theirs := pay(kctx, bc, 100)
	if theirs.err != nil || theirs.header.Get(idemgrpc.MetadataReplayed) != nil {
		t.Fatalf("client b: %v, header %v", theirs.err, theirs.header)
	}
	if got := b.count(t); got != 2 {
		t.Errorf("%d payment rows, want 2 (one per client)", got)
	}

	// No key (no client interceptor, no WithKey) and bad keys.
	for name, c := range map[string]context.Context{
		"missing":  ctx,
		"twice":    metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "x", idemgrpc.MetadataKey, "y"),
		"empty":    idemgrpc.WithKey(ctx, ""),
		"too long": idemgrpc.WithKey(ctx, string(bytes.Repeat([]byte{'k'}, 256))),
	} {
		if r := pay(c, a, 100); status.Code(r.err) != codes.InvalidArgument {
			t.Errorf("%s key: %v, want InvalidArgument", name, r.err)
		}
	}
	if got := b.count(t); got != 2 || srv.runs.Load() != 2 {
		t.Errorf("%d payment rows and %d runs after refused calls, want 2 and 2", got, srv.runs.Load())
	}
}

func testInProgress[Tx any](t *testing.T, b backend[Tx]) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := newPKI(t)
	srv := &payServer[Tx]{insert: b.insert, started: make(chan struct{}, 1), release: make(chan struct{})}
	addr := serve(t, p.serverCreds(t), srv,
		idemgrpc.UnaryServerInterceptor(b.guard(t, &idempotency.Config{WaitTimeout: -1}), &idemgrpc.ServerConfig{NewReply: structReply}))
	conn := dial(t, addr, p.clientCreds(t, "spiffe://test/client-a"))
	kctx := idemgrpc.WithKey(ctx, "slow")

	firstc := make(chan result, 1)
	go func() { firstc <- pay(kctx, conn, 5) }()
	select {
	case <-srv.started:
	case <-ctx.Done():
		t.Fatal("the first call did not start")
	}
	second := pay(kctx, conn, 5)
	code, info, retry := errorInfo(t, second.err)
	if code != codes.Aborted || info == nil || info.Reason != idemgrpc.ReasonInProgress {
		t.Errorf("second call: %v (info %v), want Aborted %s", second.err, info, idemgrpc.ReasonInProgress)
	}
	if retry == nil || retry.RetryDelay.AsDuration() != time.Second {
		t.Errorf("RetryInfo %v, want 1s", retry)
	}
	if got := second.trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "1000" {
		t.Errorf("trailer grpc-retry-pushback-ms = %q, want [1000]", got)
	}
	close(srv.release)
	if r := <-firstc; r.err != nil {
		t.Fatalf("first call: %v", r.err)
	}
	third := pay(kctx, conn, 5)
	if third.err != nil || third.header.Get(idemgrpc.MetadataReplayed) == nil {
		t.Errorf("after the first call: %v, header %v; want a replay", third.err, third.header)
	}
	if got := b.count(t); got != 1 || srv.runs.Load() != 1 {
		t.Errorf("%d rows, %d runs; want 1 and 1", got, srv.runs.Load())
	}
}

func testHandlerError[Tx any](t *testing.T, b backend[Tx]) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := newPKI(t)
	srv := &payServer[Tx]{insert: b.insert, decline: true}
	addr := serve(t, p.serverCreds(t), srv,
		idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{NewReply: structReply}))
	conn := dial(t, addr, p.clientCreds(t, "spiffe://test/client-a"))
	kctx := idemgrpc.WithKey(ctx, "declined")

	r := pay(kctx, conn, 7)
	if s, _ := status.FromError(r.err); s.Code() != codes.FailedPrecondition || s.Message() != "card declined" {
		t.Fatalf("declined call: %v, want the handler's FailedPrecondition card declined", r.err)
	}
	if got := r.trailer.Get("x-note"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("the handler's trailer on its error: x-note = %q, want [a b]", got)
	}
	if got := b.count(t); got != 0 {
		t.Fatalf("%d payment rows after the handler's error, want 0 (rolled back)", got)
	}
	// The key is free: the retry runs the handler again.
	srv.decline = false
	if r := pay(kctx, conn, 7); r.err != nil || r.header.Get(idemgrpc.MetadataReplayed) != nil {
		t.Fatalf("retry: %v, header %v; want a first execution", r.err, r.header)
	}
	if got := b.count(t); got != 1 || srv.runs.Load() != 2 {
		t.Errorf("%d rows, %d runs; want 1 and 2", got, srv.runs.Load())
	}
}

// The first attempt commits, then its reply is lost: an interceptor in
// front drops the metadata and answers Unavailable, trailers only (as a
// proxy that lost its upstream would). grpc's retry policy sends the call
// again with the key the client interceptor put in it, and the retry is a
// replay.
func testGRPCRetries[Tx any](t *testing.T, b backend[Tx]) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := newPKI(t)
	srv := &payServer[Tx]{insert: b.insert}
	var (
		mu   sync.Mutex
		keys []string
	)
	lose := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		keys = append(keys, md.Get(idemgrpc.MetadataKey)...)
		attempt := len(keys)
		mu.Unlock()
		if attempt > 1 {
			return handler(ctx, req)
		}
		if _, err := handler(grpc.NewContextWithServerTransportStream(ctx, discard{}), req); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, "reply lost")
	}
	addr := serve(t, p.serverCreds(t), srv, lose,
		idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{NewReply: structReply}))
	conn := dial(t, addr, p.clientCreds(t, "spiffe://test/client-a"),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)),
		grpc.WithDefaultServiceConfig(idemgrpc.RetryServiceConfig("idemgrpc.test.Payments")))

	r := pay(ctx, conn, 3)
	if r.err != nil {
		t.Fatalf("call: %v", r.err)
	}
	if r.header.Get(idemgrpc.MetadataReplayed) == nil {
		t.Errorf("the retried attempt was not a replay: header %v", r.header)
	}
	mu.Lock()
	if len(keys) != 2 || keys[0] != keys[1] || len(keys[0]) != 26 {
		t.Errorf("attempts carried keys %q, want two equal 26-character keys", keys)
	}
	mu.Unlock()
	if got := b.count(t); got != 1 || srv.runs.Load() != 1 {
		t.Errorf("%d rows, %d runs; want 1 and 1", got, srv.runs.Load())
	}
	// A second call gets a new key, hence a second effect.
	if r := pay(ctx, conn, 3); r.err != nil {
		t.Fatal(r.err)
	}
	mu.Lock()
	if len(keys) != 3 || keys[2] == keys[0] {
		t.Errorf("keys %q: the second call should carry a new key", keys)
	}
	mu.Unlock()
	if got := b.count(t); got != 2 {
		t.Errorf("%d rows after a second call, want 2", got)
	}
}

// Without a verified client certificate the default scope refuses the call
// before anything is stored.
func TestPeerScopeUnauthenticated(t *testing.T) {
	b := sqliteBackend(t)
	s := &payServer[sqlTx]{insert: b.insert}
	addr := serve(t, insecure.NewCredentials(), s,
		idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{NewReply: structReply}))
	conn := dial(t, addr, insecure.NewCredentials())
	r := pay(idemgrpc.WithKey(t.Context(), "k"), conn, 1)
	if status.Code(r.err) != codes.Unauthenticated {
		t.Fatalf("call without a client certificate: %v, want Unauthenticated", r.err)
	}
	if got := b.count(t); got != 0 || s.runs.Load() != 0 {
		t.Errorf("%d rows, %d runs; want 0", got, s.runs.Load())
	}
}

// A Scope that fails with a status is answered with it; a nil guard is
// Internal; an unguarded method passes through without a transaction.
func TestConfig(t *testing.T) {
	b := sqliteBackend(t)
	s := &payServer[sqlTx]{insert: b.insert}
	var logged []error
	var mu sync.Mutex
	onError := func(_ context.Context, method string, err error) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, err)
	}
	denied := idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{
		Scope: func(context.Context) (string, error) { return "", status.Error(codes.PermissionDenied, "no") },
	})
	nilGuard := idemgrpc.UnaryServerInterceptor[sqlTx](nil, &idemgrpc.ServerConfig{OnError: onError})
	unguarded := idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{Guarded: func(string) bool { return false }})
	shared := idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{
		Scope:    func(context.Context) (string, error) { return "", nil },
		NewReply: func(string) (proto.Message, error) { return nil, errors.New("no type") },
		OnError:  onError,
	})
	for name, tc := range map[string]struct {
		ic   grpc.UnaryServerInterceptor
		want codes.Code
	}{
		"scope status": {denied, codes.PermissionDenied},
		"nil guard":    {nilGuard, codes.Internal},
		"unguarded":    {unguarded, codes.Internal}, // the handler finds no transaction
	} {
		addr := serve(t, insecure.NewCredentials(), s, tc.ic)
		conn := dial(t, addr, insecure.NewCredentials())
		if r := pay(idemgrpc.WithKey(t.Context(), "k"), conn, 1); status.Code(r.err) != tc.want {
			t.Errorf("%s: %v, want %v", name, r.err, tc.want)
		}
		if r := pay(idemgrpc.WithKey(t.Context(), "k"), conn, 1); status.Code(r.err) != tc.want {
			t.Errorf("%s (again): %v, want %v", name, r.err, tc.want)
		}
	}
	if s.runs.Load() != 0 || b.count(t) != 0 {
		t.Errorf("%d runs, %d rows; want 0", s.runs.Load(), b.count(t))
	}
	// A reply that cannot be replayed: the first call executes, the replay
	// fails with Internal (and is logged), nothing runs twice.
	addr := serve(t, insecure.NewCredentials(), s, shared)
	conn := dial(t, addr, insecure.NewCredentials())
	if r := pay(idemgrpc.WithKey(t.Context(), "k"), conn, 1); r.err != nil {
		t.Fatal(r.err)
	}
	if r := pay(idemgrpc.WithKey(t.Context(), "k"), conn, 1); status.Code(r.err) != codes.Internal {
		t.Errorf("replay without a reply type: %v, want Internal", r.err)
	}
	if s.runs.Load() != 1 || b.count(t) != 1 {
		t.Errorf("%d runs, %d rows; want 1", s.runs.Load(), b.count(t))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) != 3 {
		t.Errorf("OnError told %d errors (%v), want 3 (nil guard twice, replay once)", len(logged), logged)
	}
}

// The default NewReply finds the reply type of generated code in the global
// registry; the health service is such code.
func TestRegistryReply(t *testing.T) {
	h := &healthServer{}
	b := sqliteBackend(t)
	h.insert = b.insert
	lis := serveHealth(t, idemgrpc.UnaryServerInterceptor(b.guard(t, nil), &idemgrpc.ServerConfig{
		Scope: func(context.Context) (string, error) { return "tenant", nil },
	}), h)
	conn := dial(t, lis, insecure.NewCredentials(), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	client := grpc_health_v1.NewHealthClient(conn)
	ctx := idemgrpc.WithKey(t.Context(), "health-1")
	var header metadata.MD
	first, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "s"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "s"}, grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) || again.Status != grpc_health_v1.HealthCheckResponse_SERVING || header.Get(idemgrpc.MetadataReplayed) == nil {
		t.Errorf("replay %v (header %v), first %v", again, header, first)
	}
	if h.runs.Load() != 1 || b.count(t) != 1 {
		t.Errorf("%d runs, %d rows; want 1", h.runs.Load(), b.count(t))
	}
	// Another method of the same service (Watch is streaming, not
	// intercepted); another request is a mismatch.
	if _, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "other"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("other request: %v, want FailedPrecondition", err)
	}
}

// discard is a ServerTransportStream that drops the metadata set on it.
type discard struct{}

func (discard) Method() string               { return payMethod }
func (discard) SetHeader(metadata.MD) error  { return nil }
func (discard) SendHeader(metadata.MD) error { return nil }
func (discard) SetTrailer(metadata.MD) error { return nil }
