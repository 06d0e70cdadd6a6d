// Package idemamqp runs RabbitMQ (AMQP 0-9-1) message handlers under
// [idempotency.Guard.Do], keyed by the message's identity, so that a
// redelivered message replays its stored result instead of running its
// effect again.
//
// RabbitMQ requeues every unacknowledged delivery of a channel that closes:
// a consumer that commits its effect and dies before its ack gets the
// message delivered again (Redelivered set). With a [Consumer], the
// handler's effect commits in the key store's transaction together with the
// message's key and the handler's result; the redelivery finds the key
// completed, the handler does not run, and the delivery is acked.
//
// The handler returns bytes, not an HTTP response: the Consumer stores them
// with the fixed status [Status] and hands them back in [Result.Body].
//
// What the Consumer does with a delivery:
//
//   - fn succeeded, or the key was already completed with the same
//     fingerprint: Ack.
//   - fn failed, the store failed, or another consumer held the key past the
//     guard's wait bound: the Consumer waits [Options.Backoff] (so that a
//     failing message is not redelivered in a hot loop), then Nack with
//     requeue.
//   - The key was completed by another message ([idempotency.ErrMismatch]),
//     the delivery has no key (no message-id and no [Options.Key]), or fn
//     returned an error marked with [Permanent]: Reject without requeue;
//     the queue's dead-letter exchange, if any, receives it.
//
// Poison messages: a message whose handler always fails is requeued after
// every backoff. Declare the queue as a quorum queue with x-delivery-limit
// and a dead-letter exchange (x-dead-letter-exchange,
// x-dead-letter-routing-key): once the limit is passed, RabbitMQ moves the
// message to the dead-letter queue instead of delivering it again (tested:
// with x-delivery-limit N the handler runs N+1 times). Classic queues keep
// no delivery count: there a poison message is retried forever, once per
// backoff.
package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// a message-id when no [Options.Key] is set.
var ErrNoKey = errors.New("idemamqp: delivery has no message-id")

// Permanent wraps err so that the [Consumer] rejects the delivery without
// requeueing it instead of asking for a redelivery.
// errors.Is(Permanent(err), ErrPermanent) holds. Permanent(nil) is nil.
func Permanent(err error) error {
	return idemqueue.Permanent(err)
}

// Handler processes one delivery. It must do every write of its effect
// through tx, the key store's transaction: only those commit with the key.
// Its result is stored with the key and replayed for a redelivery. An error
// rolls the effect back; see [Permanent].
type Handler[Tx any] func(ctx context.Context, tx Tx, d *amqp.Delivery) ([]byte, error)

// Options tune a [Consumer].
type Options struct {
	// Scope is the key scope of every message this consumer handles: name
	// the consuming application or queue ("billing"). Two consumers that
	// must each run their own effect for the same message need distinct
	// scopes; the instances of one consumer share one. Required.
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
	// requeues the delivery, given how many times it was delivered before
	// (the x-delivery-count header of quorum queues; 0 on a first delivery
	// or a classic queue). Defaults to [DefaultBackoff].
	Backoff func(previous int64) time.Duration
	// OnError, if set, is told about every error of [Consumer.Run].
	OnError func(ctx context.Context, d *amqp.Delivery, err error)
}

// Action is what a [Consumer] did with a delivery.
type Action int

// The actions of a [Consumer].
const (
	// Acked: the delivery was acked (run or replayed).
	Acked Action = iota + 1
	// Requeued: the delivery was nacked with requeue, after the backoff.
	Requeued
	// Rejected: the delivery was rejected without requeue (dead-lettered
	// if the queue has a dead-letter exchange, dropped otherwise).
	Rejected
)

