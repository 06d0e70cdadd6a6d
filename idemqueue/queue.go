// Package idemqueue is what the message consumers of this repository share
// (the nested modules idemqueue/idemnats for NATS JetStream and
// idemqueue/idemamqp for RabbitMQ), and what a consumer for another broker
// needs. [Process] runs a message handler under [idempotency.Guard.Do],
// stores its result as bytes and gives the [Verdict] for the broker.
// [Consumer] adds the rest: the message's key and fingerprint, and the
// reply to the broker, through a [Broker] that holds one broker's glue.
//
// A redelivered message finds its key completed: [Process] replays the
// stored result without running the handler, and the verdict is [Ack].
package idemqueue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency"
)

// Status is the HTTP-style status stored with every message's key. The
// handler's result is kept as the body of a 200 response, so a record of
// the keys table written by a message reads 200.
const Status = 200

// ErrPermanent marks errors that a redelivery cannot cure; see [Permanent].
var ErrPermanent = errors.New("idemqueue: permanent failure")

// Permanent wraps err so that a consumer drops the message (terminates or
// dead-letters it) instead of asking for a redelivery.
// errors.Is(Permanent(err), err) and errors.Is(Permanent(err), ErrPermanent)
// both hold. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

// KeyID makes a message identity a valid [idempotency.Key] ID. It returns
// raw itself if it is one (1 to 255 printable ASCII bytes). Else it returns
// "sha256:" and the hex SHA-256 of raw, so that any identity gives a
// stable key.
func KeyID(raw string) string {
	if (idempotency.Key{ID: raw}).Validate() == nil {
		return raw
	}
	sum := sha256.Sum256([]byte(raw))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Verdict is what a consumer tells the broker about a message.
type Verdict int

// The verdicts of [Process].
const (
	// Ack: the handler's result is committed (now, or by an earlier
	// delivery: a replay). Acknowledge the message.
	Ack Verdict = iota + 1
	// Retry: nothing was committed and a redelivery may succeed (the
	// handler or the store failed, or another consumer held the key past
	// the guard's wait bound). Ask for a redelivery after a backoff.
	Retry
	// Drop: a redelivery cannot succeed (the key was completed by another
	// message, the key or fingerprint is invalid, or the handler's error is
	// [Permanent]). Terminate or dead-letter the message.
	Drop
)

// String returns "ack", "retry" or "drop".
func (v Verdict) String() string {
	switch v {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Drop:
		return "drop"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Result is what [Process] or a [Consumer] did with one message.
type Result struct {
	// Key is the message's idempotency key; zero if a Consumer could not
	// make it.
	Key idempotency.Key
	// Body is the handler's result: from this run, or, when Replayed, the
	// one committed by the delivery that ran it. Nil unless committed.
	Body []byte
	// Replayed is true when the handler did not run because the key was
	// already completed.
	Replayed bool
	// Verdict is what to tell the broker. A Consumer leaves it zero when
	// its reply to the broker failed (see the error).
	Verdict Verdict
}

// Process runs handle under g.Do with key and fingerprint fp. It stores
// handle's result as the body of a [Status] response. The verdict says
// what to tell the broker. The error is nil exactly when the verdict is
// [Ack]. Otherwise it is Do's error: the handler's own,
// [idempotency.ErrMismatch], [idempotency.ErrStore], and so on.
func Process[Tx any](ctx context.Context, g *idempotency.Guard[Tx], key idempotency.Key, fp string,
	handle func(tx Tx) ([]byte, error)) (Result, error) {
	resp, err := g.Do(ctx, key, fp, func(tx Tx) (idempotency.Response, error) {
		body, err := handle(tx)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: Status, Body: body}, nil
	})
	switch {
	case err == nil:
		return Result{Key: key, Body: resp.Body, Replayed: resp.Replayed, Verdict: Ack}, nil
	case IsPermanent(err):
		return Result{Key: key, Verdict: Drop}, err
	}
	return Result{Key: key, Verdict: Retry}, err
}

// IsPermanent reports whether err is one that a redelivery cannot cure: a
// [Permanent] error, a key completed by another message
// ([idempotency.ErrMismatch]), or an invalid key or fingerprint.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrPermanent) || errors.Is(err, idempotency.ErrMismatch) ||
		errors.Is(err, idempotency.ErrInvalidKey) || errors.Is(err, idempotency.ErrInvalidFingerprint)
}
