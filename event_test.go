package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/memstore"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
	"github.com/go-idempotency/idempotency/sqlite"
)

// events records what an Observer is told, safe for concurrent calls.
type events struct {
	mu  sync.Mutex
	evs []observe.Event
}

func (e *events) observe(_ context.Context, ev observe.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) all() []observe.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.evs)
}

// sqliteStore opens a fresh SQLite file with an effects table.
func sqliteStore(t *testing.T, ctx context.Context, cfg *sqlite.Config) (*sqlite.Store, *sql.DB, testkit.Effects) {
	t.Helper()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := sqlite.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fx := testkit.Effects{DB: db, Table: "effects"}
	if err := fx.Create(ctx, "TEXT NOT NULL"); err != nil {
		t.Fatal(err)
	}
	return s, db, fx
}

func mustGuard(t *testing.T, s *sqlite.Store, cfg *idempotency.Config) *idempotency.Guard[*sql.Tx] {
	t.Helper()
	g, err := idempotency.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEventWaited: a caller that waited for the key's holder reports the
// wait, in memory (same Guard) and in the store (another Guard), with
// Outcome Replayed; one whose wait ran out reports it with InProgress;
// the holder and a caller of a free key report none.
func TestEventWaited(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	s, _, fx := sqliteStore(t, ctx, nil)
	var obs events
	g1 := mustGuard(t, s, &idempotency.Config{Observer: obs.observe})
	g2 := mustGuard(t, s, &idempotency.Config{Observer: obs.observe})
	g3 := mustGuard(t, s, &idempotency.Config{Observer: obs.observe, WaitTimeout: 80 * time.Millisecond})
	key := idempotency.Key{Scope: "t", ID: "wait"}
	release := testkit.NewGate(t)
	started := make(chan struct{})
	const hold = 300 * time.Millisecond
	var wg sync.WaitGroup
	results := make([]error, 4)
	wg.Go(func() {
		_, results[0] = g1.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			close(started)
			<-release.Opened()
			return idempotency.Response{Status: 201, Body: []byte("made")}, fx.Effect(ctx, tx, "wait")
		})
	})
	<-started
	// g1's second caller waits in memory, g2's in the store, g3's runs out.
	for i, g := range []*idempotency.Guard[*sql.Tx]{g1, g2, g3} {
		wg.Go(func() {
			_, results[i+1] = g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
				return idempotency.Response{}, errors.New("fn ran twice")
			})
		})
	}
	time.Sleep(hold)
	release.Open()
	wg.Wait()
	if n, err := fx.Count(ctx, "wait"); err != nil || n != 1 {
		t.Fatalf("%d effects (%v), want 1", n, err)
	}
	evs := obs.all()
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
	byOutcome := map[observe.Outcome][]observe.Event{}
	for _, ev := range evs {
		byOutcome[ev.Outcome] = append(byOutcome[ev.Outcome], ev)
		if ev.AfterFn || ev.Deleted != 0 {
			t.Errorf("event %+v: AfterFn or Deleted set", ev)
		}
	}
	if len(byOutcome[observe.Executed]) != 1 || len(byOutcome[observe.Replayed]) != 2 || len(byOutcome[observe.InProgress]) != 1 {
		t.Fatalf("outcomes %v, want 1 executed, 2 replayed, 1 in_progress", byOutcome)
	}
	if ex := byOutcome[observe.Executed][0]; ex.Waited != 0 || ex.RecordAge != 0 {
		t.Errorf("the holder reports Waited %v, RecordAge %v; want 0, 0", ex.Waited, ex.RecordAge)
	}
	for _, ev := range byOutcome[observe.Replayed] {
		// Each waited from its start (after started) until the holder
		// committed (after hold), less the scheduling of its goroutine.
		if ev.Waited < hold/2 || ev.Waited > ev.Duration {
			t.Errorf("replay after a wait reports Waited %v (Duration %v), want about %v", ev.Waited, ev.Duration, hold)
		}
	}
	ip := byOutcome[observe.InProgress][0]
	if !errors.Is(ip.Err, idempotency.ErrInProgress) || ip.Waited < 60*time.Millisecond || ip.Waited > ip.Duration {
		t.Errorf("refusal: Waited %v (Duration %v), err %v; want about 80ms and ErrInProgress", ip.Waited, ip.Duration, ip.Err)
	}
	// A replay of a completed key waits for nothing.
	if _, err := g2.Do(ctx, key, "fp", nil); !errors.Is(err, idempotency.ErrInvalidResponse) {
		t.Fatalf("nil fn: %v", err)
	}
	resp, ev, err := g2.DoEvent(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("fn ran twice")
	})
	if err != nil || !resp.Replayed || ev.Outcome != observe.Replayed || ev.Waited != 0 {
		t.Errorf("DoEvent: %+v, %+v, %v; want a replay that did not wait", resp, ev, err)
	}
	if got := obs.all(); len(got) != 6 || got[5].Outcome != ev.Outcome || got[5].Duration != ev.Duration {
		t.Errorf("DoEvent's event %+v is not the one the observer got: %+v", ev, got)
	}
}

