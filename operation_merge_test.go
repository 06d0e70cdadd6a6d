package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
	"github.com/go-idempotency/idempotency/sqlite"
)

// The tests of this file count the transactions of Guard.Run on SQLite: a
// Local step directly followed by Finish commits in one phase with it.

// txCounts are the phases' calls a countingStore saw.
type txCounts struct {
	Acquire, Save, Release, Complete, Rollback int
}

// countingStore wraps a SQLite store and counts the Acquires and how its
// phases end. It may fail the next completeFail Completes with a conflict
// (the phase rolled back, as a commit-time serialization failure), and
// classifies errMergeConflict as a conflict, as the SQL stores classify
// their drivers' deadlocks.
type countingStore struct {
	*sqlite.Store
	acquire, save, release, complete, rollback atomic.Int64
	completeFail                               atomic.Int32
}

// errMergeConflict stands for a conflict met by a statement of Finish.
var errMergeConflict = errors.New("deadlock detected")

func (c *countingStore) IsConflict(err error) bool {
	return errors.Is(err, errMergeConflict) || c.Store.IsConflict(err)
}

func (c *countingStore) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*sql.Tx], *backend.Record, error) {
	c.acquire.Add(1)
	ph, rec, err := c.Store.Acquire(ctx, a)
	if ph == nil {
		return nil, rec, err
	}
	return &countingPhase{Phase: ph, c: c}, nil, nil
}

// counts returns the counts so far and sets them to zero.
func (c *countingStore) counts() txCounts {
	return txCounts{
		Acquire: int(c.acquire.Swap(0)), Save: int(c.save.Swap(0)), Release: int(c.release.Swap(0)),
		Complete: int(c.complete.Swap(0)), Rollback: int(c.rollback.Swap(0)),
	}
}

type countingPhase struct {
	backend.Phase[*sql.Tx]
	c *countingStore
}

func (p *countingPhase) Save(ctx context.Context, b []byte) error {
	p.c.save.Add(1)
	return p.Phase.Save(ctx, b)
}

func (p *countingPhase) Release(ctx context.Context, b []byte) error {
	p.c.release.Add(1)
	return p.Phase.Release(ctx, b)
}

func (p *countingPhase) Complete(ctx context.Context, r idempotency.Response) error {
	p.c.complete.Add(1)
	if p.c.completeFail.Add(-1) >= 0 {
		_ = p.Phase.Rollback(ctx)
		return fmt.Errorf("%w: injected commit conflict", backend.ErrConflict)
	}
	return p.Phase.Complete(ctx, r)
}

func (p *countingPhase) Rollback(ctx context.Context) error {
	p.c.rollback.Add(1)
	return p.Phase.Rollback(ctx)
}

// mergeRig is a Guard on a countingStore over a fresh SQLite file with an
// effects table.
type mergeRig struct {
	t   *testing.T
	ctx context.Context
	cs  *countingStore
	fx  testkit.Effects
	g   *idempotency.Guard[*sql.Tx]
	evs *events
}

func newMergeRig(t *testing.T) *mergeRig {
	t.Helper()
	ctx := context.Background()
	s, _, fx := sqliteStore(t, ctx, nil)
	cs := &countingStore{Store: s}
	evs := &events{}
	g, err := idempotency.New[*sql.Tx](cs, &idempotency.Config{Observer: evs.observe})
	if err != nil {
		t.Fatal(err)
	}
	return &mergeRig{t: t, ctx: ctx, cs: cs, fx: fx, g: g, evs: evs}
}

// effects fails the test unless tag has want committed effects.
func (m *mergeRig) effects(tag string, want int) {
	m.t.Helper()
	n, err := m.fx.Count(m.ctx, tag)
	if err != nil || n != want {
		m.t.Fatalf("%d effects %q (%v); want %d", n, tag, err, want)
	}
}

// phases fails the test unless the store saw want since the last call.
func (m *mergeRig) phases(what string, want txCounts) {
	m.t.Helper()
	if got := m.cs.counts(); got != want {
		m.t.Fatalf("%s: %+v; want %+v", what, got, want)
	}
}

// lastEvent is the observer's last event.
func (m *mergeRig) lastEvent() observe.Event {
	m.t.Helper()
	evs := m.evs.all()
	if len(evs) == 0 {
		m.t.Fatal("no event")
	}
	return evs[len(evs)-1]
}

