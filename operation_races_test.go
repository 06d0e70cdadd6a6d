package idempotency_test

import (
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
	"github.com/go-idempotency/idempotency/internal/memstore"
)

// conflictStore wraps memstore: the next saveFail Saves (and completeFail
// Completes) of a phase roll back and report ErrConflict, as a commit-time
// serialization or certification failure does.
type conflictStore struct {
	*memstore.Store
	saveFail, completeFail atomic.Int32
}

func (c *conflictStore) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*memstore.Tx], *backend.Record, error) {
	ph, rec, err := c.Store.Acquire(ctx, a)
	if ph == nil {
		return nil, rec, err
	}
	return &conflictPhase{Phase: ph, c: c}, nil, nil
}

type conflictPhase struct {
	backend.Phase[*memstore.Tx]
	c *conflictStore
}

func (p *conflictPhase) Save(ctx context.Context, b []byte) error {
	if p.c.saveFail.Add(-1) >= 0 {
		_ = p.Phase.Rollback(ctx)
		return fmt.Errorf("%w: injected commit conflict", backend.ErrConflict)
	}
	return p.Phase.Save(ctx, b)
}

func (p *conflictPhase) Complete(ctx context.Context, r idempotency.Response) error {
	if p.c.completeFail.Add(-1) >= 0 {
		_ = p.Phase.Rollback(ctx)
		return fmt.Errorf("%w: injected commit conflict", backend.ErrConflict)
	}
	return p.Phase.Complete(ctx, r)
}

// TestRunConflictForgetsStepData: a Local step whose commit fails with a
// conflict runs again from the state it started from: what it set in State
// was rolled back with its writes, so the retry writes the order again and
// the answer names a committed order.
func TestRunConflictForgetsStepData(t *testing.T) {
	ctx := context.Background()
	cs := &conflictStore{Store: memstore.New()}
	g, err := idempotency.New[*memstore.Tx](cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "pay",
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "first", Local: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
				tx.Effect("first")
				return nil
			}},
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
				if s.Get("order") == "" { // create the order once
					tx.Effect("order")
					s.Set("order", "o-1")
				}
				cs.saveFail.Store(0)
				return nil
			}},
		},
		Finish: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte(s.Get("order"))}, nil
		},
	}
	// The first Save (step "first") succeeds, the second (step "order") conflicts once.
	cs.saveFail.Store(-1)
	op.Steps[0].Local = func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
		tx.Effect("first")
		return nil
	}
	calls := 0
	op.Steps[1].Local = func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
		calls++
		if calls == 1 {
			cs.completeFail.Store(1)
		}
		if s.Get("order") == "" {
			tx.Effect("order")
			s.Set("order", "o-1")
		}
		return nil
	}
	resp, err := g.Run(ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
	if err != nil || resp.Status != 201 || string(resp.Body) != "o-1" || calls != 2 || cs.Count("order") != 1 {
		t.Fatalf("run: %d %q, %v; order step ran %d times, orders committed %d; want 201 o-1, 2 runs, 1 order",
			resp.Status, resp.Body, err, calls, cs.Count("order"))
	}
}

// TestRunForeignOnlyUnderLease: a resumed run whose Save that takes the
// lease before a Foreign step conflicts takes it again before the call: no
// other owner can acquire the key while the call runs.
func TestRunForeignOnlyUnderLease(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	cs := &conflictStore{Store: ms}
	g, err := idempotency.New[*memstore.Tx](cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	var calls atomic.Int32
	var otherGotIt atomic.Bool
	key := idempotency.Key{ID: "k"}
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "pay",
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
				tx.Effect("order")
				return nil
			}},
			{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
				calls.Add(1)
				if fail {
					return errors.New("processor down")
				}
				// Can another run (a Completer, a client) take the key now?
				ph, _, err := ms.Acquire(ctx, backend.Acquisition{Reservation: backend.Reservation{Key: key, Fingerprint: "fp", TTL: time.Hour},
					Owner: "intruder", Lease: time.Minute})
				if err == nil {
					otherGotIt.Store(true)
					_ = ph.Rollback(ctx)
				}
				return nil
			}},
		},
		Finish: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		},
	}
	if _, err := g.Run(ctx, key, "fp", nil, op); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("first run: %v", err)
	}
	fail = false
	cs.saveFail.Store(1) // the resume's lease Save conflicts once
	if _, err := g.Run(ctx, key, "fp", nil, op); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if otherGotIt.Load() || calls.Load() != 2 {
		t.Fatalf("another owner acquired the key during the call: %v (calls %d, want 2)", otherGotIt.Load(), calls.Load())
	}
}

