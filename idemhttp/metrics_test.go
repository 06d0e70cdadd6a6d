package idemhttp_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
)

func TestMetricEventsSQLite(t *testing.T) {
	t.Parallel()
	testMetricEvents(t, sqliteEnv(t))
}

func TestMetricEventsPostgres(t *testing.T) {
	t.Parallel()
	testMetricEvents(t, postgresEnv(t))
}

// testMetricEvents: over real HTTP, the Event fields behind the seven
// metrics: a waiter's wait, the age of a record replayed from the store,
// and the purge's batches with their deleted counts.
func testMetricEvents[Tx any](t *testing.T, e env[Tx]) {
	ctx := testkit.Context(t, 30*time.Second)
	var mu sync.Mutex
	var events []idemhttp.RequestEvent
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := startServer(t, e, &idempotency.Config{TTL: 2 * time.Second}, &idemhttp.Options{Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}}, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			once.Do(func() { close(entered) })
			<-release
		}
		created(n, w, r)
	})
	done := make(chan result, 1)
	go func() { done <- s.post(t, `{}`, "m1") }()
	<-entered
	waiter := make(chan result, 1)
	go func() { waiter <- s.post(t, `{}`, "m1") }()
	time.Sleep(100 * time.Millisecond)
	close(release)
	wantStatus(t, <-done, http.StatusCreated)
	wantStatus(t, <-waiter, http.StatusCreated)
	time.Sleep(50 * time.Millisecond)
	wantStatus(t, s.post(t, `{}`, "m1"), http.StatusCreated) // replayed from the store
	mu.Lock()
	got := append([]idemhttp.RequestEvent(nil), events...)
	mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("%d events, want 3", len(got))
	}
	var executed, waited, stored int
	for _, ev := range got {
		switch {
		case ev.Outcome == observe.Executed:
			executed++
		case ev.Outcome == observe.Replayed && ev.Waited >= 50*time.Millisecond && ev.RecordAge == 0:
			waited++ // handed the answer in memory after waiting for it
		case ev.Outcome == observe.Replayed && ev.Waited == 0 && ev.RecordAge >= 40*time.Millisecond && ev.RecordAge < 10*time.Second:
			stored++
		}
	}
	if executed != 1 || waited != 1 || stored != 1 {
		t.Fatalf("events %+v: want one executed, one waiter that waited, one replay from the store with its record's age", got)
	}

	// Purge: one event per batch, with what it deleted.
	var batches []int
	g := e.newGuard(&idempotency.Config{PurgeBatch: 1, PurgePause: -1, Observer: func(_ context.Context, ev observe.Event) {
		if ev.Outcome == observe.Purged {
			batches = append(batches, ev.Deleted)
		}
	}})
	wantStatus(t, s.post(t, `{}`, "m2"), http.StatusCreated)
	time.Sleep(2100 * time.Millisecond) // both keys expire (TTL 2s)
	n, err := g.Purge(ctx)
	if err != nil || n != 2 || len(batches) != 3 || batches[0] != 1 || batches[1] != 1 || batches[2] != 0 {
		t.Fatalf("Purge: %d, %v, batches %v; want 2 deleted in batches [1 1 0]", n, err, batches)
	}
}
