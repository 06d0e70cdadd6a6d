package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sqlite"
)

// These tests run the test binary again as child processes on the same
// database file: SQLite's write lock is then held by another process, which
// this process's Store knows nothing about.

// childEnv names the environment variable that makes the test binary play
// a child: its value is the JSON of a childTask.
const childEnv = "IDEMPOTENCY_SQLITE_CHILD"

// childTask is what a child process does.
type childTask struct {
	Mode  string // "hold", "open" or "calls"
	Path  string // the database file
	Table string // the keys table; the effects table is Table+"_effects"
	Key   string // hold: the key held
	// Start (unix nanoseconds): open and calls begin at this instant, so that
	// the processes race.
	Start   int64
	Keys    int // calls: keys k0.. to call
	Callers int // calls: callers per key
	// Rounds (open): the child opens Path+"0", Path+"1", ..., round r at
	// Start plus r times Every, so that every round races on a fresh file.
	Rounds int
	Every  time.Duration
}

func runChild(task childTask) error {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if task.Mode == "open" {
		for r := range task.Rounds {
			time.Sleep(time.Until(time.Unix(0, task.Start).Add(time.Duration(r) * task.Every)))
			if err := openAndMigrate(ctx, fmt.Sprint(task.Path, r), task.Table); err != nil {
				fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Println("ok")
		}
		return nil
	}
	time.Sleep(time.Until(time.Unix(0, task.Start)))
	db, err := sqlite.Open(ctx, task.Path)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqlite.New(db, &sqlite.Config{Table: task.Table})
	if err != nil {
		return err
	}
	fx := testkit.Effects{DB: db, Table: `"` + task.Table + `_effects"`}
	g, err := idempotency.New(store, &idempotency.Config{WaitTimeout: 20 * time.Second})
	if err != nil {
		return err
	}
	switch task.Mode {
	case "hold":
		// fn writes its effect, says so, and blocks until the process is
		// killed: the key (and SQLite's write lock) stay held.
		_, err := g.Do(ctx, idempotency.Key{ID: task.Key}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			if err := fx.Effect(ctx, tx, task.Key); err != nil {
				return idempotency.Response{}, err
			}
			fmt.Println("holding")
			<-ctx.Done()
			return idempotency.Response{}, ctx.Err()
		})
		return fmt.Errorf("the holder's Do returned (%v) instead of blocking", err)
	case "calls":
		for _, r := range processCalls(ctx, g, fx, task.Keys, task.Callers) {
			fmt.Println(r)
		}
		fmt.Println("done")
		return nil
	}
	return fmt.Errorf("unknown mode %q", task.Mode)
}

// openAndMigrate is what a process starting on the file does: Open, New
// and Migrate.
func openAndMigrate(ctx context.Context, path, table string) error {
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqlite.New(db, &sqlite.Config{Table: table})
	if err != nil {
		return err
	}
	return store.Migrate(ctx)
}

// processCalls calls Do callers times on each of keys keys at once; fn
// writes one effect and answers with the pid of the process that ran it.
// Each result is a line "key body-in-hex" or "key error: ...".
func processCalls(ctx context.Context, g *idempotency.Guard[*sql.Tx], fx testkit.Effects, keys, callers int) []string {
	out := make([]string, keys*callers)
	testkit.Together(keys*callers, func(i int) {
		id := fmt.Sprint("k", i%keys)
		resp, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			if err := fx.Effect(ctx, tx, id); err != nil {
				return idempotency.Response{}, err
			}
			time.Sleep(5 * time.Millisecond) // the key stays held a while
			return idempotency.Response{Status: 201, Header: map[string][]string{"Pid": {fmt.Sprint(os.Getpid())}},
				Body: fmt.Appendf(nil, `{"key":%q,"pid":%d}`, id, os.Getpid())}, nil
		})
		if err != nil {
			out[i] = id + " error: " + strings.ReplaceAll(err.Error(), "\n", " ")
			return
		}
		out[i] = id + " " + hex.EncodeToString(fmt.Appendf(nil, "%d|%v|%s", resp.Status, resp.Header, resp.Body))
	})
	return out
}

