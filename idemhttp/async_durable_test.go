package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// labelOp is an operation of one Local step, "label", that fails while
// fail is set and waits for gate (if not nil) before it writes.
func labelOp(fail *atomic.Bool, gate <-chan struct{}) *idempotency.Operation[*memstore.Tx] {
	return &idempotency.Operation[*memstore.Tx]{
		Name: "ship",
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "label", Local: func(ctx context.Context, tx *memstore.Tx, _ *idempotency.State) error {
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if fail.Load() {
				return errors.New("label printer unavailable")
			}
			tx.Effect("label")
			return nil
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"label":1}`)}, nil
		},
	}
}

// TestAsyncFirstStepFailsStaysAccepted: a new key whose first Local step
// fails answers 202, and its status resource then says in progress, not
// 404: Async commits the operation before its first step, so the
// Completer finishes it, and the status resource serves that answer.
func TestAsyncFirstStepFailsStaysAccepted(t *testing.T) {
	ctx := testkit.Context(t, 10*time.Second)
	s := memstore.New()
	g, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	fail.Store(true)
	op := labelOp(&fail, nil)
	srv := asyncServer(t, g, op, time.Second)
	first := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "k1", `{}`)
	if first.status != http.StatusAccepted || first.header.Get("Location") != opsPath(t, "acct", "k1") {
		t.Fatalf("POST: %+v; want 202 with the Location of k1", first)
	}
	if st := asyncCall(t, ctx, "GET", srv.URL+opsPath(t, "acct", "k1"), "acct", "", ""); st.status != http.StatusAccepted || st.body != `{"status":"in_progress"}` {
		t.Fatalf("GET after the failure: %+v; want 202 in_progress", st)
	}
	fail.Store(false)
	c, err := idempotency.NewCompleter(g, &idempotency.CompleterConfig{Grace: time.Millisecond}, op)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past the grace
	if rep, err := c.Once(ctx); err != nil || rep.Finished != 1 {
		t.Fatalf("Completer: %+v, %v; want 1 finished", rep, err)
	}
	labelServed(t, ctx, srv.URL, s, "after the Completer")
}

// TestAsyncAcceptedOnlyOnceStored: when Wait passes while the first step
// runs, the 202 comes with the operation already in the store (a process
// that died right after it would leave it to the Completer).
func TestAsyncAcceptedOnlyOnceStored(t *testing.T) {
	ctx := testkit.Context(t, 10*time.Second)
	s := memstore.New()
	g, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	gate := make(chan struct{})
	srv := asyncServer(t, g, labelOp(&fail, gate), 20*time.Millisecond)
	first := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "k1", `{}`)
	info, err := s.Inspect(ctx, idempotency.Key{Scope: "acct", ID: "k1"}, false)
	close(gate)
	if first.status != http.StatusAccepted {
		t.Fatalf("POST: %+v; want 202", first)
	}
	if err != nil || info.Progress == nil || info.State != backend.KeyInProgress {
		t.Fatalf("the store at the 202: %+v, %v; want the operation committed, its lease live", info, err)
	}
	testkit.WaitUntil(t, 5*time.Second, "the operation completed", func() bool {
		info, err := s.Inspect(ctx, idempotency.Key{Scope: "acct", ID: "k1"}, false)
		return err == nil && info.State == backend.KeyCompleted
	})
	labelServed(t, ctx, srv.URL, s, "once the step ran")
}

// labelServed checks that the status resource of k1 serves labelOp's
// stored answer and that the label was written once.
func labelServed(t *testing.T, ctx context.Context, url string, s *memstore.Store, when string) {
	t.Helper()
	if st := asyncCall(t, ctx, "GET", url+opsPath(t, "acct", "k1"), "acct", "", ""); st.status != http.StatusCreated || st.body != `{"label":1}` {
		t.Fatalf("GET %s: %+v; want the stored 201", when, st)
	}
	if n := s.Count("label"); n != 1 {
		t.Fatalf("labels %d; want 1", n)
	}
}

// TestAsyncHeldUnstoredIsInProgress: the key is held, uncommitted, by
// another process's run (a plain Guard.Run of the op, not Durable, in its
// first Local step). Async answers after Wait and at most a second more
// (not its run's WaitTimeout, 5 s here), and with 409 in progress, not a
// 202 that nothing stored backs.
func TestAsyncHeldUnstoredIsInProgress(t *testing.T) {
	ctx := testkit.Context(t, 10*time.Second)
	s := memstore.New()
	gA, err := idempotency.New[*memstore.Tx](s, &idempotency.Config{WaitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	gB, err := idempotency.New[*memstore.Tx](s, nil)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	started := make(chan struct{}, 1) // buffered: the step may start before the test waits for it
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "ship",
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "label", Local: func(ctx context.Context, tx *memstore.Tx, _ *idempotency.State) error {
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			return errors.New("printer down")
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: http.StatusCreated}, nil
		},
	}
	srv := asyncServer(t, gA, op, 20*time.Millisecond)
	bDone := make(chan error, 1)
	go func() {
		_, err := gB.Run(ctx, idempotency.Key{Scope: "acct", ID: "k1"}, "whatever", nil, op)
		bDone <- err
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the other process's run never reached its first step")
	}
	t0 := time.Now()
	first := asyncCall(t, ctx, "POST", srv.URL+"/ship", "acct", "k1", `{}`)
	took := time.Since(t0)
	close(gate)
	if err := <-bDone; !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("the other process's run: %v; want its first step's failure", err)
	}
	if took > 3*time.Second || first.status != http.StatusConflict || first.header.Get("Location") != "" {
		t.Fatalf("POST: %d (Location %q) after %v with Wait 20ms; want 409 in progress, well before the run's WaitTimeout", first.status, first.header.Get("Location"), took)
	}
}
