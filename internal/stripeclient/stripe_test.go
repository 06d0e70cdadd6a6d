package stripeclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/observe"
	"github.com/go-idempotency/idempotency/postgres"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Postgres) }

// line is one call of the SDK as node/client.mjs reports it.
type line struct {
	Scenario string `json:"scenario"`
	I        int    `json:"i"`
	Key      string `json:"key"`
	OK       bool   `json:"ok"`
	ID       string `json:"id"`
	IDEcho   string `json:"idEcho"`
	Status   int    `json:"status"`
	Type     string `json:"type"`
	RawType  string `json:"rawType"`
	Code     string `json:"code"`
	Message  string `json:"message"`
	Attempts int    `json:"attempts"`
	Summary  bool   `json:"summary"`
}

// sdkDir is the folder of the Node script; npm ci installs the SDK there.
const sdkDir = "node"

// nodeOrSkip returns the node binary, or skips the test (fails it under
// IDEMPOTENCY_REQUIRE_ALL=1) when node or the installed SDK is missing.
func nodeOrSkip(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(sdkDir, "node_modules", "stripe", "package.json"))
	}
	if err != nil {
		msg := fmt.Sprintf("the Stripe Node SDK cannot run (%v): install node and run npm ci in internal/stripeclient/node", err)
		if testenv.RequireAll() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return node
}

// accounts maps the SDK's API keys to scopes: the test's key is an account,
// a revoked key is refused with a 401 problem.
func scope(r *http.Request) (string, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer sk_test_stripeclient":
		return "acct_stripeclient", nil
	}
	return "", &idemhttp.Problem{Type: "about:blank", Title: "Invalid API key", Status: http.StatusUnauthorized,
		Detail: "The API key is unknown or revoked.", Header: http.Header{"Www-Authenticate": {`Bearer realm="stripeclient"`}}}
}

// holds tells when the handler holds a key: GET /test/held/{key} answers
// once a "slow" request of that key has reached the handler, so that the
// script sends its second call while the first holds the key.
type holds struct{ m sync.Map } // key id -> *hold

type hold struct {
	once sync.Once
	c    chan struct{}
}

func (h *holds) get(id string) *hold {
	v, _ := h.m.LoadOrStore(id, &hold{c: make(chan struct{})})
	return v.(*hold)
}

// enter marks the key id held.
func (h *holds) enter(id string) {
	x := h.get(id)
	x.once.Do(func() { close(x.c) })
}

func (h *holds) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-h.get(r.PathValue("key")).c:
		w.WriteHeader(http.StatusNoContent)
	case <-time.After(20 * time.Second):
		w.WriteHeader(http.StatusGatewayTimeout)
	case <-r.Context().Done():
	}
}

