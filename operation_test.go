package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/cardstub"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/observe"
)

// processor is the stub card processor with a switch that makes it decline.
type processor struct {
	*cardstub.Processor
	decline bool
}

func newProcessor() *processor { return &processor{Processor: cardstub.New()} }

// checkout is an operation of three steps and a Finish on memstore: each
// Local step records an effect, the Foreign one charges the processor.
func checkout(p *processor, localRuns *atomic.Int64) *idempotency.Operation[*memstore.Tx] {
	return &idempotency.Operation[*memstore.Tx]{
		Name: "checkout",
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
				localRuns.Add(1)
				tx.Effect("order")
				s.Set("order", "o-"+string(s.Input()))
				return nil
			}},
			{Name: "charge", Foreign: func(_ context.Context, s *idempotency.State) error {
				if p.decline {
					return idempotency.FinalAnswer(idempotency.Response{Status: 402, Body: []byte("declined")})
				}
				id, err := p.Charge(s.Key().Derive("charge"))
				if err != nil {
					return err
				}
				s.Set("charge", id)
				return nil
			}},
			{Name: "receipt", Local: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
				localRuns.Add(1)
				tx.Effect("receipt:" + s.Get("charge"))
				return nil
			}},
		},
		Finish: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) (idempotency.Response, error) {
			tx.Effect("email")
			return idempotency.Response{Status: 201, Body: []byte(s.Get("order") + " " + s.Get("charge"))}, nil
		},
	}
}

func TestRunStepsOnceThenReplays(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g := newGuard(t, s, nil)
	p := newProcessor()
	var locals atomic.Int64
	op := checkout(p, &locals)
	key := idempotency.Key{Scope: "acct", ID: "k1"}
	resp, err := g.Run(ctx, key, "fp", []byte("42"), op)
	if err != nil || resp.Replayed || resp.Status != 201 || string(resp.Body) != "o-42 ch_1" {
		t.Fatalf("first run: %+v, %v", resp, err)
	}
	again, err := g.Run(ctx, key, "fp", []byte("ignored"), op)
	if err != nil || !again.Replayed || !bytes.Equal(again.Body, resp.Body) {
		t.Fatalf("second run: %+v, %v; want the replay", again, err)
	}
	if _, err := g.Run(ctx, key, "other", nil, op); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("other fingerprint: %v; want ErrMismatch", err)
	}
	if p.Charges() != 1 || s.Count("order") != 1 || s.Count("receipt:ch_1") != 1 || s.Count("email") != 1 || locals.Load() != 2 {
		t.Fatalf("charges %d, order %d, receipt %d, email %d, local runs %d; want 1 of each and 2 local runs",
			p.Charges(), s.Count("order"), s.Count("receipt:ch_1"), s.Count("email"), locals.Load())
	}
	// A Do with the key replays the operation's answer.
	d, err := g.Do(ctx, key, "fp", ok("never"))
	if err != nil || !d.Replayed || !bytes.Equal(d.Body, resp.Body) || s.Count("never") != 0 {
		t.Fatalf("Do after Run: %+v, %v", d, err)
	}
}

func TestRunConcurrentCallersOneCharge(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := memstore.New()
	// Two Guards on one store: callers meet in memory and in the store.
	gs := []*idempotency.Guard[*memstore.Tx]{newGuard(t, s, nil), newGuard(t, s, nil)}
	p := newProcessor()
	var locals atomic.Int64
	op := checkout(p, &locals)
	key := idempotency.Key{ID: "same"}
	var wg sync.WaitGroup
	resps := make([]idempotency.Response, 20)
	errs := make([]error, 20)
	for i := range resps {
		wg.Go(func() { resps[i], errs[i] = gs[i%2].Run(ctx, key, "fp", []byte("7"), op) })
	}
	wg.Wait()
	for i := range resps {
		if errs[i] != nil || string(resps[i].Body) != "o-7 ch_1" || resps[i].Status != 201 {
			t.Fatalf("caller %d: %+v, %v", i, resps[i], errs[i])
		}
	}
	if p.Charges() != 1 || p.Calls.Load() != 1 || s.Count("order") != 1 || s.Count("email") != 1 {
		t.Fatalf("charges %d (calls %d), orders %d, emails %d; want 1", p.Charges(), p.Calls.Load(), s.Count("order"), s.Count("email"))
	}
}

