package outboxnats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/outboxnats"
	"github.com/go-idempotency/idempotency/postgres"
)

// helper is what the parent tells the child relay.
type helper struct {
	Stream, Table, Point string
}

// TestMain runs the child relay when OUTBOXNATS_HELPER is set.
func TestMain(m *testing.M) {
	if raw := os.Getenv("OUTBOXNATS_HELPER"); raw != "" {
		if err := childRelay(raw); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
		}
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// stuck wraps the real publisher and stops at h.Point: "claimed" (before
// publishing anything), "partial" (after the first half), "published"
// (after all of them, before the relay marks them sent). There it prints
// "stopped" and waits to be killed.
type stuck struct {
	inner outbox.Publisher
	point string
}

func (s stuck) Publish(ctx context.Context, msgs []outbox.Message) error {
	switch s.point {
	case "partial":
		if err := s.inner.Publish(ctx, msgs[:len(msgs)/2]); err != nil {
			return err
		}
	case "published":
		if err := s.inner.Publish(ctx, msgs); err != nil {
			return err
		}
	}
	fmt.Println("stopped")
	select {}
}

func childRelay(raw string) error {
	var h helper
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
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
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMPOTENCY_POSTGRES_DSN"))
	if err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Postgres, &outbox.Config{Table: h.Table})
	if err != nil {
		return err
	}
	pub, err := outboxnats.NewPublisher(js, &outboxnats.Config{ExpectStream: h.Stream})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(ob, pool, stuck{inner: pub, point: h.Point}, nil)
	if err != nil {
		return err
	}
	_, err = relay.RunOnce(ctx)
	return fmt.Errorf("RunOnce returned %v instead of blocking", err)
}

type fixture struct {
	js     jetstream.JetStream
	pool   *pgxpool.Pool
	ob     *outbox.Outbox
	guard  *idempotency.Guard[pgx.Tx]
	stream string
	table  string
}

