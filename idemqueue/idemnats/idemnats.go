// Package idemnats runs NATS JetStream message handlers under
// [idempotency.Guard.Do], keyed by the message's identity, so that a
// redelivered message replays its stored result instead of running its
// effect again.
//
// JetStream delivers at least once: a consumer that commits its effect and
// dies before its acknowledgement reaches the server gets the message again
// after AckWait. With a [Consumer], the handler's effect runs in the key
// store's transaction (a pgx.Tx, a *sql.Tx) and commits together with the
// message's key and the handler's result; the redelivery finds the key
// completed, the handler does not run, and the message is acknowledged.
//
// The handler returns bytes, not an HTTP response: the Consumer stores them
// as the key's response with the fixed status [Status] (so a record of the
// keys table written by a message reads 200) and hands them back, byte-exact,
// in [Result.Body] on every replay.
//
// What the Consumer does with a message:
//
//   - fn succeeded, or the key was already completed with the same
//     fingerprint: acknowledged with DoubleAck (the server confirms it).
//   - fn failed, the store failed, or another consumer held the key past the
//     guard's wait bound: NakWithDelay with [Options.Backoff], so the server
//     redelivers it later. The rolled-back attempt left no effect.
//   - The key was completed by another message ([idempotency.ErrMismatch]),
//     the key or fingerprint could not be derived, or fn returned an error
//     marked with [Permanent]: terminated (Term); JetStream never redelivers
//     it and publishes a MSG_TERMINATED advisory.
//
// A message whose handler always fails (a poison message) is redelivered
// after each backoff until the consumer's MaxDeliver is reached; then
// JetStream stops delivering it, leaves it in the stream, and publishes an
// advisory on $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>
// naming its stream sequence: that subject is the dead-letter queue. Set
// MaxDeliver on every consumer you run this on; with the default (-1) a
// poison message is retried forever, at the pace of the backoff.
package idemnats