func TestRunTransientFailureResumes(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	var events []observe.Event
	g := newGuard(t, s, &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) { events = append(events, ev) }})
	p := newProcessor()
	p.Fail.Store(1)
	var locals atomic.Int64
	op := checkout(p, &locals)
	key := idempotency.Key{ID: "flaky"}
	_, err := g.Run(ctx, key, "fp", []byte("9"), op)
	if !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(err, cardstub.ErrDown) {
		t.Fatalf("first run: %v; want ErrUnfinished wrapping the processor's error", err)
	}
	info, err := g.Inspect(ctx, key, false)
	if err != nil || info.State != idempotency.KeyUnfinished || info.Step != "charge" || info.Tries != 1 ||
		info.Operation != "checkout" || !strings.Contains(info.Failure, cardstub.ErrDown.Error()) {
		t.Fatalf("after the failure: %+v, %v", info, err)
	}
	if ev := events[0]; ev.Outcome != observe.Unfinished || ev.Operation != "checkout" || ev.Step != "charge" {
		t.Fatalf("event %+v", ev)
	}
	// A Do with the key meanwhile is refused: the operation holds it.
	if _, err := g.Do(ctx, key, "fp", ok("do")); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("Do on an unfinished key: %v; want ErrInProgress", err)
	}
	resp, err := g.Run(ctx, key, "fp", []byte("changed input is ignored"), op)
	if err != nil || string(resp.Body) != "o-9 ch_1" {
		t.Fatalf("retry: %+v, %v", resp, err)
	}
	if s.Count("order") != 1 || locals.Load() != 2 || p.Charges() != 1 || p.Calls.Load() != 2 {
		t.Fatalf("orders %d, local runs %d, charges %d, calls %d; want 1, 2, 1, 2", s.Count("order"), locals.Load(), p.Charges(), p.Calls.Load())
	}
}

func TestRunStop(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g := newGuard(t, s, nil)
	p := newProcessor()
	p.decline = true
	var locals atomic.Int64
	op := checkout(p, &locals)
	key := idempotency.Key{ID: "declined"}
	resp, err := g.Run(ctx, key, "fp", nil, op)
	if err != nil || resp.Status != 402 || string(resp.Body) != "declined" {
		t.Fatalf("declined run: %+v, %v", resp, err)
	}
	again, err := g.Run(ctx, key, "fp", nil, op)
	if err != nil || !again.Replayed || again.Status != 402 {
		t.Fatalf("replay: %+v, %v", again, err)
	}
	if s.Count("order") != 1 || s.Count("email") != 0 || p.Charges() != 0 {
		t.Fatalf("orders %d, emails %d, charges %d; want 1, 0, 0", s.Count("order"), s.Count("email"), p.Charges())
	}

	// A Stop from a Local step commits that step's writes with the answer.
	stopLocal := &idempotency.Operation[*memstore.Tx]{
		Name: "refuse",
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "check", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error {
			tx.Effect("refused")
			return idempotency.FinalAnswer(idempotency.Response{Status: 409, Body: []byte("no")})
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			t.Error("Finish ran after a Stop")
			return idempotency.Response{Status: 200}, nil
		},
	}
	resp, err = g.Run(ctx, idempotency.Key{ID: "refused"}, "fp", nil, stopLocal)
	if err != nil || resp.Status != 409 || s.Count("refused") != 1 {
		t.Fatalf("Stop in a Local step: %+v, %v, effects %d", resp, err, s.Count("refused"))
	}
}

