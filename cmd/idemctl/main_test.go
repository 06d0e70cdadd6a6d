package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// TestMain says, before the tests start, which server backends will not
// run here and the variable that enables each.
// With asMainEnv=1 the test binary is idemctl itself (see runProcess).
func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
	}
	testenv.Main(m, testenv.Postgres, testenv.MySQL, testenv.Redis)
}

// runCmd runs idemctl in-process and returns its exit status and output.
func runCmd(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// seedClock is the clock the seeding Guards' stores read: records are
// created at it, so their times are exact.
var seedClock = time.Date(2020, 1, 2, 3, 4, 5, 678e6, time.UTC)

// Seeding TTLs: a live record expires 100 years after seedClock, an
// expired one an hour after it (long past by every store's own clock).
const (
	liveTTL    = 100 * 365 * 24 * time.Hour
	expiredTTL = time.Hour
)

// seeder writes the records a test inspects, through Guards on a store
// that reads seedClock.
type seeder interface {
	// complete stores a completed record for key (expired ones with
	// expired), and counts a run of fn.
	complete(ctx context.Context, key idempotency.Key, body string, expired bool) (ran bool, err error)
	// hold runs Do with key until release is called.
	hold(ctx context.Context, key idempotency.Key) (release func() error, err error)
	// unfinished leaves key unfinished: an operation whose Foreign step
	// fails.
	unfinished(ctx context.Context, key idempotency.Key) error
	// completeSealed stores a completed record for key sealed by codec.
	completeSealed(ctx context.Context, key idempotency.Key, body string, codec idempotency.Codec) error
	runs() int64
	isAdmin() bool
	isLister() bool
	isStepper() bool
}

// guards implements seeder for a store with transaction type Tx.
type guards[Tx any] struct {
	store          idempotency.KeyStore[Tx]
	live, expiring *idempotency.Guard[Tx]
	n              atomic.Int64
}

func newGuards[Tx any](t *testing.T, store idempotency.KeyStore[Tx]) *guards[Tx] {
	t.Helper()
	live, err := idempotency.New(store, &idempotency.Config{TTL: liveTTL})
	if err != nil {
		t.Fatal(err)
	}
	expiring, err := idempotency.New(store, &idempotency.Config{TTL: expiredTTL})
	if err != nil {
		t.Fatal(err)
	}
	return &guards[Tx]{store: store, live: live, expiring: expiring}
}

func (g *guards[Tx]) complete(ctx context.Context, key idempotency.Key, body string, expired bool) (bool, error) {
	gd := g.live
	if expired {
		gd = g.expiring
	}
	resp, err := gd.Do(ctx, key, "fp-"+key.ID, func(Tx) (idempotency.Response, error) {
		g.n.Add(1)
		return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(body)}, nil
	})
	return err == nil && !resp.Replayed, err
}

func (g *guards[Tx]) completeSealed(ctx context.Context, key idempotency.Key, body string, codec idempotency.Codec) error {
	gd, err := idempotency.New(g.store, &idempotency.Config{TTL: liveTTL, Codec: codec})
	if err != nil {
		return err
	}
	_, err = gd.Do(ctx, key, "fp-"+key.ID, func(Tx) (idempotency.Response, error) {
		return idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(body)}, nil
	})
	return err
}

func (g *guards[Tx]) hold(ctx context.Context, key idempotency.Key) (func() error, error) {
	inside, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := g.live.Do(ctx, key, "fp-"+key.ID, func(Tx) (idempotency.Response, error) {
			close(inside)
			<-release
			return idempotency.Response{Status: http.StatusOK}, nil
		})
		done <- err
	}()
	select {
	case <-inside:
	case err := <-done:
		return nil, err
	}
	return sync.OnceValue(func() error { close(release); return <-done }), nil
}