// customers is POST /v1/customers: one row per customer, inserted through
// the middleware's transaction. The name "silent" answers nothing (500
// ProblemNoResponse); "slow" holds the key for 4 s.
func customers(table string, held *holds) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tx, ok := idempotency.TxFrom[pgx.Tx](r.Context())
		key, kok := idempotency.KeyFrom(r.Context())
		if !ok || !kok {
			http.Error(w, "unguarded", http.StatusInternalServerError)
			return
		}
		if err := r.ParseForm(); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		name := r.PostForm.Get("name")
		switch name {
		case "silent":
			return
		case "slow":
			held.enter(key.ID)
			select {
			case <-time.After(4 * time.Second):
			case <-r.Context().Done():
				return
			}
		}
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO `+table+` (key_id, name, params) VALUES ($1, $2, $3) RETURNING id`,
			key.ID, name, r.PostForm.Encode()).Scan(&id); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"type":"api_error","message":"insert failed"}}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "cus_" + strconv.FormatInt(id, 10), "object": "customer",
			"name": name, "email": r.PostForm.Get("email")})
	}
}

// outcomes counts the middleware's answers by outcome.
type outcomes struct {
	mu sync.Mutex
	n  map[observe.Outcome]int
}

func (o *outcomes) observe(_ context.Context, ev idemhttp.RequestEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[observe.Outcome]int{}
	}
	o.n[ev.Outcome]++
}

// serve mounts POST /v1/customers on g with the Stripe-compatible
// configuration the docs recommend.
func serve(t *testing.T, g *idempotency.Guard[pgx.Tx], table string, seen *outcomes) *httptest.Server {
	held := &holds{}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/customers", idemhttp.Middleware(g, &idemhttp.Options{
		Scope:         scope,
		RenderProblem: idemhttp.WriteStripeError,
		EchoKey:       true,
		Observer:      seen.observe,
	})(customers(table, held)))
	mux.Handle("GET /test/held/{key}", held)
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func calls(t *testing.T) int {
	if v := os.Getenv("STRIPECLIENT_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			t.Fatalf("STRIPECLIENT_CALLS=%q: want a number of calls, at least 10", v)
		}
		return n
	}
	return 300
}

// TestStripeNodeSDK drives the official Stripe Node SDK (npm stripe 23.x)
// against idemhttp on PostgreSQL, through a proxy that drops, delays,
// truncates and resets a third of the requests. No key may have two rows;
// every error the server answers must reach the SDK as an error.
func TestStripeNodeSDK(t *testing.T) {
	node := nodeOrSkip(t)
	dsn := testenv.PostgresDSN(t)
	ctx := testkit.Context(t, 5*time.Minute)
	rig := pgkit.NewRig(t, ctx, dsn, "stripeclient_", "customers",
		"id BIGSERIAL PRIMARY KEY, key_id TEXT NOT NULL, name TEXT NOT NULL, params TEXT NOT NULL")
	pool, store, keys, rows := rig.Pool, rig.Store, rig.Keys, rig.Rows
	guard := func(s idempotency.KeyStore[pgx.Tx], wait time.Duration) *idempotency.Guard[pgx.Tx] {
		g, err := idempotency.New(s, &idempotency.Config{WaitTimeout: wait})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// A store that fails: its pool is closed.
	closed, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	downStore, err := postgres.New(closed, &postgres.Config{Table: keys})
	if err != nil {
		t.Fatal(err)
	}

	var seen outcomes
	quick := serve(t, guard(store, 150*time.Millisecond), rows, &seen)
	patient := serve(t, guard(store, 10*time.Second), rows, &seen)
	down := serve(t, guard(downStore, 0), rows, &seen)
	faults := NewProxy(quick.URL, 0.35, 300*time.Millisecond, 20261205)
	faulty := httptest.NewServer(faults)
	t.Cleanup(faulty.Close)
	clean := httptest.NewServer(NewProxy(quick.URL, 0, 0, 1))
	t.Cleanup(clean.Close)

	n := calls(t)
	plan, _ := json.Marshal(map[string]any{"faulty": faulty.URL, "clean": clean.URL, "patient": patient.URL, "down": down.URL,
		"calls": n, "concurrency": 8})
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = sdkDir
	cmd.Stdin = bytes.NewReader(plan)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs: %v\nstderr:\n%s", err, stderr.String())
	}

	lines, summary := parse(t, stdout.Bytes())
	checkRows(t, ctx, pool, rows, lines)
	checkErrors(t, lines)
	counts := faults.Counts()
	injected := 0
	for f, c := range counts {
		if f != None {
			injected += c
		}
	}
	total, failed := 0, map[string]int{}
	for _, ls := range lines {
		total += len(ls)
		for _, l := range ls {
			if !l.OK {
				failed[l.Type]++
			}
		}
	}
	t.Logf("SDK calls: %d, errors thrown by type: %v", total, failed)
	seen.mu.Lock()
	t.Logf("SDK attempts %d; faults injected %d of %d proxied requests %v; middleware outcomes %v",
		summary.Attempts, injected, injected+counts[None], counts, seen.n)
	seen.mu.Unlock()
	if injected == 0 {
		t.Error("the proxy injected no fault")
	}
}

// parse reads the script's lines; the last one is the summary.
func parse(t *testing.T, out []byte) (map[string][]line, line) {
	t.Helper()
	by := map[string][]line{}
	var summary line
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("script output %q: %v", sc.Text(), err)
		}
		if l.Summary {
			summary = l
			continue
		}
		by[l.Scenario] = append(by[l.Scenario], l)
	}
	if !summary.Summary {
		t.Fatalf("the script did not finish; output:\n%s", out)
	}
	return by, summary
}

// checkRows: no key has two rows; every load call has exactly one after
// the reconciliation, and a call the SDK reported as a success names its
// key's row.
func checkRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table string, lines map[string][]line) {
	t.Helper()
	idOf := map[string]string{}
	dups := 0
	r, err := pool.Query(ctx, `SELECT key_id, count(*), min(id) FROM `+table+` GROUP BY key_id`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var k string
		var c, id int64
		if err := r.Scan(&k, &c, &id); err != nil {
			t.Fatal(err)
		}
		if c > 1 {
			dups++
			t.Errorf("key %s: %d rows", k, c)
		}
		idOf[k] = "cus_" + strconv.FormatInt(id, 10)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("duplicates: %d (keys with more than one row, of %d keys with a row)", dups, len(idOf))
	failed := 0
	for _, l := range append(lines["load"], lines["reconcile"]...) {
		if !l.OK {
			failed++
			continue
		}
		if l.ID == "" || l.ID != idOf[l.Key] {
			t.Errorf("%s %d: SDK result id %q, the key's row %q", l.Scenario, l.I, l.ID, idOf[l.Key])
		}
		if l.IDEcho != l.Key {
			t.Errorf("%s %d: echoed key %q, want %q", l.Scenario, l.I, l.IDEcho, l.Key)
		}
	}
	for _, l := range lines["load"] {
		if _, ok := idOf[l.Key]; !ok {
			t.Errorf("load %d: no row after the reconciliation", l.I)
		}
	}
	t.Logf("load calls that failed through the faults and were reconciled: %d", len(lines["reconcile"]))
}

// want is what one error scenario must give the SDK.
type want struct {
	typ, rawType, code string
	status, attempts   int
	echo               bool
}

// checkErrors: every call that should fail threw, with its status, type
// and code; the load calls failed only with connection errors.
func checkErrors(t *testing.T, lines map[string][]line) {
	t.Helper()
	for _, l := range lines["load"] {
		if !l.OK && l.Type != "StripeConnectionError" && !(l.Type == "StripeAPIError" && strings.Contains(l.Message, "Invalid JSON")) {
			t.Errorf("load %d: %s %d %q: only the faults may fail a call", l.I, l.Type, l.Status, l.Message)
		}
	}
	for _, l := range lines["reconcile"] {
		if !l.OK {
			t.Errorf("reconcile %d: %s %d %q", l.I, l.Type, l.Status, l.Message)
		}
	}
	for _, l := range lines["reuse-under-faults"] {
		if l.OK || (l.Type != "StripeConnectionError" && (l.Status != 422 || l.Code != "idempotency_key_reused")) {
			t.Errorf("reuse under faults %d: %+v; want 422 idempotency_key_reused (or a connection error)", l.I, l)
		}
	}
	if len(lines["reuse-under-faults"]) == 0 {
		t.Error("no key was reused under faults")
	}
	for scenario, w := range map[string]want{
		"reuse":        {"StripeAPIError", "idempotency_error", "idempotency_key_reused", 422, 1, true},
		"bad-key":      {"StripeInvalidRequestError", "invalid_request_error", "idempotency_key_invalid", 400, 1, false},
		"unauthorized": {"StripeAuthenticationError", "authentication_error", "", 401, 1, true},
		"no-response":  {"StripeAPIError", "api_error", "no_response", 500, 1, true},
		"store-down":   {"StripeAPIError", "api_error", "idempotency_store_unavailable", 503, 3, true},
		"held":         {"StripeAPIError", "idempotency_error", "idempotency_key_in_use", 409, 3, true},
	} {
		ls := lines[scenario]
		if len(ls) != 1 {
			t.Errorf("%s: %d calls reported", scenario, len(ls))
			continue
		}
		l := ls[0]
		if l.OK || l.Type != w.typ || l.RawType != w.rawType || l.Code != w.code || l.Status != w.status {
			t.Errorf("%s: %+v; want %s %d %s %q", scenario, l, w.typ, w.status, w.rawType, w.code)
		}
		if (l.IDEcho == l.Key) != w.echo {
			t.Errorf("%s: echoed key %q (want it: %v)", scenario, l.IDEcho, w.echo)
		}
		if got := l.Attempts; got != w.attempts {
			t.Errorf("%s: %d attempts, want %d", scenario, got, w.attempts)
		}
	}
	for _, scenario := range []string{"held", "held-patient"} {
		first, after := one(t, lines, scenario+"-first"), one(t, lines, scenario+"-after")
		if !first.OK || !after.OK || first.ID == "" || after.ID != first.ID {
			t.Errorf("%s: first %+v, after %+v; want one customer, replayed", scenario, first, after)
		}
	}
	if p := one(t, lines, "held-patient"); !p.OK || p.ID != one(t, lines, "held-patient-first").ID {
		t.Errorf("held-patient: %+v; a Guard that waits answers the second call with the first one's customer", p)
	}
	if f := one(t, lines, "first"); !f.OK {
		t.Errorf("first: %+v", f)
	}
}

func one(t *testing.T, lines map[string][]line, scenario string) line {
	t.Helper()
	if len(lines[scenario]) != 1 {
		t.Errorf("%s: %d calls reported", scenario, len(lines[scenario]))
		return line{}
	}
	return lines[scenario][0]
}