// TestCompleterPassesSkippedKeys: abandoned keys the Completer cannot
// resume (another operation's), older than its own and as many as its
// Batch, do not keep it from the keys it can finish.
func TestCompleterPassesSkippedKeys(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	g := newGuard(t, s, nil)
	mk := func(name string, fail *bool) *idempotency.Operation[*memstore.Tx] {
		return &idempotency.Operation[*memstore.Tx]{
			Name: name,
			Steps: []idempotency.Step[*memstore.Tx]{
				{Name: "a", Local: func(context.Context, *memstore.Tx, *idempotency.State) error { return nil }},
				{Name: "b", Foreign: func(context.Context, *idempotency.State) error {
					if *fail {
						return errors.New("down")
					}
					return nil
				}},
			},
			Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
				return idempotency.Response{Status: 200}, nil
			},
		}
	}
	fail := true
	other, mine := mk("other", &fail), mk("mine", &fail)
	for i := range 2 {
		if _, err := g.Run(ctx, idempotency.Key{ID: fmt.Sprint("o", i)}, "fp", nil, other); !errors.Is(err, idempotency.ErrUnfinished) {
			t.Fatal(err)
		}
	}
	advance(time.Second)
	if _, err := g.Run(ctx, idempotency.Key{ID: "m"}, "fp", nil, mine); !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatal(err)
	}
	fail = false
	c, err := idempotency.NewCompleter(g, &idempotency.CompleterConfig{Grace: time.Minute, Batch: 2}, mine)
	if err != nil {
		t.Fatal(err)
	}
	finished := 0
	for range 5 {
		advance(time.Hour)
		rep, err := c.Once(ctx)
		if err != nil {
			t.Fatal(err)
		}
		finished += rep.Finished
		t.Logf("pass: %+v", rep)
	}
	if finished != 1 {
		t.Fatalf("the Completer finished %d of its keys in 5 passes; want 1", finished)
	}
}

// TestRunStopsWhenForgotten: an operator forgets an unfinished key whose
// lease ran out while its run was in a slow Foreign step: the run stops
// with ErrNotFound rather than start over from the first step (a second
// order).
func TestRunStopsWhenForgotten(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	g := newGuard(t, s, nil)
	key := idempotency.Key{ID: "k"}
	var forgetErr error
	op := &idempotency.Operation[*memstore.Tx]{
		Name:  "pay",
		Lease: time.Minute,
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error {
				tx.Effect("order")
				return nil
			}},
			{Name: "charge", Foreign: func(context.Context, *idempotency.State) error {
				if s.Count("order") == 1 {
					advance(2 * time.Minute) // slow call: the lease ran out
					_, forgetErr = s.Forget(ctx, key)
				}
				return nil
			}},
		},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		},
	}
	_, err := g.Run(ctx, key, "fp", nil, op)
	if forgetErr != nil || !errors.Is(err, idempotency.ErrNotFound) || errors.Is(err, idempotency.ErrUnfinished) || s.Count("order") != 1 {
		t.Fatalf("run: %v; forget: %v; orders %d; want ErrNotFound (not ErrUnfinished) after a Forget that worked, 1 order", err, forgetErr, s.Count("order"))
	}
}

// TestRunStopAfterTakeover: a Foreign step's Stop that comes after the
// run's lease ran out, when another run took the key over, passed that step
// and committed later steps meanwhile, does not complete the key with the
// Stop's answer: the run resumes from what the other run committed.
func TestRunStopAfterTakeover(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	gA, gB := newGuard(t, s, nil), newGuard(t, s, nil) // two processes
	key := idempotency.Key{ID: "k"}
	var op *idempotency.Operation[*memstore.Tx]
	inA := true
	var bErr error
	op = &idempotency.Operation[*memstore.Tx]{
		Name:  "pay",
		Lease: time.Minute,
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error { tx.Effect("order"); return nil }},
			{Name: "charge", Foreign: func(ctx context.Context, st *idempotency.State) error {
				if inA {
					inA = false
					advance(2 * time.Minute) // A's call is slow: its lease ran out
					_, bErr = gB.Run(ctx, key, "fp", nil, op)
					return idempotency.FinalAnswer(idempotency.Response{Status: 402, Body: []byte("declined")})
				}
				st.Set("charge", "ch_1")
				return nil
			}},
			{Name: "receipt", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error { tx.Effect("receipt"); return nil }},
			{Name: "email", Foreign: func(context.Context, *idempotency.State) error { return errors.New("smtp down") }},
		},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		},
	}
	resp, err := gA.Run(ctx, key, "fp", nil, op)
	if resp.Status != 0 || !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(bErr, idempotency.ErrUnfinished) || s.Count("receipt") != 1 {
		t.Fatalf("A: %d %q, %v; B: %v; receipts %d; want both unfinished at the e-mail, 1 receipt", resp.Status, resp.Body, err, bErr, s.Count("receipt"))
	}
	if info, err := gA.Inspect(ctx, key, false); err != nil || info.State != idempotency.KeyUnfinished || info.Step != "email" {
		t.Fatalf("the key: %+v, %v; want unfinished at the e-mail, not completed with the Stop", info, err)
	}
}

