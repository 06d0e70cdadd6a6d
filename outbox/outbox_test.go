package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
)

// each runs f on PostgreSQL, MySQL/MariaDB and SQLite.
func each(t *testing.T, f func(t *testing.T, d *db)) {
	t.Run("postgres", func(t *testing.T) { t.Parallel(); f(t, newPostgres(t, 4)) })
	t.Run("mysql", func(t *testing.T) { t.Parallel(); f(t, newSQL(t, outbox.MySQL)) })
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); f(t, newSQL(t, outbox.SQLite)) })
}

func events(key idempotency.Key, n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{
			Key:     key,
			Purpose: fmt.Sprintf("event-%d", i),
			Subject: "orders.created",
			Payload: fmt.Appendf(nil, `{"key":%q,"n":%d}`, key.ID, i),
		}
	}
	return evs
}

// The events commit with the effect and the key, are not written again by a
// replay, and vanish with a rolled-back attempt.
func TestWriteCommitsWithTheKey(t *testing.T) {
	each(t, func(t *testing.T, d *db) {
		ctx := testCtx(t, time.Minute)
		ob := d.q(d.ob.Table())
		effects := d.q(d.ob.Table() + "_effects")
		key := idempotency.Key{Scope: "acct-1", ID: "order-1"}

		boom := errors.New("boom")
		if _, err := d.do(ctx, key, "fp", events(key, 2), boom); !errors.Is(err, boom) {
			t.Fatalf("failing fn: err = %v, want %v", err, boom)
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+ob); n != 0 {
			t.Fatalf("after a rolled-back attempt: %d outbox rows, want 0", n)
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+effects); n != 0 {
			t.Fatalf("after a rolled-back attempt: %d effects, want 0", n)
		}

		for i := range 3 {
			resp, err := d.do(ctx, key, "fp", events(key, 2), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Replayed != (i > 0) {
				t.Fatalf("call %d: Replayed = %v", i, resp.Replayed)
			}
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+ob+" WHERE sent_at IS NULL"); n != 2 {
			t.Fatalf("%d unsent outbox rows, want 2", n)
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+effects); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}

		// The relay reads back exactly what was written.
		rec := &recorder{}
		relay, err := d.newRely(rec, nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := relay.RunOnce(ctx)
		if err != nil || n != 2 {
			t.Fatalf("RunOnce = %d, %v; want 2, nil", n, err)
		}
		want := events(key, 2)
		for i, m := range rec.msgs {
			if m.MsgID != want[i].MsgID() || m.MsgID != key.Derive("outbox", want[i].Purpose) ||
				m.Subject != want[i].Subject || !bytes.Equal(m.Payload, want[i].Payload) || m.Header != nil {
				t.Errorf("message %d = %+v, want the event %+v (MsgID %s)", i, m, want[i], want[i].MsgID())
			}
		}
		if n, err := relay.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("second RunOnce = %d, %v; want 0, nil", n, err)
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+ob+" WHERE sent_at IS NOT NULL"); n != 2 {
			t.Fatalf("%d rows marked sent, want 2", n)
		}
	})
}