// local is a Local step that writes one effect tagged tag and counts its
// runs in runs.
func (m *mergeRig) local(name, tag string, runs *atomic.Int64) idempotency.Step[*sql.Tx] {
	return idempotency.Step[*sql.Tx]{Name: name, Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
		runs.Add(1)
		s.Set(name, "done")
		return m.fx.Effect(ctx, tx, tag)
	}}
}

// finish is a Finish that writes an effect tagged tag and answers with
// the step data it sees, or fails with fail(n), n its run (from 1).
func (m *mergeRig) finish(tag string, runs *atomic.Int64, fail func(n int64) error) func(context.Context, *sql.Tx, *idempotency.State) (idempotency.Response, error) {
	return func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
		n := runs.Add(1)
		if err := m.fx.Effect(ctx, tx, tag); err != nil {
			return idempotency.Response{}, err
		}
		if fail != nil {
			if err := fail(n); err != nil {
				return idempotency.Response{}, err
			}
		}
		return idempotency.Response{Status: http.StatusCreated, Body: []byte("a=" + s.Get("a") + " b=" + s.Get("b") + " c=" + s.Get("c"))}, nil
	}
}

// checkAnswer fails the test unless resp is a fresh answer of status and
// body, byte for byte.
func checkAnswer(t *testing.T, what string, resp idempotency.Response, err error, status int, body string) {
	t.Helper()
	if err != nil || resp.Replayed || resp.Status != status || !bytes.Equal(resp.Body, []byte(body)) {
		t.Fatalf("%s: %d %q replayed %v, %v; want %d %q", what, resp.Status, resp.Body, resp.Replayed, err, status, body)
	}
}

// TestRunMergeCounts: a Local step directly followed by Finish commits in
// Finish's phase (one Acquire, one Complete, no Save); every Local step
// before it costs one phase more. A Foreign step between the last Local
// step and Finish keeps the phases as they were (the step's Save, Finish's
// own phase), and a Durable operation still commits its new key first.
func TestRunMergeCounts(t *testing.T) {
	foreign := func(name string) idempotency.Step[*sql.Tx] {
		return idempotency.Step[*sql.Tx]{Name: name, Foreign: func(_ context.Context, s *idempotency.State) error {
			s.Set(name, "called")
			return nil
		}}
	}
	cases := []struct {
		name    string
		steps   func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx]
		durable bool
		effects map[string]int
		want    txCounts
		body    string
	}{
		{"none", func(*mergeRig, *atomic.Int64) []idempotency.Step[*sql.Tx] { return nil }, false,
			map[string]int{"fin": 1}, txCounts{Acquire: 1, Complete: 1}, "a= b= c="},
		{"one local", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{m.local("a", "ea", runs)}
		}, false, map[string]int{"ea": 1, "fin": 1}, txCounts{Acquire: 1, Complete: 1}, "a=done b= c="},
		{"two locals", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{m.local("a", "ea", runs), m.local("b", "eb", runs)}
		}, false, map[string]int{"ea": 1, "eb": 1, "fin": 1}, txCounts{Acquire: 2, Save: 1, Complete: 1}, "a=done b=done c="},
		{"three locals", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{m.local("a", "ea", runs), m.local("b", "eb", runs), m.local("c", "ec", runs)}
		}, false, map[string]int{"ea": 1, "eb": 1, "ec": 1, "fin": 1}, txCounts{Acquire: 3, Save: 2, Complete: 1}, "a=done b=done c=done"},
		{"local then foreign", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{m.local("a", "ea", runs), foreign("b")}
		}, false, map[string]int{"ea": 1, "fin": 1}, txCounts{Acquire: 2, Save: 1, Complete: 1}, "a=done b=called c="},
		// The Foreign step's data commits with the last Local step's
		// writes and the answer: one phase for that step and Finish.
		{"local, foreign, local", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{m.local("a", "ea", runs), foreign("b"), m.local("c", "ec", runs)}
		}, false, map[string]int{"ea": 1, "ec": 1, "fin": 1}, txCounts{Acquire: 2, Save: 1, Complete: 1}, "a=done b=called c=done"},
		{"foreign only", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{foreign("a")}
		}, false, map[string]int{"fin": 1}, txCounts{Acquire: 2, Save: 1, Complete: 1}, "a=called b= c="},
		{"durable one local", func(m *mergeRig, runs *atomic.Int64) []idempotency.Step[*sql.Tx] {
			return []idempotency.Step[*sql.Tx]{m.local("a", "ea", runs)}
		}, true, map[string]int{"ea": 1, "fin": 1}, txCounts{Acquire: 2, Save: 1, Complete: 1}, "a=done b= c="},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMergeRig(t)
			var localRuns, finRuns atomic.Int64
			op := &idempotency.Operation[*sql.Tx]{Name: "merge", Steps: c.steps(m, &localRuns), Durable: c.durable,
				Finish: m.finish("fin", &finRuns, nil)}
			key := idempotency.Key{ID: "k"}
			resp, err := m.g.Run(m.ctx, key, "fp", []byte("in"), op)
			checkAnswer(t, "run", resp, err, http.StatusCreated, c.body)
			m.phases("run", c.want)
			for tag, n := range c.effects {
				m.effects(tag, n)
			}
			if int(localRuns.Load()) != c.effects["ea"]+c.effects["eb"]+c.effects["ec"] || finRuns.Load() != 1 {
				t.Fatalf("local steps ran %d times, Finish %d; want each once", localRuns.Load(), finRuns.Load())
			}
			if ev := m.lastEvent(); ev.Step != "" || ev.Outcome != observe.Executed || ev.Err != nil {
				t.Fatalf("event %+v; want executed at Finish (step \"\")", ev)
			}
			again, err := m.g.Run(m.ctx, key, "fp", nil, op)
			if err != nil || !again.Replayed || again.Status != http.StatusCreated || !bytes.Equal(again.Body, resp.Body) {
				t.Fatalf("replay: %d %q replayed %v, %v", again.Status, again.Body, again.Replayed, err)
			}
			m.phases("replay", txCounts{Acquire: 1})
			for tag, n := range c.effects {
				m.effects(tag, n)
			}
		})
	}
}

