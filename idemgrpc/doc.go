// Package idemgrpc puts an [idempotency.Guard] in front of unary gRPC
// methods, and gives clients an interceptor that sends one idempotency key
// per call.
//
// # Server
//
// [UnaryServerInterceptor] reads the key from the request metadata
// (idempotency-key, [MetadataKey]). It takes the scope from the
// authenticated peer ([ServerConfig].Scope, by default [PeerScope]: the
// verified TLS client certificate). It fingerprints the call (full method
// name and the request message, marshalled deterministically) and runs the
// handler inside [idempotency.Guard.Do]. The handler takes the store's open
// transaction from its context with [TxFrom] and does its writes through it.
// So the writes, the key and the stored reply commit together or not at all:
//
//	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(guard, nil)))
//	func (s *payments) Pay(ctx context.Context, req *pb.PayRequest) (*pb.PayReply, error) {
//		tx, ok := idemgrpc.TxFrom[pgx.Tx](ctx)
//		...
//	}
//
// When the handler returns:
//
//   - a reply and no error: the reply (proto.Marshal) is stored with the
//     key as an [idempotency.Response] of Status 200, its Header holding the
//     header and trailer metadata the handler set (see below), and committed
//     with the handler's writes; then the reply and the metadata go to the
//     client;
//   - an error: the handler's writes are rolled back and the key is left
//     free (a retry runs the handler again); the error and the metadata the
//     handler set go to the client as they are. Errors are never stored;
//   - a panic: rolled back and re-raised.
//
// A later call with the same key and the same fingerprint does not run the
// handler. It gets the stored reply, unmarshalled into a new message of the
// method's reply type (see [ServerConfig].NewReply). It also gets the stored
// header and trailer metadata and the header "idempotent-replayed: true".
//
// [idempotency.Response].Header stores the metadata the handler set:
//
//   - with grpc.SetHeader or grpc.SendHeader: under "Grpc-Header-" and the
//     canonical form of its key;
//   - with grpc.SetTrailer: under "Grpc-Trailer-" and the canonical form of
//     its key.
//
// Metadata keys are lower case, so the mapping is lossless. Values of binary
// ("-bin") keys are stored in standard base64. Reserved "grpc-" keys are not
// stored.
//
// # Status codes
//
//	code                 when
//	InvalidArgument      no idempotency-key on a guarded method, more than one, or one that is not 1 to 255 printable ASCII
//	Unauthenticated      the default scope found no verified client certificate (set ServerConfig.Scope)
//	FailedPrecondition   the key was used with another request (method or message); ErrorInfo reason IDEMPOTENCY_KEY_REUSED
//	Aborted              a call with the same key is still running; ErrorInfo reason IDEMPOTENCY_KEY_IN_PROGRESS,
//	                     RetryInfo (1s) and the trailer grpc-retry-pushback-ms, honoured by grpc's retry policy
//	Unavailable          the key store failed; nothing was committed; retry with the same key
//	Internal             misconfiguration: nil guard, an invalid scope, a reply that is not a proto message, the
//	                     store's table missing or out of date (idempotency.ErrSchema: no retry helps until it is migrated)
//	(the handler's)      the handler's own error, rolled back
//
// FailedPrecondition is the closest code for a reused key. The request is
// well formed, but the system (the key's record) is not in the state it
// needs, and a retry will not help. Aborted is the code gRPC names for
// concurrency conflicts that the client should retry at a higher level.
// Both carry an errdetails.ErrorInfo with Domain [ErrorDomain].
//
// # Client
//
// [UnaryClientInterceptor] gives each call one key, generated before the
// first attempt (or the caller's own, set with [WithKey]). The key is put in
// the call's outgoing metadata. grpc sends that metadata unchanged on every
// attempt of its own retries: transparent retries and the retry policy of
// the service config (see [RetryServiceConfig]). So a retried call meets the
// record of its first attempt and gets its reply.
//
// grpc retries an attempt only while no response header has reached the
// client. That covers an UNAVAILABLE or ABORTED answered trailers-only, and a
// transport failure before the reply. A reply lost after its header arrived
// fails the call. The application's retry is then a new call: it must send
// the same key with [WithKey].
//
// Only unary methods are supported.
package idemgrpc