func (g *guards[Tx]) unfinished(ctx context.Context, key idempotency.Key) error {
	op := &idempotency.Operation[Tx]{Name: "payment", Lease: time.Millisecond,
		Steps: []idempotency.Step[Tx]{{Name: "charge", Foreign: func(context.Context, *idempotency.State) error {
			return errors.New("card processor down")
		}}},
		Finish: func(context.Context, Tx, *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: http.StatusOK}, nil
		}}
	_, err := g.live.Run(ctx, key, "fp-"+key.ID, []byte("input"), op)
	if !errors.Is(err, idempotency.ErrUnfinished) {
		return err
	}
	return nil
}

func (g *guards[Tx]) runs() int64 { return g.n.Load() }

func (g *guards[Tx]) isAdmin() bool {
	_, ok := g.store.(backend.KeyAdmin)
	return ok
}

func (g *guards[Tx]) isLister() bool {
	_, ok := g.store.(backend.KeyLister)
	return ok
}

func (g *guards[Tx]) isStepper() bool {
	_, ok := g.store.(backend.Stepper[Tx])
	return ok
}

// storeCase is one store under test: the flags that point idemctl at its
// records, and a seeder writing them.
type storeCase struct {
	name string
	args []string
	seed seeder
	// held: what inspect reports for a key an open Do holds ("in_progress", or
	// "notfound" for a store that cannot see an uncommitted row from
	// another connection); several values when the store's docs allow both.
	held []string
	// listsHeld: list shows a key an open Do holds (a row not committed
	// yet); the SQL stores list committed rows only.
	listsHeld bool
}

// outJSON decodes an idemctl -json output into v.
func outJSON(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
}

// at returns a pointer to t, for the expected JSON.
func at(t time.Time) *time.Time { return &t }

// forEachStore runs f for every store of the module.
func forEachStore(t *testing.T, f func(t *testing.T, ctx context.Context, sc storeCase)) {
	for _, name := range []string{"sqlite", "postgres", "postgres+sql", "mysql", "redis"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Context(t, 60*time.Second)
			sc := newStoreCase(t, ctx, name)
			if !sc.seed.isAdmin() {
				t.Fatalf("the %s store does not implement backend.KeyAdmin", name)
			}
			f(t, ctx, sc)
		})
	}
}

