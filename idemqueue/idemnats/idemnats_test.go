package idemnats_test

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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemqueue/idemnats"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/postgres"
)

// fixture is a stream with one durable consumer, and a PostgreSQL guard
// with an effects table, all with random names, removed at cleanup.
type fixture struct {
	js      jetstream.JetStream
	nc      *nats.Conn
	stream  string
	cons    jetstream.Consumer
	pool    *pgxpool.Pool
	guard   *idempotency.Guard[pgx.Tx]
	effects string
}

type names struct{ Stream, Consumer, Table string }

func connect(t testing.TB, ctx context.Context, n names) *fixture {
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := postgres.New(pool, &postgres.Config{Table: n.Table + "_keys"})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := idempotency.New(store, &idempotency.Config{WaitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{js: js, nc: nc, stream: n.Stream, pool: pool, guard: guard, effects: `"` + n.Table + `_effects"`}
	if n.Consumer != "" {
		if f.cons, err = js.Consumer(ctx, n.Stream, n.Consumer); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// setup creates the stream, the consumer (cc) and the tables.
func setup(t *testing.T, cc jetstream.ConsumerConfig) (*fixture, names) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := names{Stream: testkit.Name("IDEM_"), Consumer: "billing", Table: testkit.Name("idemnats_")}
	cc.Durable = n.Consumer
	f := connect(t, ctx, names{Table: n.Table})
	f.stream = n.Stream
	if _, err := f.js.CreateStream(ctx, jetstream.StreamConfig{Name: n.Stream, Subjects: []string{n.Stream + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.js.DeleteStream(ctx, n.Stream); err != nil {
			t.Errorf("delete stream: %v", err)
		}
	})
	cons, err := f.js.CreateOrUpdateConsumer(ctx, n.Stream, cc)
	if err != nil {
		t.Fatal(err)
	}
	f.cons = cons
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
	return f, n
}

// handler inserts one effect row per run and answers its id.
func (f *fixture) handler(calls *atomic.Int64) idemnats.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) ([]byte, error) {
		if calls != nil {
			calls.Add(1)
		}
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+f.effects+` (msg) VALUES ($1) RETURNING id`, string(msg.Data())).Scan(&id); err != nil {
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

func (f *fixture) publish(t testing.TB, ctx context.Context, subject, data string, header nats.Header) uint64 {
	ack, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: f.stream + "." + subject, Data: []byte(data), Header: header})
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// next fetches one message, failing the test if none comes within wait.
func next(t testing.TB, cons jetstream.Consumer, wait time.Duration) jetstream.Msg {
	t.Helper()
	msg, err := cons.Next(jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatalf("no message within %v: %v", wait, err)
	}
	return msg
}

// blockingAck is a message whose acknowledgement never leaves: the
// process says "committed" on stdout and waits to be killed.
type blockingAck struct{ jetstream.Msg }

func (m blockingAck) block() error {
	fmt.Println("committed")
	select {}
}
func (m blockingAck) Ack() error                      { return m.block() }
func (m blockingAck) DoubleAck(context.Context) error { return m.block() }

// TestMain runs the child process of TestCrashBetweenCommitAndAck when
// IDEMNATS_HELPER is set, the tests otherwise.
func TestMain(m *testing.M) {
	if raw := os.Getenv("IDEMNATS_HELPER"); raw != "" {
		if err := helperConsumer(raw); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
		}
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// helperConsumer handles one message and blocks before acking it; it
// returns only on failure.
func helperConsumer(raw string) error {
	var n names
	if err := json.Unmarshal([]byte(raw), &n); err != nil {
		return err
	}
	ctx := context.Background()
	nc, err := nats.Connect(os.Getenv("IDEMPOTENCY_NATS_URL"))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, n.Stream, n.Consumer)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMPOTENCY_POSTGRES_DSN"))
	if err != nil {
		return err
	}
	store, err := postgres.New(pool, &postgres.Config{Table: n.Table + "_keys"})
	if err != nil {
		return err
	}
	guard, err := idempotency.New(store, nil)
	if err != nil {
		return err
	}
	f := &fixture{effects: `"` + n.Table + `_effects"`}
	c, err := idemnats.New(guard, f.handler(nil), &idemnats.Config{Scope: "billing"})
	if err != nil {
		return err
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		return err
	}
	_, err = c.Handle(ctx, blockingAck{msg})
	return fmt.Errorf("Handle returned %v instead of blocking in the ack", err)
}