// TestEventRecordAge: a replay from the store reports the age of the
// record by its CreatedAt (the store's clock at the reservation); a call
// that ran fn, or a replay handed over in memory, reports none.
func TestEventRecordAge(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	var offset atomic.Int64 // the store's clock is the application's minus offset
	offset.Store(int64(time.Hour))
	s, _, _ := sqliteStore(t, ctx, &sqlite.Config{Clock: func() time.Time { return time.Now().Add(-time.Duration(offset.Load())) }})
	var obs events
	g := mustGuard(t, s, &idempotency.Config{Observer: obs.observe})
	key := idempotency.Key{Scope: "t", ID: "age"}
	for range 2 {
		if _, err := g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	evs := obs.all()
	if len(evs) != 2 || evs[0].Outcome != observe.Executed || evs[1].Outcome != observe.Replayed {
		t.Fatalf("events %+v", evs)
	}
	if evs[0].RecordAge != 0 {
		t.Errorf("executed call reports RecordAge %v", evs[0].RecordAge)
	}
	if age := evs[1].RecordAge; age < time.Hour || age > time.Hour+10*time.Second {
		t.Errorf("replay reports RecordAge %v, want 1h (+ the test's time)", age)
	}
	// A store whose clock runs ahead gives no negative age.
	offset.Store(-int64(time.Hour))
	key.ID = "ahead"
	for range 2 {
		if _, err := g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) { return idempotency.Response{Status: 200}, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if evs := obs.all(); evs[3].Outcome != observe.Replayed || evs[3].RecordAge != 0 {
		t.Errorf("replay of a record from the future: %+v, want RecordAge 0", evs[3])
	}
}

// TestEventAfterFn: fn ran and answered, and storing the answer failed
// (here fn rolled the store's transaction back itself, so Complete
// fails): the call fails with ErrStore and AfterFn; nothing was applied
// and a retry runs fn once.
func TestEventAfterFn(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	s, _, fx := sqliteStore(t, ctx, nil)
	var obs events
	g := mustGuard(t, s, &idempotency.Config{Observer: obs.observe})
	key := idempotency.Key{Scope: "t", ID: "after"}
	_, err := g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		if err := fx.Effect(ctx, tx, "after"); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: 201}, tx.Rollback()
	})
	if !errors.Is(err, idempotency.ErrStore) {
		t.Fatalf("Complete after fn's rollback: %v, want ErrStore", err)
	}
	if _, err := g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: 201}, fx.Effect(ctx, tx, "after")
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := fx.Count(ctx, "after"); err != nil || n != 1 {
		t.Fatalf("%d effects (%v), want 1", n, err)
	}
	evs := obs.all()
	if len(evs) != 2 {
		t.Fatalf("events %+v", evs)
	}
	if ev := evs[0]; ev.Outcome != observe.StoreError || !ev.AfterFn || !errors.Is(ev.Err, idempotency.ErrStore) {
		t.Errorf("failed commit: %+v, want Failed with AfterFn", ev)
	}
	if ev := evs[1]; ev.Outcome != observe.Executed || ev.AfterFn {
		t.Errorf("retry: %+v, want Executed without AfterFn", ev)
	}
	// An error of fn's own is not a failure after fn.
	key.ID = "fn-error"
	if _, err := g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
		return idempotency.Response{}, errors.New("declined")
	}); err == nil {
		t.Fatal("fn's error was not returned")
	}
	if ev := obs.all()[2]; ev.Outcome != observe.HandlerError || ev.AfterFn {
		t.Errorf("fn's own error: %+v, want Failed without AfterFn", ev)
	}
}

