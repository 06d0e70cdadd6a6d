package historycheck

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/sqlite"
)

// killChildEnv makes TestKilledHistories the child that records calls on
// the SQLite file it names, streaming them, until it is killed.
const killChildEnv = "HISTORYCHECK_KILL_CHILD"

// event is one line the child prints: a call as it starts or returns.
type event struct {
	Done bool                    `json:"done"`
	Call conformance.HistoryCall `json:"call"`
}

// openSQLite opens the store and effects table on path, made if needed.
func openSQLite(t *testing.T, ctx context.Context, path string) (*sqlite.Store, sqlEffects) {
	t.Helper()
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS fx (tag TEXT)"); err != nil {
		t.Fatal(err)
	}
	return s, sqlEffects{db: db, table: "fx"}
}

// TestKilledHistories records histories in a child process that is
// killed (SIGKILL) at a moment drawn for each: every call the child had
// started and not returned is unknown. The parent then probes each key on
// the same SQLite file, counts its effects and checks the whole with
// porcupine.
func TestKilledHistories(t *testing.T) {
	if spec := os.Getenv(killChildEnv); spec != "" {
		killChild(t, spec)
		return
	}
	const kills = 12
	dir := t.TempDir()
	for n := uint64(1); n <= kills; n++ {
		path := filepath.Join(dir, fmt.Sprintf("k%d.db", n))
		h := killedHistory(t, path, n)
		res := Check(h, 10*time.Second)
		unknown := 0
		for _, c := range h.Calls {
			if c.Outcome == conformance.OutcomeUnknown {
				unknown++
			}
		}
		t.Logf("kill %d: %d calls (%d unknown), %d keys: ok %v, checked in %v", n, len(h.Calls), unknown, len(h.Effects), res.OK, res.Took)
		if !res.OK {
			for _, k := range res.Keys {
				t.Errorf("a rule broken after a kill:\n%s", Describe(h, k))
			}
		}
	}
}

// killedHistory runs one child on path, kills it after a number of calls
// drawn from n, and returns the history it recorded plus the probes.
func killedHistory(t *testing.T, path string, n uint64) conformance.History {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	openSQLite(t, ctx, path) // the file exists before the child opens it
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestKilledHistories$")
	cmd.Env = append(os.Environ(), killChildEnv+"="+path+","+strconv.FormatUint(n, 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	after := 4 + rand.New(rand.NewPCG(n, 7)).IntN(40) // started calls before the kill
	calls := map[string]conformance.HistoryCall{}
	var order []string
	started := 0
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	killed := false
	for sc.Scan() {
		var ev event
		if !strings.HasPrefix(sc.Text(), "{") || json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		id := ev.Call.Key + "/" + string(ev.Call.Would)
		if _, ok := calls[id]; !ok {
			order = append(order, id)
		}
		if !ev.Done {
			ev.Call.Outcome, ev.Call.Return = conformance.OutcomeUnknown, -1
			ev.Call.ErrKind = "killed"
			started++
		}
		calls[id] = ev.Call
		if !killed && started >= after {
			killed = true
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	_ = cmd.Wait()
	if !killed {
		t.Fatalf("kill %d: the child ended after %d calls, before its kill", n, started)
	}
	h := conformance.History{Store: "sqlite (killed)", Number: n, Fault: "SIGKILL after " + strconv.Itoa(after) + " calls", Effects: map[string]int{}}
	for _, id := range order {
		c := calls[id]
		h.Ended = max(h.Ended, c.Call+1, c.Return+1)
		h.Calls = append(h.Calls, c)
	}
	store, fx := openSQLite(t, ctx, path)
	g, err := idempotency.New[*sql.Tx](store, &idempotency.Config{WaitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	at := h.Ended + 1
	keys := map[string]bool{}
	for _, c := range h.Calls {
		if keys[c.Key] {
			continue
		}
		keys[c.Key] = true
		probe := conformance.HistoryCall{Client: 99, Key: c.Key, Would: []byte("probe"), Probe: true, Call: at, Return: at + 1}
		at += 2
		errProbe := errors.New("probe: the key is free")
		resp, err := g.Do(ctx, idempotency.Key{Scope: "history", ID: c.Key}, "fp", func(*sql.Tx) (idempotency.Response, error) {
			return idempotency.Response{}, errProbe
		})
		switch {
		case err == nil:
			probe.Outcome, probe.Status, probe.Body, probe.Replayed = conformance.OutcomeOK, resp.Status, resp.Body, resp.Replayed
		case errors.Is(err, errProbe):
			probe.Outcome = conformance.OutcomeFailed
		default:
			t.Fatalf("kill %d: probe of %s: %v", n, c.Key, err)
		}
		h.Calls = append(h.Calls, probe)
		cnt, err := fx.count(ctx, c.Key)
		if err != nil {
			t.Fatal(err)
		}
		h.Effects[c.Key] = cnt
	}
	return h
}

// killChild records histories on the file spec names until it is killed,
// printing each call as a line of JSON.
func killChild(t *testing.T, spec string) {
	path, num, _ := strings.Cut(spec, ",")
	n, _ := strconv.ParseUint(num, 10, 64)
	ctx := context.Background()
	store, fx := openSQLite(t, ctx, path)
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	f := conformance.Fixture[*sql.Tx]{Store: store, Effect: fx.effect, Count: fx.count}
	rig := &conformance.HistoryRig[*sql.Tx]{Store: "sqlite", Faulty: f, Clean: f,
		OnCall: func(c conformance.HistoryCall, done bool) {
			mu.Lock()
			defer mu.Unlock()
			_ = enc.Encode(event{Done: done, Call: c})
		}}
	for i := n * 1000; ; i++ {
		if _, err := rig.Record(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
}
