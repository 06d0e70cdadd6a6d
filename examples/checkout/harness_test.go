package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/examples/checkout/internal/processor"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
	"github.com/go-idempotency/idempotency/mysql"
)

// TestMain says which server backends will not run, and removes the
// service binary the tests built. Unless -parallel is given, it runs 8
// parallel tests (not GOMAXPROCS): the crash cases spend their time waiting
// for processes and leases, not computing.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	code := func() int {
		defer func() {
			if bin.dir != "" {
				os.RemoveAll(bin.dir)
			}
		}()
		testenv.Main(m, testenv.Postgres, testenv.MySQL)
		return 0
	}()
	os.Exit(code)
}

// bin is the service binary, built once for every test of the package.
var bin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// serviceBinary builds the service with -race (once) and returns its path.
func serviceBinary(t *testing.T) string {
	t.Helper()
	bin.once.Do(func() {
		start := time.Now()
		bin.dir, bin.err = os.MkdirTemp("", "checkout-bin")
		if bin.err != nil {
			return
		}
		bin.path = filepath.Join(bin.dir, "checkout")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-race", "-o", bin.path, ".").CombinedOutput()
		if err != nil {
			bin.err = fmt.Errorf("go build -race: %w\n%s", err, out)
			return
		}
		t.Logf("built the service with -race in %v", time.Since(start).Round(time.Millisecond))
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// storeKind is one SQL store the service runs on in the tests.
type storeKind struct {
	name string
	// dsn returns the -store value of a fresh database for the tables
	// named by prefix, dropped when t ends.
	dsn func(t *testing.T, prefix string) string
}

var storeKinds = []storeKind{
	{"SQLite", func(t *testing.T, _ string) string { return filepath.Join(t.TempDir(), "checkout.db") }},
	{"PostgreSQL", func(t *testing.T, prefix string) string {
		dsn := testenv.PostgresDSN(t)
		n := newTables(prefix)
		pgkit.DropAtCleanup(t, dsn, "TABLE", n.Orders, n.Receipts, n.Outbox, n.Keys)
		return dsn
	}},
	{"MySQL", func(t *testing.T, prefix string) string {
		dsn := testenv.MySQLDSN(t)
		n := newTables(prefix)
		t.Cleanup(func() { dropMySQL(t, dsn, n.Orders, n.Receipts, n.Outbox, n.Keys) })
		return dsn
	}},
}

func dropMySQL(t *testing.T, dsn string, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := mysql.Open(ctx, dsn)
	if err != nil {
		t.Errorf("drop %v: %v", names, err)
		return
	}
	defer db.Close()
	for _, n := range names {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+n); err != nil {
			t.Errorf("drop %s: %v", n, err)
		}
	}
}

// fixture is one run of the service's tables on a store, with a processor
// stub and a view of the store from the test process.
type fixture struct {
	t      *testing.T
	dsn    string
	prefix string
	proc   *processor.Processor
	stub   *httptest.Server
	app    *app // the test's own view: counts and stored answers
}

func newFixture(t *testing.T, ctx context.Context, sk storeKind) *fixture {
	t.Helper()
	prefix := testkit.Name("ck_") + "_"
	f := &fixture{t: t, prefix: prefix, dsn: sk.dsn(t, prefix), proc: processor.New()}
	f.stub = httptest.NewServer(f.proc)
	t.Cleanup(f.stub.Close)
	a, err := open(ctx, f.dsn, newTables(prefix), config{lease: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	f.app = a
	return f
}

// instance is one process of the service.
type instance struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string
	marks  chan string // the "paused ..." lines
	logs   *os.File
	waited chan struct{}
}

// serviceOpts are the flags of one process.
type serviceOpts struct {
	addr    string // default 127.0.0.1:0
	pauseAt string
	grace   time.Duration // default a minute: clients first
}

// Timings of the services the tests run.
const (
	testLease    = time.Second
	chargeTimout = 800 * time.Millisecond
)

// start starts a process of the service on f's store and waits until it
// listens.
func (f *fixture) start(ctx context.Context, o serviceOpts) *instance {
	t := f.t
	t.Helper()
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	if o.grace == 0 {
		o.grace = time.Minute
	}
	logs, err := os.CreateTemp(t.TempDir(), "service-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(serviceBinary(t), "-addr", o.addr, "-store", f.dsn, "-tables", f.prefix,
		"-processor", f.stub.URL, "-lease", testLease.String(), "-charge-timeout", chargeTimout.String(),
		"-grace", o.grace.String(), "-interval", "100ms")
	cmd.Env = append(os.Environ(), PauseEnv+"="+o.pauseAt)
	cmd.Stderr = logs
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &instance{t: t, cmd: cmd, marks: make(chan string, 8), logs: logs, waited: make(chan struct{})}
	t.Cleanup(func() {
		s.kill()
		// The binary is built with -race: a race it saw fails the test,
		// even if it was killed before it could exit with status 66.
		if l := s.log(); strings.Contains(l, "WARNING: DATA RACE") {
			t.Errorf("the race detector reported in the service:\n%s", l)
		}
	})
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if u, ok := strings.CutPrefix(line, "listening "); ok {
				listening <- u
			} else if strings.HasPrefix(line, "paused ") {
				s.marks <- line
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(s.waited)
	}()
	select {
	case s.url = <-listening:
	case <-s.waited:
		t.Fatalf("the service exited before it listened:\n%s", s.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("the service did not listen in 60s:\n%s", s.log())
	case <-ctx.Done():
		t.Fatalf("the service did not listen: %v\n%s", ctx.Err(), s.log())
	}
	return s
}

// kill sends SIGKILL and waits for the process to end.
func (s *instance) kill() {
	select {
	case <-s.waited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.waited
}

// stop ends the process with SIGTERM (SIGKILL after 10s) and reports an
// exit other than a clean one.
func (s *instance) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.waited:
		if !s.cmd.ProcessState.Success() {
			s.t.Errorf("the service exited with %v:\n%s", s.cmd.ProcessState, s.log())
		}
	case <-time.After(10 * time.Second):
		s.t.Errorf("the service did not stop in 10s after SIGTERM")
		s.kill()
	}
}

// log returns what the process logged.
func (s *instance) log() string {
	b, _ := os.ReadFile(s.logs.Name())
	return string(b)
}

// waitMark waits for a "paused POINT KEY" line.
func (s *instance) waitMark(ctx context.Context, point string, key idempotency.Key, d time.Duration) {
	s.t.Helper()
	want := "paused " + point + " " + key.String()
	select {
	case got := <-s.marks:
		if got != want {
			s.t.Fatalf("got %q, want %q", got, want)
		}
	case <-time.After(d):
		s.t.Fatalf("no %q in %v:\n%s", want, d, s.log())
	case <-ctx.Done():
		s.t.Fatalf("no %q: %v", want, ctx.Err())
	}
}

// answer is what a client got for one request: a status and body, or a
// transport error.
type answer struct {
	status int
	body   []byte
	err    error
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, a.body)
}

// final reports whether a is a stored answer: the receipt or the decline.
func (a answer) final() bool { return a.err == nil && (a.status == 201 || a.status == 402) }

// allowed reports whether a is an answer a client may get on its way to
// the stored one: 409 (the key is leased to a run, maybe a dead one),
// 503 (the run stopped at a step: retry), or a transport error of a
// killed or not yet started process. A process killed right after it
// accepted the connection, before it read the request, closes it with
// nothing written back, which net/http reports with an unexported error
// that only its text names.
func (a answer) allowed() bool {
	if a.err == nil {
		return a.final() || a.status == http.StatusConflict || a.status == http.StatusServiceUnavailable
	}
	return errors.Is(a.err, syscall.ECONNREFUSED) || errors.Is(a.err, syscall.ECONNRESET) ||
		errors.Is(a.err, io.EOF) || errors.Is(a.err, io.ErrUnexpectedEOF) ||
		strings.Contains(a.err.Error(), "server closed idle connection")
}

// post sends one checkout.
func post(ctx context.Context, url, key string, amount int64) answer {
	body := fmt.Sprintf(`{"amount": %d, "email": "ann@example.com"}`, amount)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/checkout", strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{err: err}
	}
	return answer{status: resp.StatusCode, body: b}
}

// noKeepAlive opens a connection per request, so that no request goes to
// a connection of a killed process.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 45 * time.Second}

// freeAddr returns a loopback address with a port free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// keyOf is the service's key for an Idempotency-Key header.
func keyOf(id string) idempotency.Key { return idempotency.Key{Scope: scope, ID: id} }

// checkKey asserts what the store, the tables and the processor hold for
// one finished key, and that every answer the client got was allowed and,
// if final, the stored one byte for byte. declined says whether the
// processor declines its amount.
func (f *fixture) checkKey(ctx context.Context, id string, declined bool, answers []answer) {
	t := f.t
	t.Helper()
	key := keyOf(id)
	info, err := f.app.inspect(ctx, key)
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	wantStatus, wantOrders, wantReceipts, wantEvents, wantStatusRow := 201, 1, 1, 1, "paid"
	if declined {
		wantStatus, wantReceipts, wantEvents, wantStatusRow = 402, 0, 0, "declined"
	}
	if info.State != idempotency.KeyCompleted || info.Status != wantStatus {
		t.Errorf("key %s: %v with status %d (step %q, failure %q); want completed with %d", id, info.State, info.Status, info.Step, info.Failure, wantStatus)
	}
	status, reply, charged := f.proc.Answer(key.Derive("charge"))
	switch {
	case !charged:
		t.Errorf("key %s: the processor has no charge for the derived key", id)
	case declined && status != 402, !declined && status != 201:
		t.Errorf("key %s: the processor answered %d %s", id, status, reply)
	case !declined && !bytes.Contains(info.Body, []byte(`"charge_id":"`+chargeID(t, reply)+`"`)):
		t.Errorf("key %s: the stored answer %s does not name the processor's charge %s", id, info.Body, reply)
	}
	for _, c := range []struct {
		what  string
		query string
		arg   any
		want  int
	}{
		{"orders", "SELECT count(*) FROM " + newTables(f.prefix).Orders + " WHERE key_hash = ?", key.Hash(), wantOrders},
		{"orders " + wantStatusRow, "SELECT count(*) FROM " + newTables(f.prefix).Orders + " WHERE key_hash = ? AND status = '" + wantStatusRow + "'", key.Hash(), wantOrders},
		{"receipts", "SELECT count(*) FROM " + newTables(f.prefix).Receipts + " WHERE key_hash = ?", key.Hash(), wantReceipts},
		{"outbox events", "SELECT count(*) FROM " + newTables(f.prefix).Outbox + " WHERE msg_id = ?", key.Derive("outbox", "receipt-email"), wantEvents},
	} {
		n, err := f.app.count(ctx, c.query, c.arg)
		if err != nil {
			t.Fatalf("count %s: %v", c.what, err)
		}
		if n != c.want {
			t.Errorf("key %s: %d %s, want %d", id, n, c.what, c.want)
		}
	}
	for i, a := range answers {
		switch {
		case !a.allowed():
			t.Errorf("key %s: answer %d of %d is not allowed: %v", id, i+1, len(answers), a)
		case a.final() && (a.status != info.Status || !bytes.Equal(a.body, info.Body)):
			t.Errorf("key %s: answer %d of %d is %v, not the stored %d %s", id, i+1, len(answers), a, info.Status, info.Body)
		}
	}
}

func chargeID(t *testing.T, reply []byte) string {
	_, rest, ok := bytes.Cut(reply, []byte(`"id":"`))
	id, _, ok2 := bytes.Cut(rest, []byte(`"`))
	if !ok || !ok2 {
		t.Errorf("unreadable charge %s", reply)
	}
	return string(id)
}

// untilFinal retries a checkout every 50ms until it gets a stored answer,
// and returns every answer it got.
func untilFinal(ctx context.Context, url, id string, amount int64) []answer {
	var got []answer
	for {
		a := post(ctx, url, id, amount)
		got = append(got, a)
		if a.final() || !a.allowed() || ctx.Err() != nil {
			return got
		}
		select {
		case <-ctx.Done():
			return got
		case <-time.After(50 * time.Millisecond):
		}
	}
}
