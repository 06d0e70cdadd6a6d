package idemqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency"
)

// Broker is one broker's glue for a [Consumer]: the identity of its
// messages, of type M, and the replies to them. A broker module implements
// it; the Consumer does the rest.
type Broker[M any] interface {
	// Key returns the key id of m. Any string will do: [KeyID] makes it
	// valid. An error drops m.
	Key(m M) (string, error)
	// Fingerprint returns the fingerprint of m. An error drops m.
	Fingerprint(m M) (string, error)
	// InProgress is called once m's key and fingerprint are known. It may
	// tell the broker, until stop is called, that m is still being
	// processed. stop is called before the reply.
	InProgress(m M) (stop func())
	// Ack acknowledges m: its result is committed.
	Ack(ctx context.Context, m M) error
	// Retry asks for a redelivery of m, after a backoff unless ctx is done.
	// The reply must go out even when ctx is done.
	Retry(ctx context.Context, m M) error
	// Drop terminates or dead-letters m: a redelivery cannot succeed.
	Drop(ctx context.Context, m M) error
}

// Handler processes one message. It must do every write of its effect
// through tx, the key store's transaction: only those commit with the key.
// Its result is stored with the key and replayed for a redelivery. An error
// rolls the effect back; see [Permanent].
type Handler[Tx, M any] func(ctx context.Context, tx Tx, m M) ([]byte, error)

// Consumer runs a [Handler] on a broker's messages under a Guard, and
// replies to the broker through a [Broker]. It is safe for concurrent use
// if the Broker is; build it with [NewConsumer].
type Consumer[Tx, M any] struct {
	guard   *idempotency.Guard[Tx]
	handler Handler[Tx, M]
	broker  Broker[M]
	scope   string
}

// NewConsumer returns a Consumer running h under guard, in the key scope
// scope, and replying through b. Name the consuming application in scope:
// consumers that must each run their own effect for a message need
// distinct scopes. A nil guard, h or b, or an empty or invalid scope, gives
// an error wrapping [idempotency.ErrInvalidConfig].
func NewConsumer[Tx, M any](guard *idempotency.Guard[Tx], h Handler[Tx, M], b Broker[M], scope string) (*Consumer[Tx, M], error) {
	switch {
	case guard == nil:
		return nil, fmt.Errorf("%w: idemqueue: nil guard", idempotency.ErrInvalidConfig)
	case h == nil:
		return nil, fmt.Errorf("%w: idemqueue: nil handler", idempotency.ErrInvalidConfig)
	case b == nil:
		return nil, fmt.Errorf("%w: idemqueue: nil Broker", idempotency.ErrInvalidConfig)
	case scope == "":
		return nil, fmt.Errorf("%w: idemqueue: empty scope", idempotency.ErrInvalidConfig)
	}
	if err := (idempotency.Key{Scope: scope, ID: "x"}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: idemqueue: scope: %w", idempotency.ErrInvalidConfig, err)
	}
	return &Consumer[Tx, M]{guard: guard, handler: h, broker: b, scope: scope}, nil
}

// Handle runs the handler on m under m's key with [Process]. Then it acks,
// retries or drops m through the Broker, as the verdict says. The error is
// nil when m was acked. Otherwise it says why: errors.Is finds the
// handler's own error, [idempotency.ErrMismatch], [ErrPermanent], and so
// on. It is joined with the error of the reply if that failed too.
func (c *Consumer[Tx, M]) Handle(ctx context.Context, m M) (Result, error) {
	raw, err := c.broker.Key(m)
	if err != nil {
		return c.drop(ctx, Result{}, m, fmt.Errorf("%w: idemqueue: key: %w", ErrPermanent, err))
	}
	key := idempotency.Key{Scope: c.scope, ID: KeyID(raw)}
	fp, err := c.broker.Fingerprint(m)
	if err != nil {
		return c.drop(ctx, Result{Key: key}, m, fmt.Errorf("%w: idemqueue: fingerprint: %w", ErrPermanent, err))
	}
	stop := c.broker.InProgress(m)
	res, err := Process(ctx, c.guard, key, fp, func(tx Tx) ([]byte, error) {
		return c.handler(ctx, tx, m)
	})
	stop()
	switch res.Verdict {
	case Ack:
		if aerr := c.broker.Ack(ctx, m); aerr != nil {
			// Committed but not acked: the redelivery replays it.
			res.Verdict = 0
			return res, fmt.Errorf("idemqueue: ack key %v: %w", key, aerr)
		}
		return res, nil
	case Drop:
		return c.drop(ctx, res, m, err)
	}
	if rerr := c.broker.Retry(ctx, m); rerr != nil {
		res.Verdict = 0
		return res, errors.Join(err, fmt.Errorf("idemqueue: retry key %v: %w", key, rerr))
	}
	return res, err
}

func (c *Consumer[Tx, M]) drop(ctx context.Context, res Result, m M, err error) (Result, error) {
	if derr := c.broker.Drop(ctx, m); derr != nil {
		res.Verdict = 0
		return res, errors.Join(err, fmt.Errorf("idemqueue: drop key %v: %w", res.Key, derr))
	}
	res.Verdict = Drop
	return res, err
}
