// Package outboxnats publishes the rows of an [outbox] table to NATS
// JetStream: an [outbox.Publisher] for [outbox.Relay].
//
// Every message carries its row's [outbox.Message.MsgID] as Nats-Msg-Id. A
// relay that dies after publishing a batch and before marking it sent
// leaves the rows unsent. The next relay publishes them again under the
// same ids. The stream's duplicate window (StreamConfig.Duplicates,
// 2 minutes by default) drops the repeats. Past the window a repeat is
// stored again. So keep the window longer than a relay takes to come back,
// and make consumers idempotent (the idemnats module keys them by
// Nats-Msg-Id by default).
//
// It lives in a module of its own so that the outbox writers stay free of
// any broker client.
package outboxnats

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
)

// Config configures a [Publisher]. Nil or the zero value means the
// defaults.
type Config struct {
	// ExpectStream, if set, makes the server refuse a message whose subject
	// is not bound to this stream. Defaults to "": any stream.
	ExpectStream string
}

// Publisher is an [outbox.Publisher] on JetStream. It is safe for
// concurrent use; build it with [NewPublisher].
type Publisher struct {
	js  jetstream.JetStream
	cfg Config
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on js. A nil js gives an error wrapping
// [idempotency.ErrInvalidConfig].
func NewPublisher(js jetstream.JetStream, cfg *Config) (*Publisher, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: outboxnats: nil JetStream", idempotency.ErrInvalidConfig)
	}
	p := &Publisher{js: js}
	if cfg != nil {
		p.cfg = *cfg
	}
	return p, nil
}

// Publish sends msgs asynchronously, in order, each with Nats-Msg-Id set to
// its MsgID. It returns nil once the stream has acknowledged every one
// (a duplicate the stream dropped counts as acknowledged). It returns the
// first failure, or ctx's error, otherwise.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) error {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		nm := &nats.Msg{Subject: m.Subject, Data: m.Payload}
		if len(m.Header) > 0 {
			nm.Header = make(nats.Header, len(m.Header)+1)
			for k, v := range m.Header {
				nm.Header[k] = append([]string(nil), v...)
			}
		}
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(m.MsgID)}
		if p.cfg.ExpectStream != "" {
			opts = append(opts, jetstream.WithExpectStream(p.cfg.ExpectStream))
		}
		f, err := p.js.PublishMsgAsync(nm, opts...)
		if err != nil {
			return fmt.Errorf("outboxnats: publish seq %d (%s): %w", m.Seq, m.MsgID, err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("outboxnats: publish seq %d (%s): %w", msgs[i].Seq, msgs[i].MsgID, err)
		case <-ctx.Done():
			return fmt.Errorf("outboxnats: waiting for the ack of seq %d: %w", msgs[i].Seq, ctx.Err())
		}
	}
	return nil
}
