package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/certscope"
)

// Metadata keys and values of this package.
const (
	// MetadataKey carries the idempotency key of a call.
	MetadataKey = "idempotency-key"
	// MetadataReplayed is set to "true" in the header of a replayed reply.
	MetadataReplayed = "idempotent-replayed"
	// ErrorDomain is the Domain of the errdetails.ErrorInfo this package
	// attaches to its FailedPrecondition and Aborted errors.
	ErrorDomain = "idempotency.go-idempotency.github.com"
	// ReasonKeyReused is the ErrorInfo Reason of a reused key
	// (FailedPrecondition).
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress is the ErrorInfo Reason of a key held by a running
	// call (Aborted).
	ReasonInProgress = "IDEMPOTENCY_KEY_IN_PROGRESS"
	// StatusOK is the Status of the [idempotency.Response] a successful
	// call is stored as.
	StatusOK = http.StatusOK
	// RetryAfter is the delay suggested with Aborted, in RetryInfo and in
	// the grpc-retry-pushback-ms trailer.
	RetryAfter = time.Second
)

// Prefixes of the stored metadata in [idempotency.Response].Header.
const (
	headerPrefix  = "Grpc-Header-"
	trailerPrefix = "Grpc-Trailer-"
)

// ServerConfig configures [UnaryServerInterceptor]. Nil or the zero value
// means the defaults.
type ServerConfig struct {
	// Guarded reports whether calls to the full method name
	// ("/package.Service/Method") run under the guard. Calls to other
	// methods go to the handler untouched, without a transaction. Defaults
	// to nil: every unary method is guarded.
	Guarded func(fullMethod string) bool

	// KeyOptional lets a guarded call without an idempotency-key through to
	// the handler unprotected (no transaction in its context). Defaults to
	// false: such a call fails with InvalidArgument.
	KeyOptional bool

	// Scope returns the key space of a call: the same key in two scopes
	// never meets. It runs after the key is read. An error carrying a gRPC
	// status (status.Error) is returned to the client as it is; any other
	// error gives Internal. Defaults to [PeerScope]: the identity of the
	// verified TLS client certificate, and Unauthenticated without one. A
	// service that authenticates otherwise (tokens) returns the principal
	// its authentication interceptor put in the context; one that really
	// has a single tenant may return "".
	Scope func(ctx context.Context) (string, error)

	// NewReply returns an empty message of the reply type of fullMethod, for
	// a stored reply to be unmarshalled into. Defaults to looking the method
	// up in protoregistry.GlobalFiles and its output type in
	// protoregistry.GlobalTypes, where generated code registers them.
	NewReply func(fullMethod string) (proto.Message, error)

	// OnError, if set, is told the cause of every Unavailable and Internal
	// the interceptor answers itself, for logging; not when the client went
	// away. Defaults to nil: no report.
	OnError func(ctx context.Context, fullMethod string, err error)
}

type server struct {
	guarded  func(string) bool
	optional bool
	scope    func(context.Context) (string, error)
	newReply func(string) (proto.Message, error)
	onError  func(context.Context, string, error)
}

// TxFrom returns the transaction [UnaryServerInterceptor] opened for the
// call whose context is ctx. ok is false outside a guarded call (a method
// not guarded, an optional key left out): check it, and do not act
// without the transaction. A Tx other than the guard's transaction type
// is a programming error: TxFrom panics with an error
// naming both types, before the handler's first write (gRPC does not
// recover a handler's panic: install a recovery interceptor outside this
// one to answer Internal instead).
func TxFrom[Tx any](ctx context.Context) (tx Tx, ok bool) {
	return idempotency.TxFrom[Tx](ctx)
}

// KeyFrom returns the key (scope and id) of a guarded call, e.g. to derive
// keys for calls to other services with [idempotency.Key.Derive].
func KeyFrom(ctx context.Context) (idempotency.Key, bool) {
	return idempotency.KeyFrom(ctx)
}