// TestRunMergeFinishFails: Finish fails with an error after one Local
// step. The merged phase rolls back and the run goes on as before the
// merge: the step commits its recovery point in a phase of its own (its
// effect once: the first writes were rolled back), Finish fails in its own
// phase, and the key is unfinished at Finish with ErrUnfinished naming
// Finish. A retry runs Finish only.
func TestRunMergeFinishFails(t *testing.T) {
	m := newMergeRig(t)
	down := errors.New("mail server down")
	var localRuns, finRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{m.local("a", "ea", &localRuns)},
		Finish: m.finish("fin", &finRuns, func(n int64) error {
			if n <= 2 {
				return down
			}
			return nil
		})}
	key := idempotency.Key{ID: "k"}
	_, err := m.g.Run(m.ctx, key, "fp", []byte("in"), op)
	if !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(err, down) || !strings.Contains(err.Error(), "step Finish") {
		t.Fatalf("run: %v; want ErrUnfinished at step Finish wrapping Finish's error", err)
	}
	// The merged phase (rolled back), the step's phase (saved), Finish's
	// (rolled back), the release.
	m.phases("failing run", txCounts{Acquire: 4, Save: 1, Rollback: 2, Release: 1})
	m.effects("ea", 1)
	m.effects("fin", 0)
	if localRuns.Load() != 2 || finRuns.Load() != 2 {
		t.Fatalf("the step ran %d times, Finish %d; want 2 and 2", localRuns.Load(), finRuns.Load())
	}
	if ev := m.lastEvent(); ev.Step != "" || ev.Outcome != observe.Unfinished {
		t.Fatalf("event %+v; want unfinished at Finish", ev)
	}
	info, err := m.g.Inspect(m.ctx, key, false)
	if err != nil || info.State != idempotency.KeyUnfinished || info.Step != "Finish" || info.Tries != 1 || !strings.Contains(info.Failure, down.Error()) {
		t.Fatalf("the key: %+v, %v; want unfinished at Finish, 1 try, Finish's failure", info, err)
	}

	resp, err := m.g.Run(m.ctx, key, "fp", nil, op)
	checkAnswer(t, "retry", resp, err, http.StatusCreated, "a=done b= c=")
	m.phases("retry", txCounts{Acquire: 1, Complete: 1})
	m.effects("ea", 1)
	m.effects("fin", 1)
	if localRuns.Load() != 2 || finRuns.Load() != 3 {
		t.Fatalf("the step ran %d times, Finish %d; want 2 and 3 (Finish only on the retry)", localRuns.Load(), finRuns.Load())
	}
}