func TestRunFirstStepFailureFreesKey(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g := newGuard(t, s, nil)
	fail := true
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "one",
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "write", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error {
			tx.Effect("write")
			if fail {
				return errors.New("boom")
			}
			return nil
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 200, Body: []byte("done")}, nil
		},
	}
	key := idempotency.Key{ID: "first"}
	if _, err := g.Run(ctx, key, "fp", nil, op); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("failing first step: %v", err)
	}
	if _, err := g.Inspect(ctx, key, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("after a failed first step: %v; want ErrNotFound (nothing committed)", err)
	}
	fail = false
	// Another fingerprint now: the key was never taken.
	if resp, err := g.Run(ctx, key, "fp2", nil, op); err != nil || string(resp.Body) != "done" || s.Count("write") != 1 {
		t.Fatalf("retry: %+v, %v, writes %d", resp, err, s.Count("write"))
	}
}

// TestRunResumesAfterLeaseEnds: a run that died (its lease live, nothing
// released) holds the key until the lease ends by the store's clock; then a
// retry resumes it, repeating the foreign call with the same derived key.
func TestRunResumesAfterLeaseEnds(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	g := newGuard(t, s, &idempotency.Config{WaitTimeout: -1})
	p := newProcessor()
	var locals atomic.Int64
	op := checkout(p, &locals)
	op.Lease = time.Minute
	died := errors.New("killed")
	// The first run "dies" inside the foreign call, after the processor
	// charged: its ctx ends and it returns without a release.
	dying := *op
	dying.Steps = append([]idempotency.Step[*memstore.Tx](nil), op.Steps...)
	dying.Steps[1].Foreign = func(ctx context.Context, s *idempotency.State) error {
		if _, err := p.Charge(s.Key().Derive("charge")); err != nil {
			return err
		}
		panic(died)
	}
	key := idempotency.Key{ID: "crash"}
	func() {
		defer func() {
			if r := recover(); r != died {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = g.Run(ctx, key, "fp", []byte("5"), &dying)
	}()
	if _, err := g.Run(ctx, key, "fp", nil, op); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("retry within the lease: %v; want ErrInProgress", err)
	}
	advance(time.Minute)
	resp, err := g.Run(ctx, key, "fp", nil, op)
	if err != nil || string(resp.Body) != "o-5 ch_1" {
		t.Fatalf("retry after the lease: %+v, %v", resp, err)
	}
	if p.Charges() != 1 || p.Calls.Load() != 2 || s.Count("order") != 1 || s.Count("receipt:ch_1") != 1 {
		t.Fatalf("charges %d, calls %d, orders %d; want 1, 2, 1", p.Charges(), p.Calls.Load(), s.Count("order"))
	}
}

func TestCompleter(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	var events []observe.Event
	g := newGuard(t, s, &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) { events = append(events, ev) }})
	p := newProcessor()
	var locals atomic.Int64
	op := checkout(p, &locals)
	p.Fail.Store(3) // three keys fail at the charge
	for i := range 3 {
		if _, err := g.Run(ctx, idempotency.Key{ID: fmt.Sprint("k", i)}, "fp", []byte(fmt.Sprint(i)), op); !errors.Is(err, idempotency.ErrUnfinished) {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	c, err := idempotency.NewCompleter(g, &idempotency.CompleterConfig{Grace: time.Minute, Batch: 2, MaxTries: 2}, op)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.Once(ctx)
	if err != nil || rep.Listed != 0 {
		t.Fatalf("within the grace: %+v, %v; want nothing listed", rep, err)
	}
	advance(time.Minute)
	p.Fail.Store(1) // the first resumed key fails again: its second try
	rep, err = c.Once(ctx)
	if err != nil || rep.Listed != 2 || rep.Finished != 1 || rep.Failed != 1 || rep.Exhausted != 1 {
		t.Fatalf("first pass: %+v, %v; want 2 listed, 1 finished, 1 failed and exhausted", rep, err)
	}
	var exhausted idempotency.Key
	for _, ev := range events {
		if ev.Outcome == observe.Exhausted && ev.Operation == "checkout" && ev.Step == "charge" {
			exhausted = ev.Key
		}
	}
	if exhausted.ID == "" {
		t.Fatalf("no Exhausted event among %+v", events)
	}
	advance(time.Minute)
	rep, err = c.Once(ctx)
	if err != nil || rep.Listed != 1 || rep.Finished != 1 {
		t.Fatalf("second pass: %+v, %v; want the third key finished, the exhausted one not listed", rep, err)
	}
	st, err := g.Stats(ctx)
	if err != nil || st.Unfinished != 1 || st.Failing != 1 || st.Completed != 2 {
		t.Fatalf("stats %+v, %v; want 1 unfinished (exhausted), 2 completed", st, err)
	}
	// Purge never deletes it, even years later.
	advance(100 * 365 * 24 * time.Hour)
	if _, err := g.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := g.Stats(ctx); st.Unfinished != 1 || st.Completed != 0 {
		t.Fatalf("after a purge: %+v; want the unfinished key kept", st)
	}
	// A client's retry still finishes it.
	if _, err := g.Run(ctx, exhausted, "fp", nil, op); err != nil {
		t.Fatalf("client retry of the exhausted key: %v", err)
	}
	if p.Charges() != 3 {
		t.Fatalf("charges %d; want 3", p.Charges())
	}
}

func TestRunValidation(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g := newGuard(t, s, nil)
	fin := func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
		return idempotency.Response{Status: 200}, nil
	}
	local := func(context.Context, *memstore.Tx, *idempotency.State) error { return nil }
	bad := map[string]*idempotency.Operation[*memstore.Tx]{
		"nil":        nil,
		"no name":    {Finish: fin},
		"no finish":  {Name: "x"},
		"both funcs": {Name: "x", Finish: fin, Steps: []idempotency.Step[*memstore.Tx]{{Name: "a", Local: local, Foreign: func(context.Context, *idempotency.State) error { return nil }}}},
		"no func":    {Name: "x", Finish: fin, Steps: []idempotency.Step[*memstore.Tx]{{Name: "a"}}},
		"dup step":   {Name: "x", Finish: fin, Steps: []idempotency.Step[*memstore.Tx]{{Name: "a", Local: local}, {Name: "a", Local: local}}},
		"bad step":   {Name: "x", Finish: fin, Steps: []idempotency.Step[*memstore.Tx]{{Name: "a\n", Local: local}}},
		"tiny lease": {Name: "x", Finish: fin, Lease: time.Microsecond},
	}
	for name, op := range bad {
		if _, err := g.Run(ctx, idempotency.Key{ID: "v"}, "fp", nil, op); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("%s: %v; want ErrInvalidConfig", name, err)
		}
	}
	op := &idempotency.Operation[*memstore.Tx]{Name: "x", Finish: fin}
	if _, err := g.Run(ctx, idempotency.Key{ID: "v"}, "fp", make([]byte, backend.MaxProgressLen), op); !errors.Is(err, idempotency.ErrTooLarge) {
		t.Errorf("oversized input: %v; want ErrTooLarge", err)
	}
	if _, err := g.Run(ctx, idempotency.Key{ID: ""}, "fp", nil, op); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Errorf("empty key: %v; want ErrInvalidKey", err)
	}
	if _, err := g.Inspect(ctx, idempotency.Key{ID: "v"}, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("after refusals: %v; want nothing written", err)
	}
	// A store without Stepper refuses operations.
	plain := newGuardOn(t, onlyKeyStore{s})
	if _, err := plain.Run(ctx, idempotency.Key{ID: "v"}, "fp", nil, op); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("store without Stepper: %v; want errors.ErrUnsupported", err)
	}
	if _, err := plain.Inspect(ctx, idempotency.Key{ID: "v"}, false); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("store without KeyAdmin: %v; want errors.ErrUnsupported", err)
	}
}

