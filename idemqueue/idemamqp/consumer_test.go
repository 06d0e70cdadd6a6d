package idemamqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue"
	"github.com/go-idempotency/idempotency/idemqueue/idemamqp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// A consumer killed after its commit and before its ack: RabbitMQ requeues
// the delivery, a fresh consumer replays the stored result and acks; one
// effect in the database and the queue empty.
func TestCrashBetweenCommitAndAck(t *testing.T) {
	f := setup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f.publish(t, ctx, f.Queue, "order-1", `{"order":1}`)

	raw, _ := json.Marshal(f.names)
	cmd, out := testkit.StartChild(t, ctx, "IDEMAMQP_HELPER="+string(raw))
	ok := testkit.WaitForLine(out, "committed", 30*time.Second)
	if got := f.effectCount(t, ctx); ok && got != 1 {
		t.Errorf("after the child's commit: %d effects, want 1", got)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !ok {
		t.Fatal("the child did not commit")
	}

	var calls atomic.Int64
	c, err := idemamqp.New(f.guard, f.handler(&calls), &idemamqp.Config{Scope: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	d := get(t, f.ch, f.Queue, 15*time.Second)
	if !d.Redelivered {
		t.Fatal("the delivery is not marked redelivered")
	}
	res, err := c.Handle(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Verdict != idemqueue.Ack || string(res.Body) != `{"effect":1}` || calls.Load() != 0 {
		t.Fatalf("redelivery: %+v (body %s), %d calls; want a replay of effect 1, acked, no call", res, res.Body, calls.Load())
	}
	if got := f.effectCount(t, ctx); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
	// Closing the channel would requeue an unacked delivery: the queue
	// must still be empty afterwards.
	if err := f.ch.Close(); err != nil {
		t.Fatal(err)
	}
	ch, err := f.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(f.Queue, true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("queue after the ack: %+v, %v; want 0 messages", q, err)
	}
}

// A poison message on a quorum queue with x-delivery-limit 2 and a
// dead-letter queue: the handler runs 3 times, a backoff apart, then the
// message is in the dead-letter queue and nowhere else.
func TestPoisonMessageDeadLettered(t *testing.T) {
	const limit = 2
	const backoff = 200 * time.Millisecond
	dlq := testkit.Name("idemamqp.dlq.")
	f0 := setup(t, nil)
	if _, err := f0.ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := f0.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(dlq, false, false, false)
		}
	})
	f := setup(t, amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          limit,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": dlq,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var mu sync.Mutex
	var times []time.Time
	boom := errors.New("boom")
	var previous []int64
	c, err := idemamqp.New(f.guard, func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery) ([]byte, error) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if _, err := tx.Exec(ctx, `INSERT INTO `+f.effects+` (msg) VALUES ('x')`); err != nil {
			return nil, err
		}
		return nil, boom
	}, &idemamqp.Config{Scope: "billing", Backoff: func(p int64) time.Duration {
		mu.Lock()
		previous = append(previous, p)
		mu.Unlock()
		return backoff
	}})
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := f.ch.Consume(f.Queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var requeued atomic.Int64
	go func() {
		for d := range deliveries {
			res, err := c.Handle(ctx, &d)
			if errors.Is(err, boom) && res.Verdict == idemqueue.Retry {
				requeued.Add(1)
			}
		}
	}()
	f.publish(t, ctx, f.Queue, "poison-1", "poison")

	ch, err := f.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d := get(t, ch, dlq, 20*time.Second)
	if string(d.Body) != "poison" || d.MessageId != "poison-1" {
		t.Fatalf("dead-lettered %q (%s), want the poison message", d.Body, d.MessageId)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * backoff) // nothing more may come
	mu.Lock()
	got := append([]time.Time(nil), times...)
	prev := append([]int64(nil), previous...)
	mu.Unlock()
	if len(got) != limit+1 || requeued.Load() != limit+1 {
		t.Fatalf("handler ran %d times (%d requeued), want %d", len(got), requeued.Load(), limit+1)
	}
	for i := range prev {
		if prev[i] != int64(i) {
			t.Fatalf("Backoff saw x-delivery-count %v, want 0, 1, 2", prev)
		}
	}
	for i := 1; i < len(got); i++ {
		if dt := got[i].Sub(got[i-1]); dt < backoff-50*time.Millisecond {
			t.Fatalf("delivery %d came %v after the previous one, want at least %v", i+1, dt, backoff)
		}
	}
	if n := f.effectCount(t, ctx); n != 0 {
		t.Fatalf("%d effects committed, want 0", n)
	}
	q, err := ch.QueueDeclarePassive(f.Queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil || q.Messages != 0 {
		t.Fatalf("main queue: %+v, %v; want empty", q, err)
	}
}

// Duplicates (two deliveries, one message-id) under two concurrent
// consumers give one effect per message; a reused id with another body, a
// delivery without message-id and a Permanent error are rejected.
func TestDuplicatesAndRejects(t *testing.T) {
	f := setup(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const msgs = 40
	for i := range msgs {
		for range 2 {
			f.publish(t, ctx, f.Queue, fmt.Sprintf("m-%d", i), fmt.Sprintf("body %d", i))
		}
	}
	var acked, replayed atomic.Int64
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	var conns []*amqp.Connection
	for range 2 {
		g, err := open(ctx, testenv.AMQPURL(t), testenv.PostgresDSN(t), f.names)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.pool.Close)
		conns = append(conns, g.conn)
		if err := g.ch.Qos(4, 0, false); err != nil {
			t.Fatal(err)
		}
		c, err := idemamqp.New(g.guard, g.handler(nil), &idemamqp.Config{Scope: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		deliveries, err := g.ch.Consume(f.Queue, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-runCtx.Done():
						return
					case d := <-deliveries:
						res, err := c.Handle(runCtx, &d)
						if err != nil {
							t.Errorf("handle: %v", err)
							continue
						}
						if res.Replayed {
							replayed.Add(1)
						}
						if acked.Add(1) == 2*msgs {
							stop()
						}
					}
				}
			})
		}
	}
	wg.Wait()
	stop()
	for _, conn := range conns { // the next messages are for c below
		_ = conn.Close()
	}
	if acked.Load() != 2*msgs || replayed.Load() != msgs {
		t.Fatalf("%d acked, %d replayed; want %d and %d", acked.Load(), replayed.Load(), 2*msgs, msgs)
	}
	if got := f.effectCount(t, ctx); got != msgs {
		t.Fatalf("%d effects, want %d", got, msgs)
	}

	bad := errors.New("bad order")
	c, err := idemamqp.New(f.guard, func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery) ([]byte, error) {
		if string(d.Body) == "bad" {
			return nil, idemamqp.Permanent(bad)
		}
		return f.handler(nil)(ctx, tx, d)
	}, &idemamqp.Config{Scope: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, body string
		want     error
	}{{"m-1", "another body", idempotency.ErrMismatch}, {"", "no id", idemamqp.ErrNoKey}, {"b", "bad", bad}} {
		f.publish(t, ctx, f.Queue, tc.id, tc.body)
		res, err := c.Handle(ctx, get(t, f.ch, f.Queue, 10*time.Second))
		if !errors.Is(err, tc.want) || res.Verdict != idemqueue.Drop {
			t.Fatalf("%s: %v, %v; want rejected with %v", tc.body, res.Verdict, err, tc.want)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if d, ok, err := f.ch.Get(f.Queue, false); ok || err != nil {
		t.Fatalf("a rejected delivery came back: %v %v", d.Body, err)
	}
	if got := f.effectCount(t, ctx); got != msgs {
		t.Fatalf("%d effects, want %d", got, msgs)
	}
}

func TestNewInvalid(t *testing.T) {
	h := func(context.Context, pgx.Tx, *amqp.Delivery) ([]byte, error) { return nil, nil }
	for name, err := range map[string]error{
		"nil config": func() error { _, err := idemamqp.New[pgx.Tx](nil, h, nil); return err }(),
		"nil guard":  func() error { _, err := idemamqp.New[pgx.Tx](nil, h, &idemamqp.Config{Scope: "s"}); return err }(),
	} {
		if !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}