// PeerScope is the default [ServerConfig].Scope. It returns the identity of
// the client certificate of a TLS peer whose chain the server verified
// (credentials.NewTLS with ClientAuth set to verify). That identity is the
// certificate's first URI SAN (a SPIFFE ID) if it has one, else its subject
// distinguished name ("CN=...,O=..."). An identity longer than 255 bytes is replaced by
// "sha256:" and its hex SHA-256. Without a verified client certificate it
// returns an Unauthenticated status error.
func PeerScope(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "idemgrpc: no peer in the call's context")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return "", status.Error(codes.Unauthenticated, "idemgrpc: the peer has no verified TLS client certificate to scope idempotency keys by (set ServerConfig.Scope)")
	}
	return certscope.Of(info.State.PeerCertificates[0]), nil
}

// UnaryServerInterceptor returns an interceptor that runs guarded unary
// calls (see [ServerConfig].Guarded) through g. The first call with a key
// runs the handler inside g's transaction and stores its reply with the
// key. Later calls with the same key and fingerprint get that reply
// replayed. The package documentation lists the codes it answers.
//
// The handler finds the transaction with [TxFrom] and must do every write
// of the operation through it. The fingerprint is the full method name and
// the request message, marshalled with deterministic field order. So the
// same key on another method or with another message is refused with
// FailedPrecondition.
//
// A nil g makes every guarded call fail with Internal: the handler never
// runs unprotected.
func UnaryServerInterceptor[Tx any](g *idempotency.Guard[Tx], cfg *ServerConfig) grpc.UnaryServerInterceptor {
	if cfg == nil {
		cfg = &ServerConfig{}
	}
	c := &server{guarded: cfg.Guarded, optional: cfg.KeyOptional, scope: cfg.Scope, newReply: cfg.NewReply, onError: cfg.OnError}
	if c.scope == nil {
		c.scope = PeerScope
	}
	if c.newReply == nil {
		c.newReply = registryReply
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c.guarded != nil && !c.guarded(info.FullMethod) {
			return handler(ctx, req)
		}
		return serve(ctx, g, c, req, info.FullMethod, handler)
	}
}

// registryReply is the default ServerConfig.NewReply.
func registryReply(fullMethod string) (proto.Message, error) {
	name := strings.TrimPrefix(fullMethod, "/")
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return nil, fmt.Errorf("idemgrpc: method name %q is not /service/method", fullMethod)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name[:i]))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: service of %q: %w", fullMethod, err)
	}
	svc, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: %s is not a service", name[:i])
	}
	m := svc.Methods().ByName(protoreflect.Name(name[i+1:]))
	if m == nil {
		return nil, fmt.Errorf("idemgrpc: service %s has no method %s", name[:i], name[i+1:])
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: reply type of %q: %w", fullMethod, err)
	}
	return mt.New().Interface(), nil
}

// handlerError carries the handler's own error out of Guard.Do, which rolls
// back on any error.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// errNotProto is returned when the handler's reply is not a proto message.
var errNotProto = errors.New("idemgrpc: the handler's reply is not a proto.Message")

