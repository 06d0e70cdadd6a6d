// Package idemamqp runs RabbitMQ (AMQP 0-9-1) message handlers under
// [idempotency.Guard.Do], keyed by the message's identity, so that a
// redelivered message replays its stored result instead of running its
// effect again.
//
// RabbitMQ requeues every unacknowledged delivery of a channel that closes:
// a consumer that commits its effect and dies before its ack gets the
// message delivered again (Redelivered set). With a [Consumer], the
// handler's effect commits in the key store's transaction together with the
// message's key and the handler's result. The redelivery finds the key
// completed: the handler does not run, and the delivery is acked.
//
// The handler returns bytes, not an HTTP response: the Consumer stores them
// with the fixed status [Status] and hands them back in
// [idemqueue.Result].Body.
//
// What the Consumer does with a delivery:
//
//   - fn succeeded, or the key was already completed with the same
//     fingerprint: Ack.
//   - fn failed, the store failed, or another consumer held the key past the
//     guard's wait bound: the Consumer waits [Config].Backoff (so that a
//     failing message is not redelivered in a hot loop), then Nack with
//     requeue.
//   - The key was completed by another message ([idempotency.ErrMismatch]),
//     the delivery has no key (no message-id and no [Config].Key), or fn
//     returned an error marked with [Permanent]: Reject without requeue;
//     the queue's dead-letter exchange, if any, receives it.
//
// Poison messages: a message whose handler always fails is requeued after
// every backoff. Declare the queue as a quorum queue with x-delivery-limit
// and a dead-letter exchange (x-dead-letter-exchange,
// x-dead-letter-routing-key). Once the limit is passed, RabbitMQ moves the
// message to the dead-letter queue instead of delivering it again. With
// x-delivery-limit N the handler runs N+1 times (the tests check it). Classic queues keep
// no delivery count: there a poison message is retried forever, once per
// backoff.
package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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

// ErrNoKey is returned (wrapped with [ErrPermanent]) for a delivery without
// a message-id when no [Config].Key is set.
var ErrNoKey = errors.New("idemamqp: delivery has no message-id")

// Permanent wraps err so that the [Consumer] rejects the delivery without
// requeueing it instead of asking for a redelivery.
// errors.Is(Permanent(err), ErrPermanent) holds. Permanent(nil) is nil.
func Permanent(err error) error {
	return idemqueue.Permanent(err)
}

// Handler processes one delivery in the key store's transaction tx; see
// [idemqueue.Handler].
type Handler[Tx any] = idemqueue.Handler[Tx, *amqp.Delivery]

// Config configures a [Consumer]. Scope is required: a nil Config gives an
// error.
type Config struct {
	// Scope is the key scope of every message this consumer handles: name
	// the consuming application or queue ("billing"). Two consumers that
	// must each run their own effect for the same message need distinct
	// scopes; the instances of one consumer share one. It has no default.
	Scope string
	// Key returns the key id of a delivery: 1 to 255 printable ASCII bytes;
	// a longer or other id is replaced by "sha256:" and its hex digest.
	// Defaults to [DefaultKey], the message-id property.
	Key func(d *amqp.Delivery) (string, error)
	// Fingerprint returns the fingerprint of a delivery; a delivery with
	// the key of a completed one but another fingerprint is rejected.
	// Defaults to [DefaultFingerprint], the body.
	Fingerprint func(d *amqp.Delivery) (string, error)
	// Backoff is how long the Consumer waits after a failure before it
	// requeues the delivery. It is given how many times the delivery was
	// delivered before: the x-delivery-count header of quorum queues, 0 on
	// a first delivery or a classic queue. Defaults to [DefaultBackoff].
	Backoff func(previous int64) time.Duration
	// OnError, if set, is told about every error of [Consumer.Run].
	// Defaults to nil: no report.
	OnError func(ctx context.Context, d *amqp.Delivery, err error)
}

// Consumer runs a [Handler] on deliveries under a Guard. It is safe for
// concurrent use; build it with [New].
type Consumer[Tx any] struct {
	q       *idemqueue.Consumer[Tx, *amqp.Delivery]
	onError func(ctx context.Context, d *amqp.Delivery, err error)
}