func setup(t *testing.T, ctx context.Context) *fixture {
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
	f := &fixture{js: js, pool: pool, stream: testkit.Name("OUTBOX_"), table: testkit.Name("outboxnats_")}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.stream + ".>"}, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, f.stream); err != nil {
			t.Errorf("delete stream: %v", err)
		}
	})
	if f.ob, err = outbox.New(outbox.Postgres, &outbox.Config{Table: f.table}); err != nil {
		t.Fatal(err)
	}
	if err := f.ob.MigratePgx(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(pool, &postgres.Config{Table: f.table + "_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{"", "_keys"} {
			if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "`+f.table+s+`"`); err != nil {
				t.Errorf("drop: %v", err)
			}
		}
	})
	if f.guard, err = idempotency.New(store, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// write runs n operations through the guard, each writing two events.
func (f *fixture) write(t *testing.T, ctx context.Context, n int) []outbox.Event {
	var all []outbox.Event
	for i := range n {
		key := idempotency.Key{Scope: "shop", ID: fmt.Sprintf("order-%d", i)}
		evs := []outbox.Event{
			{Key: key, Purpose: "created", Subject: f.stream + ".orders.created", Payload: fmt.Appendf(nil, `{"order":%d}`, i)},
			{Key: key, Purpose: "email", Subject: f.stream + ".emails", Payload: fmt.Appendf(nil, `{"to":%d}`, i),
				Header: map[string][]string{"Content-Type": {"application/json"}}},
		}
		if _, err := f.guard.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, f.ob.Write(ctx, tx, evs...)
		}); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	return all
}

func (f *fixture) streamMsgs(t *testing.T, ctx context.Context) map[string]*jetstream.RawStreamMsg {
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*jetstream.RawStreamMsg{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if got[id] != nil {
			t.Fatalf("message %s stored twice (seq %d and %d)", id, got[id].Sequence, seq)
		}
		got[id] = m
	}
	if uint64(len(got)) != info.State.Msgs {
		t.Fatalf("%d distinct ids for %d messages", len(got), info.State.Msgs)
	}
	return got
}

// A relay killed at any point of a batch loses nothing and duplicates
// nothing: the next relay publishes the unsent rows again under the same
// Nats-Msg-Id and the stream drops what it already has.
func TestRelayKilled(t *testing.T) {
	for _, point := range []string{"claimed", "partial", "published"} {
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			f := setup(t, ctx)
			events := f.write(t, ctx, 4)

			raw, _ := json.Marshal(helper{Stream: f.stream, Table: f.table, Point: point})
			cmd, out := testkit.StartChild(t, ctx, "OUTBOXNATS_HELPER="+string(raw))
			ok := testkit.WaitForLine(out, "stopped", 30*time.Second)
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if !ok {
				t.Fatal("the child relay did not reach its stop point")
			}

			before := map[string]int{"claimed": 0, "partial": len(events) / 2, "published": len(events)}[point]
			if got := len(f.streamMsgs(t, ctx)); got != before {
				t.Fatalf("stream holds %d messages when the relay is killed, want %d", got, before)
			}
			var unsent int
			if err := f.pool.QueryRow(ctx, `SELECT COUNT(*) FROM "`+f.table+`" WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
				t.Fatal(err)
			}
			if unsent != len(events) {
				t.Fatalf("%d unsent rows after the kill, want %d", unsent, len(events))
			}

			pub, err := outboxnats.NewPublisher(f.js, &outboxnats.Config{ExpectStream: f.stream})
			if err != nil {
				t.Fatal(err)
			}
			relay, err := outbox.NewRelay(f.ob, f.pool, pub, &outbox.RelayConfig{Batch: 3})
			if err != nil {
				t.Fatal(err)
			}
			// The dead child's row locks go with its connection, once the
			// server has noticed the closed socket: until then its rows are
			// skipped (n == 0), as Relay.Run would, and looked at again.
			total := 0
			for total < len(events) && ctx.Err() == nil {
				n, err := relay.RunOnce(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					time.Sleep(20 * time.Millisecond)
				}
				total += n
			}
			if n, err := relay.RunOnce(ctx); n != 0 || err != nil {
				t.Fatalf("RunOnce after all were sent = %d, %v", n, err)
			}
			if total != len(events) {
				t.Fatalf("the fresh relay marked %d rows sent, want %d", total, len(events))
			}
			got := f.streamMsgs(t, ctx)
			if len(got) != len(events) {
				t.Fatalf("stream holds %d messages, want %d", len(got), len(events))
			}
			for _, ev := range events {
				m := got[ev.MsgID()]
				if m == nil || m.Subject != ev.Subject || string(m.Data) != string(ev.Payload) ||
					m.Header.Get("Content-Type") != first(ev.Header["Content-Type"]) {
					t.Fatalf("event %s/%s: stream has %+v", ev.Key.ID, ev.Purpose, m)
				}
			}
		})
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// A subject outside the expected stream fails the batch, which stays
// unsent.
func TestPublishFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := setup(t, ctx)
	key := idempotency.Key{ID: "k"}
	if _, err := f.guard.Do(ctx, key, "fp", func(tx pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, f.ob.Write(ctx, tx, outbox.Event{Key: key, Purpose: "p", Subject: "nowhere." + f.stream})
	}); err != nil {
		t.Fatal(err)
	}
	pub, err := outboxnats.NewPublisher(f.js, nil)
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(f.ob, f.pool, pub, &outbox.RelayConfig{PublishTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); err == nil || n != 0 {
		t.Fatalf("RunOnce = %d, %v; want a failure", n, err)
	}
	var unsent int
	if err := f.pool.QueryRow(ctx, `SELECT COUNT(*) FROM "`+f.table+`" WHERE sent_at IS NULL`).Scan(&unsent); err != nil || unsent != 1 {
		t.Fatalf("%d unsent rows (%v), want 1", unsent, err)
	}
	if _, err := outboxnats.NewPublisher(nil, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("nil js: %v", err)
	}
}
