// Package idemnats runs NATS JetStream message handlers under
// [idempotency.Guard.Do], keyed by the message's identity, so that a
// redelivered message replays its stored result instead of running its
// effect again.
//
// JetStream delivers at least once: a consumer that commits its effect and
// dies before its acknowledgement reaches the server gets the message again
// after AckWait. With a [Consumer], the handler's effect runs in the key
// store's transaction (a pgx.Tx, a *sql.Tx). It commits together with the
// message's key and the handler's result. The redelivery finds the key
// completed: the handler does not run, and the message is acknowledged.
//
// The handler returns bytes, not an HTTP response. The Consumer stores them
// as the key's response with the fixed status [Status], so a record of the
// keys table written by a message reads 200. On every replay it hands them
// back, byte-exact, in [idemqueue.Result].Body.
//
// What the Consumer does with a message:
//
//   - fn succeeded, or the key was already completed with the same
//     fingerprint: acknowledged with DoubleAck (the server confirms it).
//   - fn failed, the store failed, or another consumer held the key past the
//     guard's wait bound: NakWithDelay with [Config].Backoff, so the server
//     redelivers it later. The rolled-back attempt left no effect.
//   - The key was completed by another message ([idempotency.ErrMismatch]),
//     the key or fingerprint could not be derived, or fn returned an error
//     marked with [Permanent]: terminated (Term); JetStream never redelivers
//     it and publishes a MSG_TERMINATED advisory.
//
// A message whose handler always fails (a poison message) is redelivered
// after each backoff until the consumer's MaxDeliver is reached. Then
// JetStream stops delivering it and leaves it in the stream. It publishes
// an advisory naming the message's stream sequence on
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>. That
// subject is the dead-letter queue. Set
// MaxDeliver on every consumer you run this on; with the default (-1) a
// poison message is retried forever, at the pace of the backoff.
package idemnats

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue"
)

// Status is the HTTP-style status stored with every message's key: the
// handler's result is kept as the body of a 200 response.
const Status = idemqueue.Status

// ErrPermanent marks errors that redelivery cannot cure; see [Permanent].
// It is [idemqueue.ErrPermanent], shared by every consumer of this
// repository.
var ErrPermanent = idemqueue.ErrPermanent

// Permanent wraps err so that the [Consumer] terminates the message instead
// of asking for a redelivery. errors.Is(Permanent(err), err) and
// errors.Is(Permanent(err), ErrPermanent) both hold. Permanent(nil) is nil.
func Permanent(err error) error {
	return idemqueue.Permanent(err)
}

// Handler processes one JetStream message in the key store's transaction
// tx; see [idemqueue.Handler].
type Handler[Tx any] = idemqueue.Handler[Tx, jetstream.Msg]

// Config configures a [Consumer]. Scope is required: a nil Config gives an
// error.
type Config struct {
	// Scope is the key scope of every message this consumer handles: name
	// the consuming application or durable consumer ("billing"). Two
	// consumers that must each run their own effect for the same message
	// need distinct scopes; two instances of one consumer share one. It has
	// no default: a consumer name generated per process (an ephemeral or
	// ordered consumer) would make every restart re-run the effects.
	Scope string
	// Key returns the key id of a message: 1 to 255 printable ASCII bytes;
	// a longer or other id is replaced by "sha256:" and its hex digest.
	// Defaults to [DefaultKey]: the Nats-Msg-Id header, else the stream
	// name and sequence.
	Key func(msg jetstream.Msg) (string, error)
	// Fingerprint returns the fingerprint of a message; a message with the
	// key of a completed one but another fingerprint is terminated.
	// Defaults to [DefaultFingerprint]: subject and data.
	Fingerprint func(msg jetstream.Msg) (string, error)
	// Backoff is the redelivery delay asked for after a failure, given how
	// many times the message has been delivered (1 for the first). Defaults
	// to [DefaultBackoff].
	Backoff func(delivered uint64) time.Duration
	// ProgressInterval, if positive, makes the Consumer send the server
	// "work in progress" (which resets AckWait) at this interval while the
	// handler runs. Then a handler slower than AckWait is not redelivered
	// to another consumer meanwhile. Keep it below AckWait. Defaults to 0:
	// none is sent.
	ProgressInterval time.Duration
	// OnError, if set, is told about every error of the message handler
	// returned by [Consumer.MessageHandler]. Defaults to nil: no report.
	OnError func(ctx context.Context, msg jetstream.Msg, err error)
}

// Consumer runs a [Handler] on JetStream messages under a Guard. It is safe
// for concurrent use; build it with [New].
type Consumer[Tx any] struct {
	q       *idemqueue.Consumer[Tx, jetstream.Msg]
	onError func(ctx context.Context, msg jetstream.Msg, err error)
}