import (
	"context"
	"errors"
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

// Handler processes one message. It must do every write of its effect
// through tx, the key store's transaction: only those commit with the key.
// Its result is stored with the key and replayed for a redelivery. An error
// rolls the effect back; see [Permanent].
type Handler[Tx any] func(ctx context.Context, tx Tx, msg jetstream.Msg) ([]byte, error)

// Options tune a [Consumer].
type Options struct {
	// Scope is the key scope of every message this consumer handles: name
	// the consuming application or durable consumer ("billing"). Two
	// consumers that must each run their own effect for the same message
	// need distinct scopes; two instances of one consumer share one.
	// Required: a consumer name generated per process (an ephemeral or
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
	// handler runs, so that a handler slower than AckWait is not
	// redelivered to another consumer meanwhile. Keep it below AckWait.
	ProgressInterval time.Duration
	// OnError, if set, is told about every error of the message handler
	// returned by [Consumer.MessageHandler].
	OnError func(ctx context.Context, msg jetstream.Msg, err error)
}

// Action is what a [Consumer] did with a message.
type Action int

// The actions of a [Consumer].
const (
	// Acked: the message was acknowledged (run or replayed).
	Acked Action = iota + 1
	// Retried: the message was negatively acknowledged with a delay; the
	// server redelivers it (up to the consumer's MaxDeliver).
	Retried
	// Terminated: the message was terminated; it is never redelivered.
	Terminated
)

// String returns "acked", "retried" or "terminated".
func (a Action) String() string {
	switch a {
	case Acked:
		return "acked"
	case Retried:
		return "retried"
	case Terminated:
		return "terminated"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Result is what [Consumer.Handle] did with one message.
type Result struct {
	// Key is the message's idempotency key.
	Key idempotency.Key
	// Body is the handler's result: from this delivery's run, or, when
	// Replayed, the one stored by the delivery that ran it. Nil unless the
	// handler's result was committed (or had been).
	Body []byte
	// Replayed is true when the handler did not run because the key was
	// already completed.
	Replayed bool
	// Action is what was done with the message; zero if Handle could not
	// even reply to it (see the error).
	Action Action
}

// Consumer runs a [Handler] on JetStream messages under a Guard. It is safe
// for concurrent use; build it with [New].
type Consumer[Tx any] struct {
	guard   *idempotency.Guard[Tx]
	handler Handler[Tx]
	opts    Options
}

// New returns a Consumer running h under guard. A nil guard or h, or an
// empty [Options.Scope], gives an error wrapping
// [idempotency.ErrInvalidConfig].
func New[Tx any](guard *idempotency.Guard[Tx], h Handler[Tx], opts Options) (*Consumer[Tx], error) {
	switch {
	case guard == nil:
		return nil, fmt.Errorf("%w: idemnats: nil guard", idempotency.ErrInvalidConfig)
	case h == nil:
		return nil, fmt.Errorf("%w: idemnats: nil handler", idempotency.ErrInvalidConfig)
	case opts.Scope == "":
		return nil, fmt.Errorf("%w: idemnats: empty Scope", idempotency.ErrInvalidConfig)
	case opts.ProgressInterval < 0:
		return nil, fmt.Errorf("%w: idemnats: negative ProgressInterval", idempotency.ErrInvalidConfig)
	}
	if err := (idempotency.Key{Scope: opts.Scope, ID: "x"}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: idemnats: Scope: %w", idempotency.ErrInvalidConfig, err)
	}
	if opts.Key == nil {
		opts.Key = DefaultKey
	}
	if opts.Fingerprint == nil {
		opts.Fingerprint = DefaultFingerprint
	}
	if opts.Backoff == nil {
		opts.Backoff = DefaultBackoff
	}
	return &Consumer[Tx]{guard: guard, handler: h, opts: opts}, nil
}

// DefaultKey is the default [Options.Key]: "id:" and the message's
// Nats-Msg-Id header (the publisher's identity of the message, which
// JetStream also deduplicates on), or, without that header,
// "seq:<stream>:<stream sequence>" (stable across redeliveries, but not
// across a purge or re-creation of the stream).
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

// DefaultFingerprint is the default [Options.Fingerprint]: the hex SHA-256
// of the message's subject and data ([idempotency.Fingerprint]).
func DefaultFingerprint(msg jetstream.Msg) (string, error) {
	return idempotency.Fingerprint([]byte(msg.Subject()), msg.Data()), nil
}

// DefaultBackoff is the default [Options.Backoff]: 1s after the first
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
// naks or terminates msg (see the package documentation). The error is
// nil when msg was acked; otherwise it says why (errors.Is finds the
// handler's own error, [idempotency.ErrMismatch], [ErrPermanent], ...),
// joined with the error of the reply to the server if that failed too.
func (c *Consumer[Tx]) Handle(ctx context.Context, msg jetstream.Msg) (Result, error) {
	var res Result
	raw, err := c.opts.Key(msg)
	if err != nil {
		return c.terminate(res, msg, fmt.Errorf("%w: idemnats: key: %w", ErrPermanent, err))
	}
	res.Key = idempotency.Key{Scope: c.opts.Scope, ID: idemqueue.KeyID(raw)}
	fp, err := c.opts.Fingerprint(msg)
	if err != nil {
		return c.terminate(res, msg, fmt.Errorf("%w: idemnats: fingerprint: %w", ErrPermanent, err))
	}

	stop := func() {}
	if c.opts.ProgressInterval > 0 {
		stop = c.keepAlive(msg)
	}
	out, err := idemqueue.Process(ctx, c.guard, res.Key, fp, func(tx Tx) ([]byte, error) {
		return c.handler(ctx, tx, msg)
	})
	stop()
	switch out.Verdict {
	case idemqueue.Ack:
		res.Body, res.Replayed = out.Body, out.Replayed
		if aerr := msg.DoubleAck(ctx); aerr != nil {
			// Committed but not acked: the redelivery replays it.
			return res, fmt.Errorf("idemnats: ack key %v: %w", res.Key, aerr)
		}
		res.Action = Acked
		return res, nil
	case idemqueue.Drop:
		return c.terminate(res, msg, err)
	}
	delay := time.Duration(0)
	if ctx.Err() == nil {
		delay = c.opts.Backoff(delivered(msg))
	}
	// The reply must go out even when ctx is done (a consumer shutting
	// down hands the message back at once).
	if nerr := msg.NakWithDelay(delay); nerr != nil {
		return res, errors.Join(err, fmt.Errorf("idemnats: nak key %v: %w", res.Key, nerr))
	}
	res.Action = Retried
	return res, err
}

func (c *Consumer[Tx]) terminate(res Result, msg jetstream.Msg, err error) (Result, error) {
	if terr := msg.Term(); terr != nil {
		return res, errors.Join(err, fmt.Errorf("idemnats: term: %w", terr))
	}
	res.Action = Terminated
	return res, err
}

// keepAlive sends InProgress every ProgressInterval until stop is called.
func (c *Consumer[Tx]) keepAlive(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(c.opts.ProgressInterval)
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

func delivered(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil {
		return 1
	}
	return md.NumDelivered
}

// MessageHandler returns a jetstream.MessageHandler, for
// jetstream.Consumer.Consume, that calls [Consumer.Handle] with ctx and
// passes its errors to [Options.OnError].
func (c *Consumer[Tx]) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		if _, err := c.Handle(ctx, msg); err != nil && c.opts.OnError != nil {
			c.opts.OnError(ctx, msg, err)
		}
	}
}