// TestStores checks inspect, forget, list, stats and purge -dry-run end
// to end on every store, with -json for exact output.
func TestStores(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, ctx context.Context, sc storeCase) {
		scope := testkit.Name("scope-")
		key := func(id string) idempotency.Key { return idempotency.Key{Scope: scope, ID: id} }
		cmd := func(args ...string) (int, string, string) {
			return runCmd(t, ctx, append(append([]string{}, sc.args...), args...)...)
		}
		if ran, err := sc.seed.complete(ctx, key("a-done"), "hello\x00world", false); err != nil || !ran {
			t.Fatalf("seed a-done: %v, %v", ran, err)
		}
		if ran, err := sc.seed.complete(ctx, key("b-old"), "old", true); err != nil || !ran {
			t.Fatalf("seed b-old: %v, %v", ran, err)
		}
		release, err := sc.seed.hold(ctx, key("c-held"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = release() }()
		heldState := "notfound"
		switch code, out, errs := cmd("-json", "inspect", "-scope", scope, "c-held"); {
		case code == 0:
			var got keyInfoJSON
			outJSON(t, out, &got)
			heldState = got.State
		case code != 1 || !strings.Contains(errs, "no record"):
			t.Errorf("inspect of the held key: exit %d, %s", code, errs)
		}
		seedMs := seedClock.Truncate(time.Millisecond)
		done := keyInfoJSON{Scope: scope, ID: "a-done", KeyHash: key("a-done").Hash(), State: "completed", Fingerprint: "fp-a-done",
			Status: 201, Header: map[string][]string{"Content-Type": {"text/plain"}}, BodyLen: 11,
			Created: at(seedMs), Expires: at(seedMs.Add(liveTTL))}

		t.Run("Inspect", func(t *testing.T) {
			code, out, errs := cmd("-json", "inspect", "-scope", scope, "a-done")
			var got keyInfoJSON
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			outJSON(t, out, &got)
			if !reflect.DeepEqual(got, done) {
				t.Errorf("got  %+v\nwant %+v", got, done)
			}
			code, out, _ = cmd("-json", "inspect", "-body", "-scope", scope, "a-done")
			got = keyInfoJSON{}
			outJSON(t, out, &got)
			if code != 0 || string(got.Body) != "hello\x00world" {
				t.Errorf("-body: exit %d, body %q", code, got.Body)
			}
			code, out, _ = cmd("-json", "inspect", "-scope", scope, "b-old")
			got = keyInfoJSON{}
			outJSON(t, out, &got)
			if code != 0 || got.State != "expired" || !got.Expires.Equal(seedMs.Add(expiredTTL)) || got.Status != 201 {
				t.Errorf("expired: exit %d, %+v", code, got)
			}
			if !contains(sc.held, heldState) {
				t.Errorf("held key inspected as %q, want one of %q", heldState, sc.held)
			}
			code, out, errs = cmd("inspect", "-scope", scope, "never")
			if code != 1 || out != "" || !strings.Contains(errs, "idemctl: inspect: ") || !strings.Contains(errs, "no record for this key") ||
				strings.Contains(errs, "never") {
				t.Errorf("absent: exit %d, stdout %q, stderr %q", code, out, errs)
			}
		})

		t.Run("InspectText", func(t *testing.T) {
			code, out, errs := cmd("inspect", "-scope", scope, "a-done")
			want := "key:         " + key("a-done").String() + "\n" +
				"state:       completed\n" +
				"fingerprint: fp-a-done\n" +
				"status:      201\n" +
				"header:      Content-Type: text/plain\n" +
				"body size:   11 bytes\n" +
				"created:     2020-01-02T03:04:05.678Z\n" +
				"expires:     2119-12-09T03:04:05.678Z\n"
			if code != 0 || out != want {
				t.Errorf("exit %d (%s), got:\n%s\nwant:\n%s", code, errs, out, want)
			}
		})

		t.Run("List", func(t *testing.T) {
			if !sc.seed.isLister() {
				code, _, errs := cmd("list", "-scope", scope)
				if code != 2 || strings.Count(errs, "\n") != 1 {
					t.Errorf("list on a store without listing: exit %d, %q", code, errs)
				}
				return
			}
			code, out, errs := cmd("-json", "list", "-scope", scope, "-limit", "1")
			var page pageJSON
			outJSON(t, out, &page)
			if code != 0 || len(page.Keys) != 1 || page.Next == "" {
				t.Fatalf("first page: exit %d (%s): %+v", code, errs, page)
			}
			ids := []string{page.Keys[0].ID}
			for page.Next != "" {
				code, out, errs = cmd("-json", "list", "-scope", scope, "-limit", "1", "-after", page.Next)
				page = pageJSON{}
				outJSON(t, out, &page)
				if code != 0 {
					t.Fatalf("exit %d: %s", code, errs)
				}
				for _, k := range page.Keys {
					ids = append(ids, k.ID)
				}
			}
			want := []string{"a-done", "b-old"}
			if sc.listsHeld {
				want = []string{"c-held", "a-done", "b-old"}
			}
			if !reflect.DeepEqual(ids, want) {
				t.Errorf("listed %q, want %q", ids, want)
			}
		})

		t.Run("Stats", func(t *testing.T) {
			if !sc.seed.isLister() {
				code, _, errs := cmd("stats")
				if code != 2 || strings.Count(errs, "\n") != 1 {
					t.Errorf("stats on a store without listing: exit %d, %q", code, errs)
				}
				code, _, errs = cmd("purge", "-dry-run")
				if code != 2 || strings.Count(errs, "\n") != 1 {
					t.Errorf("purge -dry-run on a store without listing: exit %d, %q", code, errs)
				}
				return
			}
			code, out, errs := cmd("-json", "stats")
			var st statsOut
			outJSON(t, out, &st)
			if code != 0 || st.Completed != 1 || st.Expired != 1 || st.BodyBytes != 11 {
				t.Errorf("stats: exit %d (%s): %+v", code, errs, st)
			}
			code, out, errs = cmd("-json", "purge", "-dry-run")
			var p purgeJSON
			outJSON(t, out, &p)
			if code != 0 || !p.DryRun || p.Expired == nil || *p.Expired != 1 || p.Deleted != 0 {
				t.Errorf("purge -dry-run: exit %d (%s): %s", code, errs, out)
			}
			code, out, _ = cmd("purge", "-dry-run")
			if want := "expired: 1 (a purge would delete them; nothing was deleted)\n"; code != 0 || out != want {
				t.Errorf("purge -dry-run text: exit %d, got %q, want %q", code, out, want)
			}
			code, out, _ = cmd("-json", "inspect", "-scope", scope, "b-old")
			if code != 0 || !strings.Contains(out, `"state": "expired"`) {
				t.Errorf("purge -dry-run deleted the expired record: exit %d, %s", code, out)
			}
		})

		t.Run("Forget", func(t *testing.T) {
			code, out, errs := cmd("forget", "-scope", scope, "c-held")
			if code != 1 || out != "" {
				t.Errorf("forget of a held key: exit %d, stdout %q, stderr %q", code, out, errs)
			}
			// SQLite has one writer: the rest waits for the holder.
			if err := release(); err != nil {
				t.Errorf("the held Do: %v", err)
			}
			code, out, errs = cmd("-json", "forget", "-scope", scope, "a-done")
			var got forgetJSON
			outJSON(t, out, &got)
			if code != 0 || !reflect.DeepEqual(got, forgetJSON{Forgotten: done, Next: nextRuns}) {
				t.Errorf("forget: exit %d (%s): %+v", code, errs, got)
			}
			if code, _, _ := cmd("inspect", "-scope", scope, "a-done"); code != 1 {
				t.Errorf("inspect after forget: exit %d, want 1", code)
			}
			before := sc.seed.runs()
			if ran, err := sc.seed.complete(ctx, key("a-done"), "again", false); err != nil || !ran || sc.seed.runs() != before+1 {
				t.Errorf("the request after forget: ran %v, %v; runs %d -> %d", ran, err, before, sc.seed.runs())
			}
			code, out, _ = cmd("forget", "-scope", scope, "b-old")
			if code != 0 || !strings.HasSuffix(out, "forgotten: "+nextRuns+"\n") || !strings.Contains(out, "state:       expired\n") {
				t.Errorf("forget text: exit %d:\n%s", code, out)
			}
			if code, _, _ := cmd("forget", "-scope", scope, "b-old"); code != 1 {
				t.Errorf("forget twice: exit %d, want 1", code)
			}
		})

		t.Run("Purge", func(t *testing.T) {
			if !sc.seed.isLister() {
				return // refused: see Stats
			}
			if ran, err := sc.seed.complete(ctx, key("e-old"), "x", true); err != nil || !ran {
				t.Fatalf("seed e-old: %v, %v", ran, err)
			}
			code, out, errs := cmd("-json", "purge", "-batch", "1")
			if want := "{\n  \"dry_run\": false,\n  \"deleted\": 1\n}\n"; code != 0 || out != want {
				t.Errorf("purge: exit %d (%s), got %q, want %q", code, errs, out, want)
			}
			if code, _, _ := cmd("inspect", "-scope", scope, "e-old"); code != 1 {
				t.Errorf("inspect after purge: exit %d, want 1", code)
			}
			if code, out, _ := cmd("inspect", "-scope", scope, "a-done"); code != 0 || !strings.Contains(out, "state:       completed\n") {
				t.Errorf("purge touched a live record: exit %d:\n%s", code, out)
			}
			code, out, _ = cmd("purge")
			if code != 0 || out != "deleted: 0 expired records\n" {
				t.Errorf("purge text: exit %d, %q", code, out)
			}
		})
	})
}