// TestPurgeEvents: Purge tells the observer one event per batch, with
// how many records it deleted, and no key.
func TestPurgeEvents(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	s, db, _ := sqliteStore(t, ctx, &sqlite.Config{Clock: func() time.Time { return time.Unix(0, now.Load()) }})
	var obs events
	g := mustGuard(t, s, &idempotency.Config{Observer: obs.observe, TTL: time.Minute, PurgeBatch: 2, PurgePause: -1})
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if _, err := g.Do(ctx, idempotency.Key{Scope: "t", ID: id}, "fp", func(*sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 200}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	now.Add(int64(2 * time.Minute))
	n, err := g.Purge(ctx)
	if err != nil || n != 5 {
		t.Fatalf("Purge: %d, %v; want 5", n, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d records left (%v)", left, err)
	}
	var deleted []int
	for _, ev := range obs.all()[5:] {
		if ev.Outcome != observe.Purged || ev.Err != nil || ev.Key != (idempotency.Key{}) || ev.Duration <= 0 {
			t.Errorf("purge event %+v", ev)
		}
		deleted = append(deleted, ev.Deleted)
	}
	if !slices.Equal(deleted, []int{2, 2, 1}) {
		t.Errorf("batches deleted %v, want [2 2 1]", deleted)
	}
	if s := observe.Purged.String(); s != "purged" {
		t.Errorf("Purged.String() = %q", s)
	}
	// A failing batch is told too, with its error.
	db.Close()
	if _, err := g.Purge(ctx); err == nil {
		t.Fatal("Purge on a closed database succeeded")
	}
	last := obs.all()[len(obs.all())-1]
	if last.Outcome != observe.Purged || last.Err == nil || last.Deleted != 0 {
		t.Errorf("failed batch: %+v", last)
	}
}

// reverser is a test codec: it stores the body reversed and the header
// under a prefix, and refuses to open a record it did not seal.
type reverser struct {
	sealErr error
	opened  atomic.Int64
}

func (c *reverser) Seal(_ context.Context, key idempotency.Key, resp idempotency.Response) (idempotency.Response, error) {
	if c.sealErr != nil {
		return idempotency.Response{}, c.sealErr
	}
	body := slices.Clone(resp.Body)
	slices.Reverse(body)
	h := http.Header{}
	for k, v := range resp.Header {
		h["Sealed-"+k] = v
	}
	h["Sealed-For"] = []string{key.ID}
	return idempotency.Response{Status: resp.Status, Header: h, Body: body}, nil
}

var errNotMine = errors.New("reverser: record not sealed for this key")

func (c *reverser) Open(_ context.Context, key idempotency.Key, stored idempotency.Response) (idempotency.Response, error) {
	c.opened.Add(1)
	if stored.Header.Get("Sealed-For") != key.ID {
		return idempotency.Response{}, errNotMine
	}
	body := slices.Clone(stored.Body)
	slices.Reverse(body)
	h := http.Header{}
	for k, v := range stored.Header {
		if name, ok := bytes.CutPrefix([]byte(k), []byte("Sealed-")); ok && k != "Sealed-For" {
			h[string(name)] = v
		}
	}
	return idempotency.Response{Status: stored.Status, Header: h, Body: body}, nil
}

// SealData stores data reversed after the key's id.
func (c *reverser) SealData(_ context.Context, key idempotency.Key, data []byte) ([]byte, error) {
	if c.sealErr != nil {
		return nil, c.sealErr
	}
	out := slices.Clone(data)
	slices.Reverse(out)
	return append([]byte(key.ID+"|"), out...), nil
}

// OpenData is the inverse of SealData, for the key it sealed for.
func (c *reverser) OpenData(_ context.Context, key idempotency.Key, sealed []byte) ([]byte, error) {
	data, ok := bytes.CutPrefix(sealed, []byte(key.ID+"|"))
	if !ok {
		return nil, errNotMine
	}
	data = slices.Clone(data)
	slices.Reverse(data)
	return data, nil
}

// TestCodec: the Guard stores what the codec seals, replays what it
// opens, hands callers waiting in memory the plain answer, and fails
// closed (ErrCodec, fn not run again) on a record the codec cannot open.
func TestCodec(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	s, db, fx := sqliteStore(t, ctx, nil)
	codec := &reverser{}
	g := mustGuard(t, s, &idempotency.Config{Codec: codec})
	key := idempotency.Key{Scope: "t", ID: "sealed"}
	answer := idempotency.Response{Status: 201, Header: http.Header{"Location": {"/p/1"}}, Body: []byte("abc")}
	runs := 0
	fn := func(tx *sql.Tx) (idempotency.Response, error) {
		runs++
		return answer, fx.Effect(ctx, tx, "sealed")
	}
	first, err := g.Do(ctx, key, "fp", fn)
	if err != nil || first.Replayed || string(first.Body) != "abc" || first.Header.Get("Location") != "/p/1" {
		t.Fatalf("first: %+v, %v", first, err)
	}
	var body []byte
	if err := db.QueryRowContext(ctx, `SELECT body FROM idempotency_keys WHERE id = 'sealed'`).Scan(&body); err != nil || string(body) != "cba" {
		t.Fatalf("stored body %q (%v), want the sealed %q", body, err, "cba")
	}
	again, err := g.Do(ctx, key, "fp", fn)
	if err != nil || !again.Replayed || string(again.Body) != "abc" || again.Header.Get("Location") != "/p/1" || len(again.Header) != 1 || again.Status != 201 {
		t.Fatalf("replay: %+v, %v", again, err)
	}
	// A record moved to another key does not open: ErrCodec, fn not run.
	if _, err := db.ExecContext(ctx, `UPDATE idempotency_keys SET id = 'moved' WHERE id = 'sealed'`); err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(ctx, idempotency.Key{Scope: "t", ID: "moved"}, "fp", fn)
	if !errors.Is(err, idempotency.ErrCodec) || !errors.Is(err, errNotMine) || errors.Is(err, idempotency.ErrStore) {
		t.Fatalf("moved record: %v, want ErrCodec wrapping the codec's error", err)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1", runs)
	}
	// A seal that fails rolls fn's writes back and leaves the key free.
	sealFails := errors.New("no key to seal with")
	g2 := mustGuard(t, s, &idempotency.Config{Codec: &reverser{sealErr: sealFails}})
	key2 := idempotency.Key{Scope: "t", ID: "unsealable"}
	if _, err := g2.Do(ctx, key2, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
		return answer, fx.Effect(ctx, tx, "unsealable")
	}); !errors.Is(err, idempotency.ErrCodec) || !errors.Is(err, sealFails) {
		t.Fatalf("failing seal: %v", err)
	}
	if n, err := fx.Count(ctx, "unsealable"); err != nil || n != 0 {
		t.Fatalf("%d effects after a failing seal (%v), want 0", n, err)
	}
	if r, err := g.Do(ctx, key2, "fp", func(*sql.Tx) (idempotency.Response, error) { return answer, nil }); err != nil || r.Replayed {
		t.Fatalf("the key was not left free: %+v, %v", r, err)
	}
}

// TestCodecWaitersGetPlainAnswer: callers of a key waiting in memory are
// handed the answer as fn returned it, without a round through the codec.
func TestCodecWaitersGetPlainAnswer(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	s, _, _ := sqliteStore(t, ctx, nil)
	codec := &reverser{}
	g := mustGuard(t, s, &idempotency.Config{Codec: codec})
	key := idempotency.Key{Scope: "t", ID: "waiters"}
	const n = 8
	bodies := make([][]byte, n)
	errs := make([]error, n)
	var runs atomic.Int64
	testkit.Together(n, func(i int) {
		var r idempotency.Response
		r, errs[i] = g.Do(ctx, key, "fp", func(*sql.Tx) (idempotency.Response, error) {
			runs.Add(1)
			time.Sleep(50 * time.Millisecond)
			return idempotency.Response{Status: 200, Body: []byte("plain")}, nil
		})
		bodies[i] = r.Body
	})
	for i := range n {
		if errs[i] != nil || string(bodies[i]) != "plain" {
			t.Errorf("caller %d: %q, %v", i, bodies[i], errs[i])
		}
	}
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times", runs.Load())
	}
	if got := codec.opened.Load(); got != 0 {
		t.Errorf("the codec opened %d records for callers waiting in memory, want 0", got)
	}
}