func TestHeaderAndEmptyPayload(t *testing.T) {
	each(t, func(t *testing.T, d *db) {
		ctx := testCtx(t, time.Minute)
		key := idempotency.Key{ID: "h"}
		ev := outbox.Event{Key: key, Purpose: "p", Subject: "s.x",
			Header: map[string][]string{"Content-Type": {"application/json"}, "X-Two": {"a", "b"}}}
		if _, err := d.do(ctx, key, "fp", []outbox.Event{ev}, nil); err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		relay, err := d.newRely(rec, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := relay.RunOnce(ctx); err != nil || n != 1 {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
		m := rec.msgs[0]
		if !reflect.DeepEqual(m.Header, ev.Header) || m.Payload == nil || len(m.Payload) != 0 {
			t.Fatalf("got header %v payload %#v; want %v and an empty payload", m.Header, m.Payload, ev.Header)
		}
	})
}

func TestInvalidEvents(t *testing.T) {
	each(t, func(t *testing.T, d *db) {
		ctx := testCtx(t, time.Minute)
		key := idempotency.Key{ID: "k"}
		for name, ev := range map[string]outbox.Event{
			"no purpose": {Key: key, Subject: "s"},
			"no subject": {Key: key, Purpose: "p"},
			"bad key":    {Key: idempotency.Key{}, Purpose: "p", Subject: "s"},
		} {
			good := events(key, 1)[0]
			_, err := d.do(ctx, key, "fp", []outbox.Event{good, ev}, nil)
			if !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Errorf("%s: err = %v, want ErrInvalidEvent", name, err)
			}
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+d.q(d.ob.Table())); n != 0 {
			t.Fatalf("%d rows written, want 0", n)
		}
	})
}

// A failing publisher leaves the batch unsent; the next relay publishes the
// same rows under the same ids.
func TestPublishFailureLeavesRowsUnsent(t *testing.T) {
	each(t, func(t *testing.T, d *db) {
		ctx := testCtx(t, time.Minute)
		key := idempotency.Key{ID: "f"}
		if _, err := d.do(ctx, key, "fp", events(key, 3), nil); err != nil {
			t.Fatal(err)
		}
		down := errors.New("broker down")
		var seen []string
		failing, err := d.newRely(outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) error {
			for _, m := range msgs {
				seen = append(seen, m.MsgID)
			}
			return down
		}), nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := failing.RunOnce(ctx); !errors.Is(err, down) || n != 0 {
			t.Fatalf("RunOnce = %d, %v; want 0 and %v", n, err, down)
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+d.q(d.ob.Table())+" WHERE sent_at IS NULL"); n != 3 {
			t.Fatalf("%d unsent rows after a failed publish, want 3", n)
		}
		rec := &recorder{}
		relay, err := d.newRely(rec, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := relay.RunOnce(ctx); err != nil || n != 3 {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
		var again []string
		for _, m := range rec.msgs {
			again = append(again, m.MsgID)
		}
		if !slices.Equal(seen, again) {
			t.Fatalf("ids published again %v, want the failed batch's %v", again, seen)
		}
	})
}

// Several relays on one table at once: each row is published exactly once
// (no failures here), in batches of at most Batch rows, and a second relay
// claims other rows while the first one holds its batch (SKIP LOCKED: it
// does not wait for it).
func TestConcurrentRelays(t *testing.T) {
	each(t, func(t *testing.T, d *db) {
		ctx := testCtx(t, 2*time.Minute)
		const keys, perKey, batch = 60, 5, 16
		var wg sync.WaitGroup
		errs := make(chan error, keys)
		for i := range keys {
			wg.Go(func() {
				key := idempotency.Key{Scope: "s", ID: fmt.Sprintf("k%03d", i)}
				if _, err := d.do(ctx, key, "fp", events(key, perKey), nil); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}

		rec := &recorder{}
		// The first batch is held until another relay has published a
		// batch of its own: proof that relays skip locked rows instead of
		// waiting for them (SQLite's relays take turns: not held there).
		var holdOnce, releaseOnce sync.Once
		overlap := make(chan struct{})
		pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) error {
			held := false
			holdOnce.Do(func() { held = true })
			switch {
			case held && d.name != "sqlite":
				select {
				case <-overlap:
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Second):
					return errors.New("no other relay published while this batch was held")
				}
			case !held:
				defer releaseOnce.Do(func() { close(overlap) })
			}
			return rec.Publish(ctx, msgs)
		})
		const relays = 4
		relayErrs := make(chan error, relays)
		var total atomic.Int64
		for range relays {
			relay, err := d.newRely(pub, &outbox.RelayConfig{Batch: batch})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for ctx.Err() == nil && total.Load() < keys*perKey {
					n, err := relay.RunOnce(ctx)
					if err != nil {
						relayErrs <- err
						return
					}
					total.Add(int64(n))
					if n == 0 {
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		close(relayErrs)
		for err := range relayErrs {
			t.Fatal(err)
		}
		byID := rec.byID()
		if len(byID) != keys*perKey || total.Load() != keys*perKey {
			t.Fatalf("%d distinct messages published, %d marked; want %d", len(byID), total.Load(), keys*perKey)
		}
		for id, ms := range byID {
			if len(ms) != 1 {
				t.Fatalf("message %s published %d times", id, len(ms))
			}
		}
		for _, b := range rec.batches {
			if len(b) > batch || !slices.IsSorted(b) {
				t.Fatalf("batch %v: want at most %d rows in seq order", b, batch)
			}
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+d.q(d.ob.Table())+" WHERE sent_at IS NULL"); n != 0 {
			t.Fatalf("%d rows left unsent", n)
		}
	})
}

// PurgeSent deletes only rows sent long enough ago.
func TestPurgeSent(t *testing.T) {
	each(t, func(t *testing.T, d *db) {
		ctx := testCtx(t, time.Minute)
		key := idempotency.Key{ID: "p"}
		if _, err := d.do(ctx, key, "fp", events(key, 5), nil); err != nil {
			t.Fatal(err)
		}
		relay, err := d.newRely(&recorder{}, &outbox.RelayConfig{Batch: 3})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := relay.RunOnce(ctx); err != nil || n != 3 {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
		if n, err := relay.PurgeSent(ctx, time.Hour, 100); err != nil || n != 0 {
			t.Fatalf("PurgeSent(1h) = %d, %v; want 0", n, err)
		}
		time.Sleep(50 * time.Millisecond)
		if n, err := relay.PurgeSent(ctx, 10*time.Millisecond, 2); err != nil || n != 2 {
			t.Fatalf("PurgeSent(10ms, 2) = %d, %v; want 2", n, err)
		}
		if n, err := relay.PurgeSent(ctx, 10*time.Millisecond, 100); err != nil || n != 1 {
			t.Fatalf("PurgeSent(10ms, 100) = %d, %v; want 1", n, err)
		}
		if n := d.count(ctx, "SELECT COUNT(*) FROM "+d.q(d.ob.Table())+" WHERE sent_at IS NULL"); n != 2 {
			t.Fatalf("%d unsent rows left, want 2", n)
		}
	})
}

// With a pool of one connection, callers writing events and relays
// publishing them all finish: nothing asks for a second connection while it
// holds one.
func TestPoolOfOne(t *testing.T) {
	d := newPostgres(t, 1)
	ctx := testCtx(t, time.Minute)
	rec := &recorder{}
	relay, err := d.newRely(rec, &outbox.RelayConfig{Batch: 4})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 10 {
		wg.Go(func() {
			key := idempotency.Key{ID: fmt.Sprintf("one-%d", i)}
			if _, err := d.do(ctx, key, "fp", events(key, 2), nil); err != nil {
				t.Error(err)
				failed.Add(1)
			}
		})
		wg.Go(func() {
			if _, err := relay.RunOnce(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for {
		n, err := relay.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if got := len(rec.byID()); got != 20 {
		t.Fatalf("%d messages published, want 20", got)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, table := range []string{"1abc", "a-b", "a.b.c", "", "x\"y"} {
		if table == "" {
			continue
		}
		if _, err := outbox.New(outbox.Postgres, &outbox.Config{Table: table}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("table %q: err = %v, want ErrInvalidConfig", table, err)
		}
	}
	if _, err := outbox.New(outbox.SQLite, &outbox.Config{Table: "main.outbox"}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("qualified SQLite table: err = %v", err)
	}
	if _, err := outbox.New(outbox.Dialect(9), nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("bad dialect: err = %v", err)
	}
	ob, err := outbox.New(outbox.MySQL, nil)
	if err != nil || ob.Table() != outbox.DefaultTable {
		t.Fatalf("New(MySQL, nil) = %v, %v", ob, err)
	}
	if err := ob.Write(context.Background(), nil, outbox.Event{}); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("Write on MySQL: err = %v", err)
	}
	if _, err := outbox.NewSQLRelay(ob, nil, &recorder{}, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("nil db: err = %v", err)
	}
	if _, err := outbox.NewRelay(ob, nil, &recorder{}, nil); !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Errorf("nil pool: err = %v", err)
	}
}