// TestUnfinished: an operation left at a failed Foreign step is shown
// unfinished (step, tries, failure), listed first, counted, and forgotten.
func TestUnfinished(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, ctx context.Context, sc storeCase) {
		if !sc.seed.isStepper() {
			if sc.name != "redis" {
				t.Fatalf("the %s store runs no operations (no Stepper)", sc.name)
			}
			t.Skip("redis runs no operations: it cannot share a transaction with a step's writes (see package redis)")
		}
		scope := testkit.Name("op-")
		cmd := func(args ...string) (int, string, string) {
			return runCmd(t, ctx, append(append([]string{}, sc.args...), args...)...)
		}
		if _, err := sc.seed.complete(ctx, idempotency.Key{Scope: scope, ID: "a-done"}, "x", false); err != nil {
			t.Fatal(err)
		}
		if err := sc.seed.unfinished(ctx, idempotency.Key{Scope: scope, ID: "z-op"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // the 1ms lease ends
		code, out, errs := cmd("-json", "inspect", "-scope", scope, "z-op")
		var got keyInfoJSON
		outJSON(t, out, &got)
		if code != 0 || got.State != "unfinished" || got.Operation != "payment" || got.Step != "charge" || got.Tries != 1 ||
			!strings.Contains(got.Failure, "card processor down") || got.Expires == nil || got.Expires.Before(backend.MaxExpiry().Truncate(time.Millisecond)) {
			t.Errorf("inspect: exit %d (%s): %+v", code, errs, got)
		}
		code, out, _ = cmd("inspect", "-scope", scope, "z-op")
		for _, line := range []string{"state:       unfinished\n", "operation:   payment\n", "step:        charge\n", "tries:       1\n", "expires:     never\n"} {
			if code != 0 || !strings.Contains(out, line) {
				t.Errorf("inspect text lacks %q:\n%s", line, out)
			}
		}
		if sc.seed.isLister() {
			code, out, _ = cmd("-json", "list", "-scope", scope)
			var page pageJSON
			outJSON(t, out, &page)
			if code != 0 || len(page.Keys) != 2 || page.Keys[0].ID != "z-op" || page.Keys[1].ID != "a-done" {
				t.Errorf("list: exit %d: %+v", code, page)
			}
			code, out, _ = cmd("-json", "stats")
			var st statsOut
			outJSON(t, out, &st)
			if code != 0 || st.Unfinished < 1 || st.Failing < 1 || st.OldestUnfinished == nil {
				t.Errorf("stats: exit %d: %+v", code, st)
			}
		}
		if code, out, errs := cmd("forget", "-scope", scope, "z-op"); code != 0 || !strings.Contains(out, "state:       unfinished\n") {
			t.Errorf("forget: exit %d (%s):\n%s", code, errs, out)
		}
		if code, _, _ := cmd("inspect", "-scope", scope, "z-op"); code != 1 {
			t.Errorf("inspect after forget: exit %d, want 1", code)
		}
	})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestBadInput: bad usage and bad input exit with status 2, one message
// on stderr and nothing on stdout, before any connection; nothing is
// created.
func TestBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := testkit.Context(t, 30*time.Second)
	db := filepath.Join(dir, "none.db")
	rd := "redis://127.0.0.1:1" // nothing listens: any connection would fail with 3
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"-store", rd, "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"inspect", "x"}, "-store is required"},
		{[]string{"-store", "127.0.0.1:6379", "inspect", "-scope", "", "x"}, "a bare host:port names no store"},
		{[]string{"-store", rd, "inspect"}, "inspect takes one key ID, got 0 arguments"},
		{[]string{"-store", rd, "inspect", "a", "b"}, "inspect takes one key ID, got 2 arguments"},
		{[]string{"-store", rd, "inspect", "-scope", "", ""}, "id is empty"},
		{[]string{"-store", rd, "forget", "-scope", "", "a\tb"}, "not printable ASCII"},
		{[]string{"-store", rd, "forget", "-scope=", strings.Repeat("x", backend.MaxIDLen+1)}, "longer than"},
		{[]string{"-store", rd, "inspect", "-scope", "a\x00b", "x"}, "NUL"},
		{[]string{"-store", rd, "-table", "t", "inspect", "x"}, "-table is for the SQL stores"},
		{[]string{"-store", db, "-prefix", "p:", "inspect", "x"}, "-prefix is for Redis"},
		{[]string{"-store", db, "list", "-scope", "s", "-limit", "0"}, "-limit 0: want 1 to 1000"},
		{[]string{"-store", db, "list", "-scope", "s", "-limit", "1001"}, "-limit 1001"},
		{[]string{"-store", db, "list", "-scope", "s", "-after", "x"}, "want the cursor a page printed"},
		// -scope is required where a key is named; -scope '' is the empty scope.
		{[]string{"-store", rd, "inspect", "x"}, "inspect: -scope is required: a key lives in one scope (the account your service names with it); give -scope '' for the empty scope"},
		{[]string{"-store", rd, "forget", "x"}, "forget: -scope is required"},
		{[]string{"-store", db, "list"}, "list: -scope is required"},
		{[]string{"-store", db, "inspect", "-scope", "s", "-keyring", "k", "x"}, "-keyring opens a sealed body: give -body too"},
		{[]string{"-store", db, "purge", "-batch", "0"}, "-batch 0"},
		{[]string{"-store", db, "stats", "extra"}, "stats takes no arguments"},
		{[]string{"-store", db, "-timeout", "0s", "stats"}, "-timeout 0s"},
		{[]string{"-store", db, "stats"}, "no database file"},
		{[]string{"-store", rd, "list"}, "Redis cannot list keys"},
		{[]string{"-store", rd, "stats"}, "Redis keeps no counts"},
		{[]string{"-store", rd, "purge", "-dry-run"}, "Redis records expire by themselves"},
		{[]string{"-store", rd, "inspect", "-nosuchflag", "x"}, "flag provided but not defined"},
	} {
		code, out, errs := runCmd(t, ctx, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("files created: %v", left)
	}
	// A store that cannot be reached is a store error.
	if code, _, errs := runCmd(t, ctx, "-store", rd, "inspect", "-scope", "", "x"); code != 3 || !strings.Contains(errs, "redis: 127.0.0.1:1") {
		t.Errorf("unreachable Redis: exit %d, %q; want 3", code, errs)
	}
}