// TestRunMergeFinishFailsOnce: Finish fails once in the merged phase, with
// an error or with a conflict of its statement: the merged phase rolls
// back, and the run commits step by step (the step's phase, then
// Finish's, which succeeds): it answers, each effect once.
func TestRunMergeFinishFailsOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"Error", errors.New("flaky")},
		{"Conflict", fmt.Errorf("insert: %w", errMergeConflict)},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMergeRig(t)
			var localRuns, finRuns atomic.Int64
			op := &idempotency.Operation[*sql.Tx]{Name: "merge",
				Steps: []idempotency.Step[*sql.Tx]{m.local("a", "ea", &localRuns)},
				Finish: m.finish("fin", &finRuns, func(n int64) error {
					if n == 1 {
						return c.err
					}
					return nil
				})}
			resp, err := m.g.Run(m.ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
			checkAnswer(t, "run", resp, err, http.StatusCreated, "a=done b= c=")
			m.phases("run", txCounts{Acquire: 3, Save: 1, Rollback: 1, Complete: 1})
			m.effects("ea", 1)
			m.effects("fin", 1)
			if localRuns.Load() != 2 || finRuns.Load() != 2 {
				t.Fatalf("the step ran %d times, Finish %d; want 2 and 2", localRuns.Load(), finRuns.Load())
			}
		})
	}
}

// TestRunMergeCommitConflict: the merged phase's commit fails with a
// conflict (nothing applied): the step runs again from the state it
// started from and commits once.
func TestRunMergeCommitConflict(t *testing.T) {
	m := newMergeRig(t)
	var localRuns, finRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{{Name: "a", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
			localRuns.Add(1)
			if s.Get("a") != "" {
				return fmt.Errorf("the step sees %q, set by a rolled-back run", s.Get("a"))
			}
			s.Set("a", "done")
			return m.fx.Effect(ctx, tx, "ea")
		}}},
		Finish: m.finish("fin", &finRuns, nil)}
	m.cs.completeFail.Store(1)
	resp, err := m.g.Run(m.ctx, idempotency.Key{ID: "k"}, "fp", nil, op)
	checkAnswer(t, "run", resp, err, http.StatusCreated, "a=done b= c=")
	// The failed Complete rolled its phase back itself.
	m.phases("run", txCounts{Acquire: 3, Save: 1, Complete: 2})
	m.effects("ea", 1)
	m.effects("fin", 1)
	if localRuns.Load() != 2 || finRuns.Load() != 2 {
		t.Fatalf("the step ran %d times, Finish %d; want 2 and 2", localRuns.Load(), finRuns.Load())
	}
}

// TestRunMergeFinalAnswer: a FinalAnswer of Finish completes the key in
// the merged phase, with the step's writes and Finish's.
func TestRunMergeFinalAnswer(t *testing.T) {
	m := newMergeRig(t)
	var localRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{m.local("a", "ea", &localRuns)},
		Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
			if err := m.fx.Effect(ctx, tx, "fin"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{}, idempotency.FinalAnswer(idempotency.Response{Status: http.StatusPaymentRequired, Body: []byte("declined " + s.Get("a"))})
		}}
	key := idempotency.Key{ID: "k"}
	resp, err := m.g.Run(m.ctx, key, "fp", nil, op)
	checkAnswer(t, "run", resp, err, http.StatusPaymentRequired, "declined done")
	m.phases("run", txCounts{Acquire: 1, Complete: 1})
	m.effects("ea", 1)
	m.effects("fin", 1)
	again, err := m.g.Run(m.ctx, key, "fp", nil, op)
	if err != nil || !again.Replayed || again.Status != http.StatusPaymentRequired || string(again.Body) != "declined done" {
		t.Fatalf("replay: %d %q, %v", again.Status, again.Body, err)
	}
}

// TestRunMergeResume: a key unfinished at a Local step whose next is
// Finish resumes in one phase, by a client's retry as by the Completer.
func TestRunMergeResume(t *testing.T) {
	m := newMergeRig(t)
	fail := true
	var localRuns, finRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{m.local("a", "ea", &localRuns), {Name: "b", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
			if err := m.fx.Effect(ctx, tx, "eb"); err != nil {
				return err
			}
			if fail {
				return errors.New("not yet")
			}
			s.Set("b", "done")
			return nil
		}}},
		Finish: m.finish("fin", &finRuns, nil)}
	keys := []idempotency.Key{{ID: "client"}, {ID: "completer"}}
	for _, key := range keys {
		if _, err := m.g.Run(m.ctx, key, "fp", nil, op); !errors.Is(err, idempotency.ErrUnfinished) {
			t.Fatalf("first run: %v", err)
		}
	}
	m.cs.counts()
	m.effects("ea", 2)
	m.effects("eb", 0)
	fail = false
	resp, err := m.g.Run(m.ctx, keys[0], "fp", nil, op)
	checkAnswer(t, "client's retry", resp, err, http.StatusCreated, "a=done b=done c=")
	m.phases("client's retry", txCounts{Acquire: 1, Complete: 1})
	time.Sleep(20 * time.Millisecond) // the Completer's Grace, after the release
	c, err := idempotency.NewCompleter(m.g, &idempotency.CompleterConfig{Grace: time.Millisecond}, op)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.Once(m.ctx)
	if err != nil || rep.Finished != 1 {
		t.Fatalf("completer: %+v, %v; want 1 finished", rep, err)
	}
	if got := m.cs.counts(); got.Acquire != 1 || got.Complete != 1 || got.Save != 0 {
		t.Fatalf("completer: %+v; want one Acquire and one Complete", got)
	}
	m.effects("ea", 2)
	m.effects("eb", 2)
	m.effects("fin", 2)
}

