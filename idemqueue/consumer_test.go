package idemqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue"
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// msg is a test broker's message.
type msg struct {
	id, body string
}

// fakeBroker records its replies and fails them with replyErr.
type fakeBroker struct {
	replies  []string
	working  bool // between InProgress and its stop
	replyErr error
}

func (b *fakeBroker) Key(m msg) (string, error) {
	if m.id == "" {
		return "", errors.New("no id")
	}
	return m.id, nil
}

func (b *fakeBroker) Fingerprint(m msg) (string, error) {
	return idempotency.Fingerprint([]byte(m.body)), nil
}

func (b *fakeBroker) InProgress(msg) func() {
	b.working = true
	return func() { b.working = false }
}

func (b *fakeBroker) reply(what string) error {
	if b.working {
		what += " before stop"
	}
	b.replies = append(b.replies, what)
	return b.replyErr
}

func (b *fakeBroker) Ack(context.Context, msg) error   { return b.reply("ack") }
func (b *fakeBroker) Retry(context.Context, msg) error { return b.reply("retry") }
func (b *fakeBroker) Drop(context.Context, msg) error  { return b.reply("drop") }

func TestConsumerReplies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, store := newGuard(t)
	errFails := errors.New("handler fails")
	b := &fakeBroker{}
	c, err := idemqueue.NewConsumer(g, func(_ context.Context, tx *memstore.Tx, m msg) ([]byte, error) {
		switch m.body {
		case "fails":
			return nil, errFails
		case "poison":
			return nil, idemqueue.Permanent(errFails)
		}
		tx.Effect("invoice")
		return []byte("invoiced " + m.body), nil
	}, b, "billing")
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		m            msg
		want         idemqueue.Verdict
		wantReplayed bool
		wantErr      error
		wantReply    string
	}{
		{msg{"m1", "a"}, idemqueue.Ack, false, nil, "ack"},
		{msg{"m1", "a"}, idemqueue.Ack, true, nil, "ack"},
		{msg{"m1", "b"}, idemqueue.Drop, false, idempotency.ErrMismatch, "drop"},
		{msg{"", "a"}, idemqueue.Drop, false, idemqueue.ErrPermanent, "drop"},
		{msg{"m2", "fails"}, idemqueue.Retry, false, errFails, "retry"},
		{msg{"m3", "poison"}, idemqueue.Drop, false, idemqueue.ErrPermanent, "drop"},
	} {
		res, err := c.Handle(ctx, tc.m)
		if res.Verdict != tc.want || res.Replayed != tc.wantReplayed || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Fatalf("message %d: %+v, %v; want %v, replayed %v, %v", i, res, err, tc.want, tc.wantReplayed, tc.wantErr)
		}
		if got := b.replies[len(b.replies)-1]; got != tc.wantReply {
			t.Fatalf("message %d: reply %q, want %q", i, got, tc.wantReply)
		}
		if tc.m.id != "" && res.Key != (idempotency.Key{Scope: "billing", ID: tc.m.id}) {
			t.Fatalf("message %d: key %v", i, res.Key)
		}
	}
	if n := store.Count("invoice"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}

	// A failed reply leaves the verdict zero and joins its error.
	errReply := errors.New("connection closed")
	b.replyErr = errReply
	res, err := c.Handle(ctx, msg{"m2", "fails"})
	if res.Verdict != 0 || !errors.Is(err, errFails) || !errors.Is(err, errReply) {
		t.Fatalf("failed nak: %+v, %v; want no verdict, both errors", res, err)
	}
	res, err = c.Handle(ctx, msg{"m1", "a"})
	if res.Verdict != 0 || !res.Replayed || !errors.Is(err, errReply) {
		t.Fatalf("failed ack: %+v, %v; want no verdict, a replay and the reply's error", res, err)
	}
}

func TestNewConsumerInvalid(t *testing.T) {
	g, _ := newGuard(t)
	h := func(context.Context, *memstore.Tx, msg) ([]byte, error) { return nil, nil }
	b := &fakeBroker{}
	for name, err := range map[string]error{
		"nil guard":  func() error { _, err := idemqueue.NewConsumer[*memstore.Tx](nil, h, b, "s"); return err }(),
		"nil h":      func() error { _, err := idemqueue.NewConsumer(g, nil, b, "s"); return err }(),
		"nil broker": func() error { _, err := idemqueue.NewConsumer(g, h, nil, "s"); return err }(),
		"no scope":   func() error { _, err := idemqueue.NewConsumer(g, h, b, ""); return err }(),
		"bad scope":  func() error { _, err := idemqueue.NewConsumer(g, h, b, "a\x00b"); return err }(),
	} {
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}