// TestCursor: a cursor printed by list parses back to itself.
func TestCursor(t *testing.T) {
	t.Parallel()
	for _, c := range []backend.ListCursor{{Unfinished: true, ID: "a:b"}, {ID: "u:x"}, {ID: " "}} {
		got, err := parseCursor("", formatCursor(&c))
		if err != nil || *got != c {
			t.Errorf("%+v -> %q -> %+v, %v", c, formatCursor(&c), got, err)
		}
	}
}

// TestBinary builds idemctl and runs it as operators do, on Redis: exit
// statuses and output come from the process itself.
func TestBinary(t *testing.T) {
	t.Parallel()
	ctx := testkit.Context(t, 3*time.Minute)
	sc := newStoreCase(t, ctx, "redis")
	bin := filepath.Join(t.TempDir(), "idemctl")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	key := idempotency.Key{Scope: testkit.Name("bin-"), ID: "k1"}
	if _, err := sc.seed.complete(ctx, key, "body", false); err != nil {
		t.Fatal(err)
	}
	exe := func(args ...string) (int, string, string) {
		return testkit.Run(t, exec.CommandContext(ctx, bin, append(append([]string{}, sc.args...), args...)...))
	}
	if code, out, errs := exe("inspect", "-body", "-scope", key.Scope, "k1"); code != 0 || !strings.HasSuffix(out, "body:\nbody\n") {
		t.Errorf("inspect: exit %d (%s):\n%s", code, errs, out)
	}
	if code, out, _ := exe("forget", "-scope", key.Scope, "k1"); code != 0 || !strings.Contains(out, nextRuns) {
		t.Errorf("forget: exit %d:\n%s", code, out)
	}
	if code, _, errs := exe("forget", "-scope", key.Scope, "k1"); code != 1 || !strings.Contains(errs, "no record") {
		t.Errorf("forget again: exit %d, %s", code, errs)
	}
	if code, _, errs := exe("list"); code != 2 || !strings.Contains(errs, "Redis cannot list keys") {
		t.Errorf("list: exit %d, %s", code, errs)
	}
}