// TestRunMergeDataTooLarge: step data too large for a recovery point
// fails the step even with Finish next and nothing saved: nothing commits.
func TestRunMergeDataTooLarge(t *testing.T) {
	m := newMergeRig(t)
	var finRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{{Name: "a", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
			s.Set("a", strings.Repeat("x", backend.MaxProgressLen))
			return m.fx.Effect(ctx, tx, "ea")
		}}},
		Finish: m.finish("fin", &finRuns, nil)}
	key := idempotency.Key{ID: "k"}
	_, err := m.g.Run(m.ctx, key, "fp", nil, op)
	if !errors.Is(err, idempotency.ErrTooLarge) || !errors.Is(err, idempotency.ErrUnfinished) || finRuns.Load() != 0 {
		t.Fatalf("run: %v, Finish ran %d times; want ErrUnfinished wrapping ErrTooLarge, no Finish", err, finRuns.Load())
	}
	m.effects("ea", 0)
	if _, err := m.g.Inspect(m.ctx, key, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the key: %v; want free (nothing committed)", err)
	}
}

// TestRunMergeBadStatus: an answer with a status out of range from Finish
// ends as before the merge: the step committed once, the key unfinished at
// Finish.
func TestRunMergeBadStatus(t *testing.T) {
	m := newMergeRig(t)
	var localRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{m.local("a", "ea", &localRuns)},
		Finish: func(context.Context, *sql.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 42}, nil
		}}
	key := idempotency.Key{ID: "k"}
	_, err := m.g.Run(m.ctx, key, "fp", nil, op)
	if !errors.Is(err, idempotency.ErrInvalidResponse) || !errors.Is(err, idempotency.ErrUnfinished) {
		t.Fatalf("run: %v; want ErrUnfinished wrapping ErrInvalidResponse", err)
	}
	m.effects("ea", 1)
	if info, err := m.g.Inspect(m.ctx, key, false); err != nil || info.State != idempotency.KeyUnfinished || info.Step != "Finish" {
		t.Fatalf("the key: %+v, %v; want unfinished at Finish", info, err)
	}
}

// TestRunMergeCancelledInFinish: a Finish whose ctx ends fails the merged
// phase, and the run cannot go on split: it stops at the step, where the
// key stands (a new key: free), with ErrUnfinished.
func TestRunMergeCancelledInFinish(t *testing.T) {
	m := newMergeRig(t)
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	var localRuns atomic.Int64
	op := &idempotency.Operation[*sql.Tx]{Name: "merge",
		Steps: []idempotency.Step[*sql.Tx]{m.local("a", "ea", &localRuns)},
		Finish: func(ctx context.Context, _ *sql.Tx, _ *idempotency.State) (idempotency.Response, error) {
			cancel()
			return idempotency.Response{}, ctx.Err()
		}}
	key := idempotency.Key{ID: "k"}
	_, err := m.g.Run(ctx, key, "fp", nil, op)
	if !errors.Is(err, idempotency.ErrUnfinished) || !errors.Is(err, context.Canceled) || localRuns.Load() != 1 {
		t.Fatalf("run: %v, step runs %d; want ErrUnfinished wrapping context.Canceled, 1 step run", err, localRuns.Load())
	}
	if ev := m.lastEvent(); ev.Step != "a" || ev.Outcome != observe.Unfinished {
		t.Fatalf("event %+v; want unfinished at step a", ev)
	}
	m.effects("ea", 0)
	if _, err := m.g.Inspect(m.ctx, key, false); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the key: %v; want free (nothing committed)", err)
	}
}