// TestCodecRun: an Operation's answer is sealed by the codec when its
// Finish completes the key, and opened when Run replays it. (The stored
// record is read with the store's own Inspect, which shows it as stored,
// marked sealed; the Guard's Inspect opens it.)
func TestCodecRun(t *testing.T) {
	ctx := testkit.Context(t, 20*time.Second)
	s := memstore.New()
	g := newGuard(t, s, &idempotency.Config{Codec: &reverser{}})
	op := &idempotency.Operation[*memstore.Tx]{Name: "pay",
		Steps: []idempotency.Step[*memstore.Tx]{{Name: "write", Local: func(_ context.Context, tx *memstore.Tx, _ *idempotency.State) error {
			tx.Effect("run")
			return nil
		}}},
		Finish: func(context.Context, *memstore.Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte("paid")}, nil
		},
	}
	key := idempotency.Key{Scope: "t", ID: "op"}
	first, err := g.Run(ctx, key, "fp", nil, op)
	if err != nil || first.Replayed || string(first.Body) != "paid" {
		t.Fatalf("first run: %+v, %v", first, err)
	}
	info, err := s.Inspect(ctx, key, true)
	if err != nil || string(info.Body) != "diap" || info.Header.Get("Sealed-For") != "op" || info.Header[":sealed"] == nil {
		t.Fatalf("stored %+v (%v), want the sealed body %q, marked sealed", info, err, "diap")
	}
	if ginfo, err := g.Inspect(ctx, key, true); err != nil || string(ginfo.Body) != "paid" || !ginfo.Sealed || len(ginfo.Header) != 0 {
		t.Fatalf("Guard.Inspect: %+v (%v), want the opened answer", ginfo, err)
	}
	again, err := g.Run(ctx, key, "fp", nil, op)
	if err != nil || !again.Replayed || string(again.Body) != "paid" || s.Count("run") != 1 {
		t.Fatalf("replay: %+v, %v (%d effects)", again, err, s.Count("run"))
	}
}