// TestHumanOutput: the text of each command, byte for byte.
func TestHumanOutput(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 3, 1, 12, 0, 0, 250e6, time.UTC)
	unfinished := idempotency.KeyInfo{Key: idempotency.Key{Scope: "s", ID: "op-1"}, State: idempotency.KeyUnfinished, Fingerprint: "fp1",
		CreatedAt: created, ExpiresAt: backend.MaxExpiry(), Tries: 2, LeaseEnds: created.Add(time.Minute),
		Operation: "payment", Step: "charge", Failure: "charge: card processor down"}
	done := idempotency.KeyInfo{Key: idempotency.Key{Scope: "s", ID: "k-2"}, State: idempotency.KeyCompleted, Fingerprint: "fp2",
		Status: 201, Header: http.Header{"X-B": {"2"}, "X-A": {"1", "3"}}, BodyLen: 5, Body: []byte("hello"),
		CreatedAt: created, ExpiresAt: created.Add(24 * time.Hour)}
	for name, tc := range map[string]struct {
		print func(*bytes.Buffer)
		want  string
	}{
		"inspect unfinished": {func(b *bytes.Buffer) { printInfo(b, &unfinished, false) }, "" +
			"key:         " + unfinished.Key.String() + "\n" +
			"state:       unfinished\n" +
			"operation:   payment\n" +
			"step:        charge\n" +
			"tries:       2\n" +
			"failure:     charge: card processor down\n" +
			"fingerprint: fp1\n" +
			"created:     2026-03-01T12:00:00.250Z\n" +
			"expires:     never\n" +
			"lease ends:  2026-03-01T12:01:00.250Z\n"},
		"inspect -body": {func(b *bytes.Buffer) { printInfo(b, &done, true) }, "" +
			"key:         " + done.Key.String() + "\n" +
			"state:       completed\n" +
			"fingerprint: fp2\n" +
			"status:      201\n" +
			"header:      X-A: 1\n" +
			"header:      X-A: 3\n" +
			"header:      X-B: 2\n" +
			"body size:   5 bytes\n" +
			"created:     2026-03-01T12:00:00.250Z\n" +
			"expires:     2026-03-02T12:00:00.250Z\n" +
			"body:\nhello\n"},
		"list": {func(b *bytes.Buffer) {
			printList(b, idempotency.KeyPage{Keys: []idempotency.KeyInfo{unfinished, done}, Next: &backend.ListCursor{ID: "k-2"}})
		}, "" +
			"STATE       ID    STEP            TRIES  STATUS  BODY  CREATED                   EXPIRES\n" +
			"unfinished  op-1  payment/charge  2      -       0     2026-03-01T12:00:00.250Z  never\n" +
			"completed   k-2   -               -      201     5     2026-03-01T12:00:00.250Z  2026-03-02T12:00:00.250Z\n" +
			"next page: -after r:k-2\n"},
		"list last page": {func(b *bytes.Buffer) { printList(b, idempotency.KeyPage{}) }, "" +
			"STATE  ID  STEP  TRIES  STATUS  BODY  CREATED  EXPIRES\n" +
			"last page\n"},
		"stats": {func(b *bytes.Buffer) {
			printStats(b, idempotency.Stats{InProgress: 1, Completed: 20, Unfinished: 3, Expired: 4, OldestUnfinished: created, Failing: 2, BodyBytes: 1234})
		}, "" +
			"in_progress:       1\n" +
			"unfinished:        3\n" +
			"failing:           2\n" +
			"completed:         20\n" +
			"expired:           4\n" +
			"body bytes:        1234\n" +
			"oldest unfinished: 2026-03-01T12:00:00.250Z\n"},
	} {
		var b bytes.Buffer
		tc.print(&b)
		if b.String() != tc.want {
			t.Errorf("%s: got\n%s\nwant\n%s", name, b.String(), tc.want)
		}
	}
}