// New returns a Consumer running h under guard. A nil guard, h or cfg, or
// an empty or invalid [Config].Scope, gives an error wrapping
// [idempotency.ErrInvalidConfig].
func New[Tx any](guard *idempotency.Guard[Tx], h Handler[Tx], cfg *Config) (*Consumer[Tx], error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: idemamqp: nil Config: Scope is required", idempotency.ErrInvalidConfig)
	}
	q, err := idemqueue.NewConsumer(guard, h, broker{cfg: *cfg}, cfg.Scope)
	if err != nil {
		return nil, fmt.Errorf("idemamqp: %w", err)
	}
	return &Consumer[Tx]{q: q, onError: cfg.OnError}, nil
}

// DefaultKey is the default [Config].Key: "id:" and the message-id
// property; a delivery without one is an error wrapping [ErrNoKey]
// (AMQP gives a message no other identity that survives a redelivery).
func DefaultKey(d *amqp.Delivery) (string, error) {
	if d.MessageId == "" {
		return "", ErrNoKey
	}
	return "id:" + d.MessageId, nil
}

// DefaultFingerprint is the default [Config].Fingerprint: the hex SHA-256
// of the body.
func DefaultFingerprint(d *amqp.Delivery) (string, error) {
	return idempotency.Fingerprint(d.Body), nil
}

// DefaultBackoff is the default [Config].Backoff: 1s, doubling with each
// previous delivery, at most 1 minute.
func DefaultBackoff(previous int64) time.Duration {
	if previous < 0 {
		previous = 0
	}
	if previous > 6 {
		return time.Minute
	}
	return min(time.Second<<previous, time.Minute)
}

// deliveryCount reads the x-delivery-count header of quorum queues.
func deliveryCount(d *amqp.Delivery) int64 {
	switch v := d.Headers["x-delivery-count"].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int:
		return int64(v)
	}
	return 0
}

// Handle runs the handler on d under its key, then acks, requeues (after
// the backoff) or rejects d; see the package documentation. The verdict of
// the result is [idemqueue.Ack], [idemqueue.Retry] (requeued) or
// [idemqueue.Drop] (rejected); zero if the reply to the server failed. The
// error is nil when d was acked. Otherwise it says why: errors.Is finds
// the handler's own error, [idempotency.ErrMismatch], [ErrPermanent], and
// so on. It is joined with the error of the reply to the server if that
// failed too.
func (c *Consumer[Tx]) Handle(ctx context.Context, d *amqp.Delivery) (idemqueue.Result, error) {
	return c.q.Handle(ctx, d)
}

// Run handles the deliveries of ch (from amqp.Channel.Consume with
// autoAck false), one at a time, until ch is closed or ctx ends. It passes
// errors to [Config].OnError. It returns ctx.Err(), or nil when ch was
// closed. Run several for concurrency, with the channel's prefetch (Qos)
// at least that number.
func (c *Consumer[Tx]) Run(ctx context.Context, ch <-chan amqp.Delivery) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok := <-ch:
			if !ok {
				return nil
			}
			if _, err := c.Handle(ctx, &d); err != nil && c.onError != nil {
				c.onError(ctx, &d, err)
			}
		}
	}
}

// broker is the RabbitMQ glue of a Consumer.
type broker struct{ cfg Config }

func (b broker) Key(d *amqp.Delivery) (string, error) {
	if b.cfg.Key == nil {
		return DefaultKey(d)
	}
	return b.cfg.Key(d)
}

func (b broker) Fingerprint(d *amqp.Delivery) (string, error) {
	if b.cfg.Fingerprint == nil {
		return DefaultFingerprint(d)
	}
	return b.cfg.Fingerprint(d)
}

// backoff is the Backoff of the Config, or its default.
func (b broker) backoff() func(previous int64) time.Duration {
	if b.cfg.Backoff == nil {
		return DefaultBackoff
	}
	return b.cfg.Backoff
}

// InProgress does nothing: RabbitMQ redelivers a delivery only when its
// channel closes, not after a timeout.
func (b broker) InProgress(*amqp.Delivery) (stop func()) { return func() {} }

func (b broker) Ack(_ context.Context, d *amqp.Delivery) error { return d.Ack(false) }

// Retry waits the backoff (so that a failing message is not redelivered
// in a hot loop), then nacks d with requeue. A consumer shutting down
// (ctx done) hands it back at once.
func (b broker) Retry(ctx context.Context, d *amqp.Delivery) error {
	if ctx.Err() == nil {
		t := time.NewTimer(b.backoff()(deliveryCount(d)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return d.Nack(false, true)
}

// Drop rejects d without requeue: the queue's dead-letter exchange, if
// any, receives it.
func (b broker) Drop(_ context.Context, d *amqp.Delivery) error { return d.Reject(false) }
