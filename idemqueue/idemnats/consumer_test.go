package idemnats_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/idemqueue"
	"github.com/go-idempotency/idempotency/idemqueue/idemnats"
)

// A consumer killed after its commit and before its ack: the server
// redelivers, a fresh consumer replays the stored result and acks; one
// effect in the database.
func TestCrashBetweenCommitAndAck(t *testing.T) {
	for _, withID := range []bool{true, false} {
		t.Run(fmt.Sprintf("msgid=%v", withID), func(t *testing.T) {
			f, n := setup(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxDeliver: 5})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var header nats.Header
			if withID {
				header = nats.Header{jetstream.MsgIDHeader: {"order-1"}}
			}
			f.publish(t, ctx, "orders", `{"order":1}`, header)

			raw, _ := json.Marshal(n)
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "IDEMNATS_HELPER="+string(raw))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			killed := false
			t.Cleanup(func() {
				if !killed {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			})
			lines := make(chan string)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
		wait:
			for {
				select {
				case line, ok := <-lines:
					if !ok {
						t.Fatal("the child ended without committing")
					}
					if line == "committed" {
						break wait
					}
				case <-ctx.Done():
					t.Fatal("the child did not commit in time")
				}
			}
			if got := f.effectCount(t, ctx); got != 1 {
				t.Fatalf("after the child's commit: %d effects, want 1", got)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			killed = true
			go func() {
				for range lines {
				}
			}()

			var calls atomic.Int64
			c, err := idemnats.New(f.guard, f.handler(&calls), &idemnats.Config{Scope: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			msg := next(t, f.cons, 15*time.Second) // redelivered after AckWait
			if md, _ := msg.Metadata(); md.NumDelivered != 2 {
				t.Fatalf("NumDelivered = %d, want 2", md.NumDelivered)
			}
			res, err := c.Handle(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Replayed || res.Verdict != idemqueue.Ack || string(res.Body) != `{"effect":1}` || calls.Load() != 0 {
				t.Fatalf("redelivery: %+v (body %s), %d handler calls; want a replay of effect 1, acked, no call", res, res.Body, calls.Load())
			}
			if got := f.effectCount(t, ctx); got != 1 {
				t.Fatalf("%d effects, want 1", got)
			}
			info, err := f.cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumAckPending != 0 || info.NumPending != 0 || info.AckFloor.Stream != 1 {
				t.Fatalf("consumer: %d ack pending, %d pending, ack floor %d; want 0, 0, 1", info.NumAckPending, info.NumPending, info.AckFloor.Stream)
			}
			if _, err := f.cons.Next(jetstream.FetchMaxWait(3 * time.Second)); !errors.Is(err, nats.ErrTimeout) {
				t.Fatalf("another delivery after the ack: %v", err)
			}
		})
	}
}

// A poison message (the handler always fails) is redelivered after each
// backoff, MaxDeliver times in all, then never again: JetStream publishes
// the MAX_DELIVERIES advisory with its stream sequence and keeps it in the
// stream, where it can be read back.
func TestPoisonMessageStopsAtMaxDeliver(t *testing.T) {
	const maxDeliver = 3
	const backoff = 300 * time.Millisecond
	f, n := setup(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second, MaxDeliver: maxDeliver})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adv, err := f.nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + n.Stream + "." + n.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	defer adv.Unsubscribe()

	var mu sync.Mutex
	var times []time.Time
	boom := errors.New("boom")
	c, err := idemnats.New(f.guard, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) ([]byte, error) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if _, err := tx.Exec(ctx, `INSERT INTO `+f.effects+` (msg) VALUES ('x')`); err != nil {
			return nil, err
		}
		return nil, boom
	}, &idemnats.Config{Scope: "billing", Backoff: func(uint64) time.Duration { return backoff }})
	if err != nil {
		t.Fatal(err)
	}
	var errs atomic.Int64
	cc, err := f.cons.Consume(func(msg jetstream.Msg) {
		res, err := c.Handle(ctx, msg)
		if errors.Is(err, boom) && res.Verdict == idemqueue.Retry {
			errs.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	seq := f.publish(t, ctx, "orders", "poison", nil)

	m, err := adv.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no MAX_DELIVERIES advisory: %v", err)
	}
	var a struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries int    `json:"deliveries"`
	}
	if err := json.Unmarshal(m.Data, &a); err != nil {
		t.Fatal(err)
	}
	if a.StreamSeq != seq || a.Deliveries != maxDeliver {
		t.Fatalf("advisory %s: want stream_seq %d, deliveries %d", m.Data, seq, maxDeliver)
	}
	time.Sleep(3 * backoff) // nothing more may come
	mu.Lock()
	got := append([]time.Time(nil), times...)
	mu.Unlock()
	if len(got) != maxDeliver || errs.Load() != maxDeliver {
		t.Fatalf("handler ran %d times (%d retried), want %d", len(got), errs.Load(), maxDeliver)
	}
	for i := 1; i < len(got); i++ {
		if d := got[i].Sub(got[i-1]); d < backoff-50*time.Millisecond {
			t.Fatalf("delivery %d came %v after the previous one, want at least the %v backoff", i+1, d, backoff)
		}
	}
	if n := f.effectCount(t, ctx); n != 0 {
		t.Fatalf("%d effects committed, want 0", n)
	}
	stream, err := f.js.Stream(ctx, n.Stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetMsg(ctx, seq)
	if err != nil || string(raw.Data) != "poison" {
		t.Fatalf("the poison message in the stream: %v, %v", raw, err)
	}
}

// A failure marked Permanent, or a key reused by another message, ends in
// Term: one delivery, no redelivery.
func TestTerminate(t *testing.T) {
	f, _ := setup(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxDeliver: 5})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := errors.New("invalid order")
	var calls atomic.Int64
	h := f.handler(&calls)
	c, err := idemnats.New(f.guard, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) ([]byte, error) {
		if string(msg.Data()) == "bad" {
			calls.Add(1)
			return nil, idemnats.Permanent(bad)
		}
		return h(ctx, tx, msg)
	}, &idemnats.Config{
		Scope: "billing",
		// A field the user names: the Order-Id header.
		Key: func(msg jetstream.Msg) (string, error) {
			if id := msg.Headers().Get("Order-Id"); id != "" {
				return "order:" + id, nil
			}
			return "", errors.New("no Order-Id")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.publish(t, ctx, "orders", "bad", nats.Header{"Order-Id": {"1"}})
	f.publish(t, ctx, "orders", "good", nats.Header{"Order-Id": {"2"}})
	f.publish(t, ctx, "orders", "other payload", nats.Header{"Order-Id": {"2"}})
	f.publish(t, ctx, "orders", "no key", nil)
	want := []struct {
		action idemqueue.Verdict
		err    error
	}{{idemqueue.Drop, bad}, {idemqueue.Ack, nil}, {idemqueue.Drop, idempotency.ErrMismatch}, {idemqueue.Drop, idemnats.ErrPermanent}}
	for i, w := range want {
		res, err := c.Handle(ctx, next(t, f.cons, 5*time.Second))
		if res.Verdict != w.action || (w.err == nil) != (err == nil) || (w.err != nil && !errors.Is(err, w.err)) {
			t.Fatalf("message %d: %v, %v; want %v, %v", i, res.Verdict, err, w.action, w.err)
		}
	}
	if _, err := f.cons.Next(jetstream.FetchMaxWait(3 * time.Second)); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a redelivery after Term: %v", err)
	}
	if got := f.effectCount(t, ctx); got != 1 || calls.Load() != 2 {
		t.Fatalf("%d effects, %d calls; want 1 and 2", got, calls.Load())
	}
}

// Every message is published twice (two publishers, distinct Nats-Msg-Id,
// the same Order-Id) and consumed by two consumers at once: one effect per
// order.
func TestConcurrentDuplicates(t *testing.T) {
	f, n := setup(t, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: 10})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const orders = 40
	for i := range orders {
		for p := range 2 {
			f.publish(t, ctx, "orders", fmt.Sprintf("order %d", i), nats.Header{
				jetstream.MsgIDHeader: {fmt.Sprintf("pub%d-%d", p, i)}, "Order-Id": {fmt.Sprint("order-", i)}})
		}
	}
	var acked, replayed atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	for range 2 {
		g := connect(t, ctx, names{Stream: n.Stream, Consumer: n.Consumer, Table: n.Table})
		c, err := idemnats.New(g.guard, g.handler(nil), &idemnats.Config{
			Scope: "billing",
			Key:   func(msg jetstream.Msg) (string, error) { return msg.Headers().Get("Order-Id"), nil },
			OnError: func(_ context.Context, _ jetstream.Msg, err error) {
				t.Errorf("handle: %v", err)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := g.cons.Consume(func(msg jetstream.Msg) {
			res, err := c.Handle(ctx, msg)
			if err != nil {
				t.Errorf("handle: %v", err)
				return
			}
			if res.Replayed {
				replayed.Add(1)
			}
			if acked.Add(1) == 2*orders {
				once.Do(func() { close(done) })
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Stop()
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("only %d of %d messages acked", acked.Load(), 2*orders)
	}
	if got := f.effectCount(t, ctx); got != orders || replayed.Load() != orders {
		t.Fatalf("%d effects, %d replays; want %d and %d", got, replayed.Load(), orders, orders)
	}
}

func TestNewInvalid(t *testing.T) {
	g, err := idempotency.New[pgx.Tx](nopStore{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, pgx.Tx, jetstream.Msg) ([]byte, error) { return nil, nil }
	for name, err := range map[string]error{
		"nil guard":  func() error { _, err := idemnats.New[pgx.Tx](nil, h, &idemnats.Config{Scope: "s"}); return err }(),
		"nil h":      func() error { _, err := idemnats.New(g, nil, &idemnats.Config{Scope: "s"}); return err }(),
		"no scope":   func() error { _, err := idemnats.New(g, h, &idemnats.Config{}); return err }(),
		"nil config": func() error { _, err := idemnats.New(g, h, nil); return err }(),
		"bad scope":  func() error { _, err := idemnats.New(g, h, &idemnats.Config{Scope: "a\x00b"}); return err }(),
	} {
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if d := idemnats.DefaultBackoff(1); d != time.Second {
		t.Errorf("DefaultBackoff(1) = %v", d)
	}
	if d := idemnats.DefaultBackoff(100); d != time.Minute {
		t.Errorf("DefaultBackoff(100) = %v", d)
	}
}

type nopStore struct{}

func (nopStore) Reserve(context.Context, backend.Reservation) (backend.Txn[pgx.Tx], *backend.Record, error) {
	return nil, nil, errors.New("unused")
}
func (nopStore) Purge(context.Context, int) (int, error) { return 0, nil }
