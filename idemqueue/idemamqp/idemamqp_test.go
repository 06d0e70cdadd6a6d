package idemamqp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue/idemamqp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

type names struct{ Queue, Table string }

type fixture struct {
	names
	conn    *amqp.Connection
	ch      *amqp.Channel
	pool    *pgxpool.Pool
	guard   *idempotency.Guard[pgx.Tx]
	effects string
}

// open connects to RabbitMQ and PostgreSQL; the caller closes.
func open(ctx context.Context, amqpURL, dsn string, n names) (*fixture, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	store, err := postgres.New(pool, &postgres.Config{Table: n.Table + "_keys"})
	if err != nil {
		conn.Close()
		pool.Close()
		return nil, err
	}
	guard, err := idempotency.New(store, &idempotency.Config{WaitTimeout: 5 * time.Second})
	if err != nil {
		conn.Close()
		pool.Close()
		return nil, err
	}
	return &fixture{names: n, conn: conn, ch: ch, pool: pool, guard: guard, effects: `"` + n.Table + `_effects"`}, nil
}

// setup declares the queue (args) and the tables, removed at cleanup.
func setup(t *testing.T, args amqp.Table) *fixture {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := names{Queue: testkit.Name("idemamqp."), Table: testkit.Name("idemamqp_")}
	f, err := open(ctx, testenv.AMQPURL(t), testenv.PostgresDSN(t), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close(); f.pool.Close() })
	if _, err := f.ch.QueueDeclare(n.Queue, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch, err := f.conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(n.Queue, false, false, false)
		}
		if err != nil {
			t.Errorf("delete queue: %v", err)
		}
	})
	store, _ := postgres.New(f.pool, &postgres.Config{Table: n.Table + "_keys"})
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `CREATE TABLE `+f.effects+` (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, msg TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{f.effects, `"` + n.Table + `_keys"`} {
			if _, err := f.pool.Exec(ctx, `DROP TABLE IF EXISTS `+s); err != nil {
				t.Errorf("drop %s: %v", s, err)
			}
		}
	})
	return f
}

func (f *fixture) handler(calls *atomic.Int64) idemamqp.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery) ([]byte, error) {
		if calls != nil {
			calls.Add(1)
		}
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+f.effects+` (msg) VALUES ($1) RETURNING id`, string(d.Body)).Scan(&id); err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, `{"effect":%d}`, id), nil
	}
}

func (f *fixture) effectCount(t testing.TB, ctx context.Context) int {
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT COUNT(*) FROM `+f.effects).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) publish(t testing.TB, ctx context.Context, queue, id, body string) {
	if err := f.ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(body), DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatal(err)
	}
}

// get waits for one delivery of queue on a fresh channel.
func get(t testing.TB, ch *amqp.Channel, queue string, wait time.Duration) *amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return &d
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no delivery on %s within %v", queue, wait)
	return nil
}

// blockingAck never lets an ack leave: it says "committed" on stdout and
// waits to be killed.
type blockingAck struct{ amqp.Acknowledger }

func (blockingAck) Ack(uint64, bool) error {
	fmt.Println("committed")
	select {}
}

func TestMain(m *testing.M) {
	if raw := os.Getenv("IDEMAMQP_HELPER"); raw != "" {
		if err := helperConsumer(raw); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
		}
		os.Exit(2)
	}
	os.Exit(m.Run())
}

func helperConsumer(raw string) error {
	var n names
	if err := json.Unmarshal([]byte(raw), &n); err != nil {
		return err
	}
	ctx := context.Background()
	f, err := open(ctx, os.Getenv("IDEMPOTENCY_AMQP_URL"), os.Getenv("IDEMPOTENCY_POSTGRES_DSN"), n)
	if err != nil {
		return err
	}
	c, err := idemamqp.New(f.guard, f.handler(nil), &idemamqp.Config{Scope: "billing"})
	if err != nil {
		return err
	}
	deliveries, err := f.ch.Consume(n.Queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	d := <-deliveries
	d.Acknowledger = blockingAck{d.Acknowledger}
	_, err = c.Handle(ctx, &d)
	return fmt.Errorf("Handle returned %v instead of blocking in the ack", err)
}