// TestRunCancelledReleasesLease: a Run whose ctx ends between two phases
// ends its lease and says ErrUnfinished: a retry right after resumes at
// once instead of waiting for the lease (defaultLease) to run out.
func TestRunCancelledReleasesLease(t *testing.T) {
	s := memstore.New()
	g := newGuard(t, s, &idempotency.Config{WaitTimeout: 200 * time.Millisecond})
	key := idempotency.Key{ID: "k"}
	ctx, cancel := context.WithCancel(context.Background())
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "pay",
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "a", Local: func(context.Context, *memstore.Tx, *idempotency.State) error { cancel(); return nil }},
			{Name: "b", Local: func(context.Context, *memstore.Tx, *idempotency.State) error { return nil }},
		},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		},
	}
	_, err := g.Run(ctx, key, "fp", nil, op)
	if !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v; want ErrUnfinished and context.Canceled", err)
	}
	op.Steps[0].Local = func(context.Context, *memstore.Tx, *idempotency.State) error { return nil }
	_, err = g.Run(context.Background(), key, "fp", nil, op)
	if err != nil {
		t.Fatalf("the client's retry right after: %v", err)
	}
}

// testClock sets s's clock to a fixed instant and returns the function
// that moves it forward.
func testClock(s *memstore.Store) func(time.Duration) {
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s.Clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	return func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

// TestRunReleaseLeavesOtherRequestsKey: A's key is forgotten during A's
// slow Foreign call; client B reuses the key with another request (fp2) and
// its Durable run fails at the first step (key unfinished, lease ended,
// tries 1). A's next phase finds fp2: A stops with ErrMismatch, not
// ErrUnfinished, and leaves B's key as B left it (no try, no failure text
// of A's).
func TestRunReleaseLeavesOtherRequestsKey(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	gA, gB := newGuard(t, s, nil), newGuard(t, s, nil)
	key := idempotency.Key{ID: "k"}
	fin := func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, nil
	}
	opB := &idempotency.Operation[*memstore.Tx]{Name: "pay", Durable: true, Lease: time.Minute,
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(context.Context, *memstore.Tx, *idempotency.State) error { return errors.New("db down") }},
			{Name: "charge", Foreign: func(context.Context, *idempotency.State) error { return nil }},
		}, Finish: fin}
	var bErr, fErr error
	opA := &idempotency.Operation[*memstore.Tx]{Name: "pay", Lease: time.Minute,
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error { tx.Effect("order"); return nil }},
			{Name: "charge", Foreign: func(ctx context.Context, _ *idempotency.State) error {
				advance(2 * time.Minute)
				_, fErr = gB.Forget(ctx, key)
				_, bErr = gB.Run(ctx, key, "fp2", nil, opB)
				return nil
			}},
		}, Finish: fin}
	_, err := gA.Run(ctx, key, "fp1", nil, opA)
	info, ierr := gB.Inspect(ctx, key, false)
	if fErr != nil || !errors.Is(bErr, idempotency.ErrUnfinished) || ierr != nil {
		t.Fatalf("forget: %v; B: %v; inspect: %v", fErr, bErr, ierr)
	}
	if !errors.Is(err, idempotency.ErrMismatch) || errors.Is(err, idempotency.ErrUnfinished) || info.Tries != 1 || !strings.Contains(info.Failure, "db down") {
		t.Fatalf("A: %v; B's key: tries %d, failure %q; want A ErrMismatch (not unfinished), B's key untouched (1 try, B's failure)", err, info.Tries, info.Failure)
	}
}