func serve[Tx any](ctx context.Context, g *idempotency.Guard[Tx], c *server, req any, method string, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	switch {
	case len(values) == 0 && c.optional:
		return handler(ctx, req)
	case len(values) == 0:
		return nil, status.Errorf(codes.InvalidArgument, "idemgrpc: %s requires the metadata %s", method, MetadataKey)
	case len(values) > 1:
		return nil, status.Errorf(codes.InvalidArgument, "idemgrpc: the metadata %s appears %d times", MetadataKey, len(values))
	}
	key := idempotency.Key{ID: values[0]}
	if err := key.Validate(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v; send 1 to 255 printable ASCII characters", err)
	}
	if g == nil {
		return nil, internal(ctx, c, method, errors.New("idemgrpc: UnaryServerInterceptor was given a nil Guard"))
	}
	scope, err := c.scope(ctx)
	if err != nil {
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
			return nil, err
		}
		return nil, internal(ctx, c, method, fmt.Errorf("idemgrpc: ServerConfig.Scope: %w", err))
	}
	key.Scope = scope
	if err := key.Validate(); err != nil {
		return nil, internal(ctx, c, method, fmt.Errorf("idemgrpc: ServerConfig.Scope returned an invalid scope: %w", err))
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, internal(ctx, c, method, fmt.Errorf("idemgrpc: the request of %s is a %T, not a proto.Message", method, req))
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, internal(ctx, c, method, fmt.Errorf("idemgrpc: marshal the request: %w", err))
	}
	fp := idempotency.Fingerprint([]byte(method), body)

	var (
		last  *capture
		reply any
	)
	resp, err := g.Do(ctx, key, fp, func(tx Tx) (idempotency.Response, error) {
		// fn runs again after a retryable store conflict: every run gets
		// fresh metadata.
		cs := &capture{method: method}
		last = cs
		hctx := grpc.NewContextWithServerTransportStream(idempotency.WithTx(ctx, tx, key), cs)
		r, err := handler(hctx, req)
		if err != nil {
			return idempotency.Response{}, &handlerError{err: err}
		}
		out, ok := r.(proto.Message)
		if !ok {
			return idempotency.Response{}, fmt.Errorf("%w: %T", errNotProto, r)
		}
		b, err := proto.Marshal(out)
		if err != nil {
			return idempotency.Response{}, fmt.Errorf("%w: marshal the reply: %w", errNotProto, err)
		}
		reply = r
		h := http.Header{}
		storeMD(h, headerPrefix, cs.header)
		storeMD(h, trailerPrefix, cs.trailer)
		return idempotency.Response{Status: StatusOK, Header: h, Body: b}, nil
	})
	switch {
	case err == nil && resp.Replayed:
		out, rerr := c.newReply(method)
		if rerr == nil {
			rerr = proto.Unmarshal(resp.Body, out)
		}
		if rerr != nil {
			return nil, internal(ctx, c, method, fmt.Errorf("idemgrpc: replay the stored reply: %w", rerr))
		}
		header, trailer := loadMD(resp.Header)
		header.Set(MetadataReplayed, "true")
		if err := sendMD(ctx, header, trailer); err != nil {
			return nil, err
		}
		return out, nil
	case err == nil:
		if err := sendMD(ctx, last.header, last.trailer); err != nil {
			return nil, err
		}
		return reply, nil
	}
	if he, ok := errors.AsType[*handlerError](err); ok {
		// The handler's own error, rolled back: forwarded as it is, with the
		// metadata it set.
		if last != nil {
			_ = sendMD(ctx, last.header, last.trailer)
		}
		return nil, he.err
	}
	return nil, fail(ctx, c, method, err)
}

// fail maps an error of Guard.Do to a status.
func fail(ctx context.Context, c *server, method string, err error) error {
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		return withDetails(status.New(codes.FailedPrecondition,
			"idemgrpc: the idempotency key was used with a different request (method or message); use a new key for a new request"),
			&errdetails.ErrorInfo{Reason: ReasonKeyReused, Domain: ErrorDomain})
	case errors.Is(err, idempotency.ErrInProgress):
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(RetryAfter.Milliseconds(), 10)))
		return withDetails(status.New(codes.Aborted,
			"idemgrpc: a call with this idempotency key is in progress; retry later with the same key to get its reply"),
			&errdetails.ErrorInfo{Reason: ReasonInProgress, Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(RetryAfter)})
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return status.FromContextError(err).Err()
	case errors.Is(err, errNotProto), errors.Is(err, idempotency.ErrInvalidResponse),
		errors.Is(err, idempotency.ErrInvalidKey), errors.Is(err, idempotency.ErrInvalidFingerprint),
		errors.Is(err, idempotency.ErrSchema): // a missing table: Internal, which no retry policy retries
		return internal(ctx, c, method, err)
	}
	if c.onError != nil {
		c.onError(ctx, method, err)
	}
	return status.Error(codes.Unavailable,
		"idemgrpc: the idempotency store failed; the call was not processed (or was rolled back); retry with the same key")
}

func internal(ctx context.Context, c *server, method string, err error) error {
	if c.onError != nil {
		c.onError(ctx, method, err)
	}
	return status.Error(codes.Internal, "idemgrpc: idempotency interceptor failed")
}

func withDetails(s *status.Status, details ...protoadapt.MessageV1) error {
	d, err := s.WithDetails(details...)
	if err != nil {
		return s.Err()
	}
	return d.Err()
}