// startChild starts a child process doing task; it is killed and waited for
// at the end of the test.
func startChild(t *testing.T, ctx context.Context, task childTask) *bufio.Scanner {
	t.Helper()
	raw, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	cmd, out := testkit.StartChild(t, ctx, childEnv+"="+string(raw))
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return bufio.NewScanner(out)
}

// processFixture is a database file with a keys table and an effects table,
// made by this process, for children to open too.
func processFixture(t *testing.T) (*fixture, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shared.db")
	db, err := sqlite.Open(testkit.Context(t, testTimeout), path)
	if err != nil {
		t.Fatal(err)
	}
	return newFixture(t, db, 0), path
}

// holdInChild starts a child that holds key (fn running, its effect
// written, SQLite's write lock taken) until it is killed; it returns once
// the child says it holds the key, and the function that kills it.
func holdInChild(t *testing.T, ctx context.Context, f *fixture, path, key string) (kill func()) {
	t.Helper()
	raw, err := json.Marshal(childTask{Mode: "hold", Path: path, Table: f.table, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	cmd, out := testkit.StartChild(t, ctx, childEnv+"="+string(raw))
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)
	if !testkit.WaitForLine(out, "holding", 20*time.Second) {
		t.Fatal("the child did not say it holds the key")
	}
	return kill
}

// TestProcessHeldKey: a key held by another process (its fn running, so
// SQLite's write lock held outside this process) behaves like a key held
// in this process: Do waits up to WaitTimeout and then returns
// ErrInProgress, not ErrStore; with NoWait it returns ErrInProgress at
// once; a key the other process does not hold meets the same write lock
// and is bounded by WaitTimeout too. Once the holder dies, the key runs
// once (the holder's effect was never committed).
func TestProcessHeldKey(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f, path := processFixture(t)
	kill := holdInChild(t, ctx, f, path, "held")
	const wait = 2 * time.Second
	const margin = 1500 * time.Millisecond

	call := func(cfg *idempotency.Config, id string) (time.Duration, error) {
		g := guard(t, f.store, cfg)
		start := time.Now()
		_, err := g.Do(ctx, idempotency.Key{ID: id}, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{Status: 201}, f.fx.Effect(ctx, tx, id)
		})
		return time.Since(start), err
	}
	for _, c := range []struct {
		name     string
		cfg      *idempotency.Config
		id       string
		min, max time.Duration
	}{
		{"WaitTimeout 2s", &idempotency.Config{WaitTimeout: wait}, "held", wait, wait + margin},
		{"NoWait", &idempotency.Config{WaitTimeout: -1}, "held", 0, 500 * time.Millisecond},
		{"WaitTimeout 1s, MaxRetries default", &idempotency.Config{WaitTimeout: time.Second}, "held", time.Second, time.Second + margin},
		{"another key, WaitTimeout 1s", &idempotency.Config{WaitTimeout: time.Second}, "other", time.Second, time.Second + margin},
		{"another key, NoWait", &idempotency.Config{WaitTimeout: -1}, "other", 0, 500 * time.Millisecond},
	} {
		took, err := call(c.cfg, c.id)
		t.Logf("%s, key %q: %v after %v", c.name, c.id, err, took)
		if !errors.Is(err, idempotency.ErrInProgress) || errors.Is(err, idempotency.ErrStore) || took < c.min || took > c.max {
			t.Errorf("%s, key %q: %v after %v; want ErrInProgress (not ErrStore) after %v..%v", c.name, c.id, err, took, c.min, c.max)
		}
	}
	// Callers of several keys at once in this process: one waits for the
	// lock, the others for the Store's write turn; all are told the same.
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: time.Second})
	ng := guard(t, f.store, &idempotency.Config{WaitTimeout: -1})
	const many = 4
	errs := make([]error, many)
	tookMany := make([]time.Duration, many)
	testkit.Together(many, func(i int) {
		start := time.Now()
		gi := g
		if i == many-1 {
			time.Sleep(200 * time.Millisecond) // the others are waiting by now
			gi = ng
		}
		_, errs[i] = gi.Do(ctx, idempotency.Key{ID: fmt.Sprint("many", i)}, "fp", mustNotRun)
		tookMany[i] = time.Since(start)
	})
	for i, err := range errs {
		t.Logf("caller %d of %d keys: %v after %v", i, many, err, tookMany[i])
		if !errors.Is(err, idempotency.ErrInProgress) || errors.Is(err, idempotency.ErrStore) || tookMany[i] > time.Second+margin {
			t.Errorf("caller %d of %d keys at once: %v after %v; want ErrInProgress (not ErrStore) within %v", i, many, err, tookMany[i], time.Second+margin)
		}
	}
	testkit.MustCount(t, ctx, f.fx.Count, "held", 0)

	kill()
	took, err := call(&idempotency.Config{WaitTimeout: wait}, "held")
	if err != nil || took > wait {
		t.Fatalf("after the holder died: %v after %v; want fn to run", err, took)
	}
	testkit.MustCount(t, ctx, f.fx.Count, "held", 1)
}