// TestRunForeignFailsAfterForget: a Foreign step that fails after its key
// was forgotten gives ErrNotFound, not ErrUnfinished: nothing is stored to
// resume (an Async status resource would answer 404 after a 202).
func TestRunForeignFailsAfterForget(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	g, admin := newGuard(t, s, nil), newGuard(t, s, nil)
	key := idempotency.Key{ID: "k"}
	op := &idempotency.Operation[*memstore.Tx]{Name: "pay", Lease: time.Minute,
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error { tx.Effect("order"); return nil }},
			{Name: "charge", Foreign: func(ctx context.Context, _ *idempotency.State) error {
				advance(2 * time.Minute)
				if _, err := admin.Forget(ctx, key); err != nil {
					t.Errorf("forget: %v", err)
				}
				return errors.New("processor timeout")
			}},
		}, Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}}
	_, err := g.Run(ctx, key, "fp", nil, op)
	_, ierr := admin.Inspect(ctx, key, false)
	if !errors.Is(ierr, idempotency.ErrNotFound) || !errors.Is(err, idempotency.ErrNotFound) || errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("run: %v; inspect: %v; want ErrNotFound (not ErrUnfinished) for a key that is gone", err, ierr)
	}
}

// TestRunStopKeptAfterFailedTakeover: A's Foreign call outlives its
// lease; B takes over, its call of the same step fails and B releases the
// key at that step (only a failure note changes the progress). A's Stop
// still applies: the key completes with it after two calls, not three.
func TestRunStopKeptAfterFailedTakeover(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	advance := testClock(s)
	gA, gB := newGuard(t, s, nil), newGuard(t, s, nil)
	key := idempotency.Key{ID: "k"}
	var calls atomic.Int32
	var op *idempotency.Operation[*memstore.Tx]
	var bErr error
	op = &idempotency.Operation[*memstore.Tx]{Name: "pay", Lease: time.Minute,
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error { tx.Effect("order"); return nil }},
			{Name: "charge", Foreign: func(ctx context.Context, _ *idempotency.State) error {
				switch calls.Add(1) {
				case 1:
					advance(2 * time.Minute)
					_, bErr = gB.Run(ctx, key, "fp", nil, op)
					return idempotency.FinalAnswer(idempotency.Response{Status: 402})
				case 2:
					return errors.New("processor timeout")
				}
				return idempotency.FinalAnswer(idempotency.Response{Status: 402})
			}},
		}, Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, nil
		}}
	resp, err := gA.Run(ctx, key, "fp", nil, op)
	if resp.Status != 402 || err != nil || !errors.Is(bErr, idempotency.ErrUnfinished) || calls.Load() != 2 {
		t.Fatalf("A: %d %v; B: %v; calls %d; want A 402 after 2 calls, B unfinished", resp.Status, err, bErr, calls.Load())
	}
}

// errStepDeadlock stands for a conflict met by a step's own statement (a
// deadlock, a serialization failure, a Galera certification abort).
var errStepDeadlock = errors.New("deadlock found when trying to get lock")

// TestRunStepConflictRetried: a Local step, then Finish, whose statement
// meets a conflict the store classifies runs again in a new phase, from
// the state it started from, as Do retries fn: the caller gets the answer,
// not ErrUnfinished, and each write commits once.
func TestRunStepConflictRetried(t *testing.T) {
	ctx := context.Background()
	cs := memstore.New()
	cs.Conflict = func(err error) bool { return errors.Is(err, errStepDeadlock) } // as the SQL stores know their drivers' errors
	g, err := idempotency.New[*memstore.Tx](cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	var orderRuns, finishRuns int
	op := &idempotency.Operation[*memstore.Tx]{
		Name: "pay",
		Steps: []idempotency.Step[*memstore.Tx]{
			{Name: "order", Local: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) error {
				orderRuns++
				if s.Get("order") == "" {
					tx.Effect("order")
					s.Set("order", "o-1")
				}
				if orderRuns == 1 {
					return fmt.Errorf("insert: %w", errStepDeadlock)
				}
				return nil
			}},
		},
		Finish: func(_ context.Context, tx *memstore.Tx, s *idempotency.State) (idempotency.Response, error) {
			finishRuns++
			tx.Effect("receipt")
			if finishRuns == 1 {
				return idempotency.Response{}, errStepDeadlock
			}
			return idempotency.Response{Status: 201, Body: []byte(s.Get("order"))}, nil
		},
	}
	resp, err := g.Run(ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
	if err != nil || resp.Status != 201 || string(resp.Body) != "o-1" || orderRuns != 2 || finishRuns != 2 ||
		cs.Count("order") != 1 || cs.Count("receipt") != 1 {
		t.Fatalf("run: %d %q, %v; order ran %d, Finish %d; orders %d, receipts %d; want 201 o-1, 2 and 2 runs, 1 and 1 committed",
			resp.Status, resp.Body, err, orderRuns, finishRuns, cs.Count("order"), cs.Count("receipt"))
	}
}