// New returns a Consumer running h under guard. A nil guard, h or cfg, or
// an empty or invalid [Config].Scope, gives an error wrapping
// [idempotency.ErrInvalidConfig].
func New[Tx any](guard *idempotency.Guard[Tx], h Handler[Tx], cfg *Config) (*Consumer[Tx], error) {
	switch {
	case cfg == nil:
		return nil, fmt.Errorf("%w: idemnats: nil Config: Scope is required", idempotency.ErrInvalidConfig)
	case cfg.ProgressInterval < 0:
		return nil, fmt.Errorf("%w: idemnats: negative ProgressInterval", idempotency.ErrInvalidConfig)
	}
	q, err := idemqueue.NewConsumer(guard, h, broker{cfg: *cfg}, cfg.Scope)
	if err != nil {
		return nil, fmt.Errorf("idemnats: %w", err)
	}
	return &Consumer[Tx]{q: q, onError: cfg.OnError}, nil
}

// DefaultKey is the default [Config].Key. It returns "id:" and the
// message's Nats-Msg-Id header: the publisher's identity of the message,
// which JetStream also deduplicates on. Without that header it returns
// "seq:<stream>:<stream sequence>". That key is stable across redeliveries,
// but not across a purge or re-creation of the stream.
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return "id:" + id, nil
	}
	md, err := msg.Metadata()
	if err != nil {
		return "", fmt.Errorf("idemnats: message without %s nor JetStream metadata: %w", jetstream.MsgIDHeader, err)
	}
	return "seq:" + md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10), nil
}

// DefaultFingerprint is the default [Config].Fingerprint: the hex SHA-256
// of the message's subject and data ([idempotency.Fingerprint]).
func DefaultFingerprint(msg jetstream.Msg) (string, error) {
	return idempotency.Fingerprint([]byte(msg.Subject()), msg.Data()), nil
}

// DefaultBackoff is the default [Config].Backoff: 1s after the first
// delivery, doubling, at most 1 minute.
func DefaultBackoff(delivered uint64) time.Duration {
	if delivered < 1 {
		delivered = 1
	}
	if delivered > 7 {
		return time.Minute
	}
	return min(time.Second<<(delivered-1), time.Minute)
}

// Handle runs the handler on msg under the message's key and then acks,
// naks or terminates msg (see the package documentation). The verdict of
// the result is [idemqueue.Ack], [idemqueue.Retry] (nak with a delay) or
// [idemqueue.Drop] (terminated); zero if the reply to the server failed.
// The error is nil when msg was acked. Otherwise it says why: errors.Is
// finds the handler's own error, [idempotency.ErrMismatch], [ErrPermanent],
// and so on. It is joined with the error of the reply to the server if that failed
// too.
func (c *Consumer[Tx]) Handle(ctx context.Context, msg jetstream.Msg) (idemqueue.Result, error) {
	return c.q.Handle(ctx, msg)
}

// MessageHandler returns a jetstream.MessageHandler, for
// jetstream.Consumer.Consume, that calls [Consumer.Handle] with ctx and
// passes its errors to [Config].OnError.
func (c *Consumer[Tx]) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		if _, err := c.Handle(ctx, msg); err != nil && c.onError != nil {
			c.onError(ctx, msg, err)
		}
	}
}

// broker is the JetStream glue of a Consumer.
type broker struct{ cfg Config }

func (b broker) Key(msg jetstream.Msg) (string, error) {
	if b.cfg.Key == nil {
		return DefaultKey(msg)
	}
	return b.cfg.Key(msg)
}

func (b broker) Fingerprint(msg jetstream.Msg) (string, error) {
	if b.cfg.Fingerprint == nil {
		return DefaultFingerprint(msg)
	}
	return b.cfg.Fingerprint(msg)
}

// backoff is the Backoff of the Config, or its default.
func (b broker) backoff() func(delivered uint64) time.Duration {
	if b.cfg.Backoff == nil {
		return DefaultBackoff
	}
	return b.cfg.Backoff
}

// InProgress sends InProgress every ProgressInterval until stop is called.
func (b broker) InProgress(msg jetstream.Msg) (stop func()) {
	if b.cfg.ProgressInterval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(b.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// Ack acks with DoubleAck: the server confirms it.
func (b broker) Ack(ctx context.Context, msg jetstream.Msg) error { return msg.DoubleAck(ctx) }

// Retry naks msg with the backoff's delay, or none when ctx is done (a
// consumer shutting down hands the message back at once).
func (b broker) Retry(ctx context.Context, msg jetstream.Msg) error {
	delay := time.Duration(0)
	if ctx.Err() == nil {
		delay = b.backoff()(delivered(msg))
	}
	return msg.NakWithDelay(delay)
}

// Drop terminates msg: JetStream never redelivers it.
func (b broker) Drop(_ context.Context, msg jetstream.Msg) error { return msg.Term() }

func delivered(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil {
		return 1
	}
	return md.NumDelivered
}