// TestProcessOpenRace: processes that open and migrate one fresh file at
// the same instant all succeed (switching it to WAL and creating the table
// race for SQLite's locks).
func TestProcessOpenRace(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	// procs processes race on each of rounds fresh files.
	procs, rounds := 8, 15
	if s := os.Getenv("IDEMPOTENCY_SQLITE_OPEN_RACE"); s != "" {
		_, _ = fmt.Sscanf(s, "%dx%d", &procs, &rounds)
	}
	path := filepath.Join(t.TempDir(), "fresh.db")
	start := time.Now().Add(time.Duration(procs)*50*time.Millisecond + 500*time.Millisecond).UnixNano()
	outs := make([]*bufio.Scanner, procs)
	for i := range outs {
		outs[i] = startChild(t, ctx, childTask{Mode: "open", Path: path, Table: "race_keys", Start: start, Rounds: rounds, Every: 100 * time.Millisecond})
	}
	failed := 0
	for i, out := range outs {
		for r := range rounds {
			line := ""
			if out.Scan() {
				line = out.Text()
			}
			if line != "ok" {
				failed++
				t.Logf("process %d, round %d: %q", i, r, line)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d start-ups (%d processes x %d fresh files) failed to open and migrate", failed, procs*rounds, procs, rounds)
	}
}

// TestProcessCallers: this process and a child call Do on the same keys
// at the same instant, several callers per key in each: one effect per
// key, and every caller of a key, in both processes, gets the same bytes.
func TestProcessCallers(t *testing.T) {
	ctx := testkit.Context(t, testTimeout)
	f, path := processFixture(t)
	const keys, callers = 8, 4
	start := time.Now().Add(time.Second)
	out := startChild(t, ctx, childTask{Mode: "calls", Path: path, Table: f.table, Start: start.UnixNano(), Keys: keys, Callers: callers})
	g := guard(t, f.store, &idempotency.Config{WaitTimeout: 20 * time.Second})
	time.Sleep(time.Until(start))
	mine := processCalls(ctx, g, f.fx, keys, callers)
	var theirs []string
	for out.Scan() && out.Text() != "done" {
		theirs = append(theirs, out.Text())
	}
	if len(theirs) != keys*callers {
		t.Fatalf("the child answered %d calls, want %d: %q", len(theirs), keys*callers, theirs)
	}
	bytesOf := map[string]string{}
	for _, line := range append(mine, theirs...) {
		id, got, _ := strings.Cut(line, " ")
		if strings.HasPrefix(got, "error:") {
			t.Errorf("key %s: %s", id, got)
			continue
		}
		if want, ok := bytesOf[id]; ok && want != got {
			a, _ := hex.DecodeString(want)
			b, _ := hex.DecodeString(got)
			t.Errorf("key %s: answers differ: %q and %q", id, a, b)
		}
		bytesOf[id] = got
	}
	for i := range keys {
		testkit.MustCount(t, ctx, f.fx.Count, fmt.Sprint("k", i), 1)
	}
}