// onlyKeyStore hides every optional interface of a store.
type onlyKeyStore struct{ s *memstore.Store }

func (o onlyKeyStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*memstore.Tx], *backend.Record, error) {
	return o.s.Reserve(ctx, r)
}
func (o onlyKeyStore) Purge(ctx context.Context, limit int) (int, error) {
	return o.s.Purge(ctx, limit)
}

func newGuardOn(t *testing.T, s idempotency.KeyStore[*memstore.Tx]) *idempotency.Guard[*memstore.Tx] {
	t.Helper()
	g, err := idempotency.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestForget(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	var events []observe.Event
	g := newGuard(t, s, &idempotency.Config{Observer: func(_ context.Context, ev observe.Event) { events = append(events, ev) }})
	key := idempotency.Key{Scope: "a", ID: "f"}
	if _, err := g.Do(ctx, key, "fp", ok("once")); err != nil {
		t.Fatal(err)
	}
	info, err := g.Forget(ctx, key)
	if err != nil || info.State != idempotency.KeyCompleted || info.Status != 201 || info.BodyLen != 4 {
		t.Fatalf("forget: %+v, %v", info, err)
	}
	if ev := events[len(events)-1]; ev.Outcome != observe.Forgotten || ev.Key != key {
		t.Fatalf("event %+v", ev)
	}
	resp, err := g.Do(ctx, key, "fp", ok("once"))
	if err != nil || resp.Replayed || s.Count("once") != 2 {
		t.Fatalf("after forget: %+v, %v, effects %d; want fn run again", resp, err, s.Count("once"))
	}
	if _, err := g.Forget(ctx, idempotency.Key{ID: "absent"}); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
	if _, err := g.Forget(ctx, idempotency.Key{ID: "bad\x00"}); !errors.Is(err, idempotency.ErrInvalidKey) {
		t.Fatalf("bad key: %v", err)
	}
	// A key held by a running call is refused, and stays held.
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := g.Do(ctx, idempotency.Key{ID: "held"}, "fp", func(tx *memstore.Tx) (idempotency.Response, error) {
			close(started)
			<-release
			return idempotency.Response{Status: 200}, nil
		})
		done <- err
	}()
	<-started
	if _, err := g.Forget(ctx, idempotency.Key{ID: "held"}); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("held: %v; want ErrInProgress", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the held call: %v", err)
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g := newGuard(t, s, nil)
	p := newProcessor()
	var locals atomic.Int64
	op := checkout(p, &locals)
	p.Fail.Store(2)
	for _, id := range []string{"b", "B"} {
		if _, err := g.Run(ctx, idempotency.Key{Scope: "s", ID: id}, "fp", nil, op); !errors.Is(err, idempotency.ErrUnfinished) {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"c", "a", "A"} {
		if _, err := g.Do(ctx, idempotency.Key{Scope: "s", ID: id}, "fp", ok(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Do(ctx, idempotency.Key{Scope: "other", ID: "a"}, "fp", ok("x")); err != nil {
		t.Fatal(err)
	}
	var got []string
	q := idempotency.ListQuery{Scope: "s", Limit: 2}
	for {
		page, err := g.List(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range page.Keys {
			got = append(got, k.Key.ID+":"+k.State.String()+":"+k.Step)
		}
		if page.Next == nil {
			break
		}
		q.After = page.Next
	}
	want := "B:unfinished:charge b:unfinished:charge A:completed: a:completed: c:completed:"
	if strings.Join(got, " ") != want {
		t.Fatalf("listed %q; want %q", strings.Join(got, " "), want)
	}
	for _, lim := range []int{0, -1, backend.MaxListLimit + 1} {
		if _, err := g.List(ctx, idempotency.ListQuery{Scope: "s", Limit: lim}); !errors.Is(err, idempotency.ErrInvalidConfig) {
			t.Errorf("limit %d: %v", lim, err)
		}
	}
}

// TestInspectOperation: Inspect tells an unfinished operation (its step)
// from a completed one (its answer, opened), and another scope finds
// nothing.
func TestInspectOperation(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	g := newGuard(t, s, nil)
	p := newProcessor()
	var locals atomic.Int64
	op := checkout(p, &locals)
	p.Fail.Store(1)
	key := idempotency.Key{Scope: "a", ID: "status"}
	if _, err := g.Run(ctx, key, "fp", []byte("3"), op); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatal(err)
	}
	info, err := g.Inspect(ctx, key, true)
	if err != nil || info.State != idempotency.KeyUnfinished || info.Step != "charge" || info.Body != nil {
		t.Fatalf("unfinished: %+v, %v; want unfinished at charge, no answer", info, err)
	}
	want, err := g.Run(ctx, key, "fp", nil, op)
	if err != nil {
		t.Fatal(err)
	}
	info, err = g.Inspect(ctx, key, true)
	if err != nil || info.State != idempotency.KeyCompleted || info.Status != want.Status || !bytes.Equal(info.Body, want.Body) {
		t.Fatalf("completed: %+v, %v; want %+v", info, err, want)
	}
	if _, err := g.Inspect(ctx, idempotency.Key{Scope: "b", ID: "status"}, true); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("another scope: %v; want ErrNotFound", err)
	}
}

// TestRunOtherFingerprintWhileHeld: a run with another fingerprint than
// the run that holds the key's lease gets ErrMismatch at once, not
// ErrInProgress after the wait bound; a run with the same fingerprint still
// waits. A store without KeyAdmin keeps the wait.
func TestRunOtherFingerprintWhileHeld(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := memstore.New()
	holding, release := make(chan struct{}), make(chan struct{})
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "held",
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error {
				tx.Effect("order")
				return nil
			}},
			{Name: "wait", Foreign: func(ctx context.Context, _ *idempotency.State) error {
				close(holding)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}},
		},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("done")}, nil
		},
	}
	key := idempotency.Key{ID: "held"}
	holder := make(chan error, 1)
	go func() {
		_, err := newGuard(t, s, nil).Run(ctx, key, "fp", nil, op)
		holder <- err
	}()
	select {
	case <-holding:
	case err := <-holder:
		t.Fatalf("holder ended before its Foreign step: %v", err)
	}
	// A wait bound longer than the callers' contexts: a caller that waits
	// ends with its context, not with an answer.
	long := newGuard(t, s, &idempotency.Config{WaitTimeout: time.Hour})
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }

	c, stop := short()
	_, err := long.Run(c, key, "other", nil, op)
	stop()
	if !errors.Is(err, idempotency.ErrMismatch) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("other fingerprint while held: %v; want ErrMismatch at once", err)
	}
	c, stop = short()
	_, err = long.Run(c, key, "fp", nil, op)
	stop()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("same fingerprint while held: %v; want to wait until its context ends", err)
	}
	// Without KeyAdmin the store cannot tell: the caller waits out its bound.
	bare, err := idempotency.New[*memstore.Tx](struct {
		idempotency.KeyStore[*memstore.Tx]
		backend.Stepper[*memstore.Tx]
	}{s, s}, &idempotency.Config{WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Run(ctx, key, "other", nil, op); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("other fingerprint, store without KeyAdmin: %v; want ErrInProgress at the wait bound", err)
	}
	close(release)
	if err := <-holder; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if _, err := long.Run(ctx, key, "other", nil, op); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("other fingerprint once completed: %v; want ErrMismatch", err)
	}
	if n := s.Count("order"); n != 1 {
		t.Fatalf("order effects: %d, want 1", n)
	}
}