// String returns "acked", "requeued" or "rejected".
func (a Action) String() string {
	switch a {
	case Acked:
		return "acked"
	case Requeued:
		return "requeued"
	case Rejected:
		return "rejected"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Result is what [Consumer.Handle] did with one delivery.
type Result struct {
	// Key is the delivery's idempotency key.
	Key idempotency.Key
	// Body is the handler's result, run now or replayed; nil unless it was
	// committed (now or before).
	Body []byte
	// Replayed is true when the handler did not run because the key was
	// already completed.
	Replayed bool
	// Action is what was done with the delivery; zero if the reply to the
	// server failed.
	Action Action
}

// Consumer runs a [Handler] on deliveries under a Guard. It is safe for
// concurrent use; build it with [New].
type Consumer[Tx any] struct {
	guard   *idempotency.Guard[Tx]
	handler Handler[Tx]
	opts    Options
}

// New returns a Consumer running h under guard. A nil guard or h, or an
// invalid or empty [Options.Scope], gives an error wrapping
// [idempotency.ErrInvalidConfig].
func New[Tx any](guard *idempotency.Guard[Tx], h Handler[Tx], opts Options) (*Consumer[Tx], error) {
	switch {
	case guard == nil:
		return nil, fmt.Errorf("%w: idemamqp: nil guard", idempotency.ErrInvalidConfig)
	case h == nil:
		return nil, fmt.Errorf("%w: idemamqp: nil handler", idempotency.ErrInvalidConfig)
	case opts.Scope == "":
		return nil, fmt.Errorf("%w: idemamqp: empty Scope", idempotency.ErrInvalidConfig)
	}
	if err := (idempotency.Key{Scope: opts.Scope, ID: "x"}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: idemamqp: Scope: %w", idempotency.ErrInvalidConfig, err)
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

// DefaultKey is the default [Options.Key]: "id:" and the message-id
// property; a delivery without one is an error wrapping [ErrNoKey]
// (AMQP gives a message no other identity that survives a redelivery).
func DefaultKey(d *amqp.Delivery) (string, error) {
	if d.MessageId == "" {
		return "", ErrNoKey
	}
	return "id:" + d.MessageId, nil
}

// DefaultFingerprint is the default [Options.Fingerprint]: the hex SHA-256
// of the body.
func DefaultFingerprint(d *amqp.Delivery) (string, error) {
	return idempotency.Fingerprint(d.Body), nil
}

// DefaultBackoff is the default [Options.Backoff]: 1s, doubling with each
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
// the backoff) or rejects d; see the package documentation. The error is
// nil when d was acked; otherwise it says why (errors.Is finds the
// handler's own error, [idempotency.ErrMismatch], [ErrPermanent], ...),
// joined with the error of the reply to the server if that failed too.
func (c *Consumer[Tx]) Handle(ctx context.Context, d *amqp.Delivery) (Result, error) {
	var res Result
	raw, err := c.opts.Key(d)
	if err != nil {
		return c.reject(res, d, fmt.Errorf("%w: idemamqp: key: %w", ErrPermanent, err))
	}
	res.Key = idempotency.Key{Scope: c.opts.Scope, ID: idemqueue.KeyID(raw)}
	fp, err := c.opts.Fingerprint(d)
	if err != nil {
		return c.reject(res, d, fmt.Errorf("%w: idemamqp: fingerprint: %w", ErrPermanent, err))
	}
	out, err := idemqueue.Process(ctx, c.guard, res.Key, fp, func(tx Tx) ([]byte, error) {
		return c.handler(ctx, tx, d)
	})
	switch out.Verdict {
	case idemqueue.Ack:
		res.Body, res.Replayed = out.Body, out.Replayed
		if aerr := d.Ack(false); aerr != nil {
			// Committed but not acked: the redelivery replays it.
			return res, fmt.Errorf("idemamqp: ack key %v: %w", res.Key, aerr)
		}
		res.Action = Acked
		return res, nil
	case idemqueue.Drop:
		return c.reject(res, d, err)
	}
	if ctx.Err() == nil {
		t := time.NewTimer(c.opts.Backoff(deliveryCount(d)))
		select {
		case <-t.C:
		case <-ctx.Done(): // shutting down: hand it back at once
			t.Stop()
		}
	}
	if nerr := d.Nack(false, true); nerr != nil {
		return res, errors.Join(err, fmt.Errorf("idemamqp: nack key %v: %w", res.Key, nerr))
	}
	res.Action = Requeued
	return res, err
}

func (c *Consumer[Tx]) reject(res Result, d *amqp.Delivery, err error) (Result, error) {
	if rerr := d.Reject(false); rerr != nil {
		return res, errors.Join(err, fmt.Errorf("idemamqp: reject: %w", rerr))
	}
	res.Action = Rejected
	return res, err
}

// Run handles the deliveries of ch (from amqp.Channel.Consume with
// autoAck false), one at a time, until ch is closed or ctx ends, passing
// errors to [Options.OnError]. It returns ctx.Err(), or nil when ch was
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
			if _, err := c.Handle(ctx, &d); err != nil && c.opts.OnError != nil {
				c.opts.OnError(ctx, &d, err)
			}
		}
	}
}
