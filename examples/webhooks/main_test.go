package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
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

	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/internal/testkit/pgkit"
)

const (
	testProvider = "acme"
	testSecret   = "whsec_test"
)

var testSecrets = map[string][]byte{testProvider: []byte(testSecret)}

func TestWebhooksSQLite(t *testing.T) {
	runScenario(t, filepath.Join(t.TempDir(), "webhooks.db"), defaultTables)
}

func TestWebhooksPostgres(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	sfx := testkit.Name("")
	names := tables{Orders: "webhook_orders_" + sfx, Keys: "webhook_keys_" + sfx}
	pgkit.DropAtCleanup(t, dsn, "TABLE", `"`+names.Orders+`"`, `"`+names.Keys+`"`)
	runScenario(t, dsn, names)
}

// delivery is one signed webhook request.
type delivery struct {
	id   string
	body string
	sig  string // overrides the signature when set
}

func deliver(ctx context.Context, url string, d delivery) (int, error) {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/webhooks/"+testProvider, strings.NewReader(d.body))
	if err != nil {
		return 0, err
	}
	sig := d.sig
	if sig == "" {
		sig = "v1,bm90IGl0 " + sign([]byte(testSecret), d.id, ts, []byte(d.body)) // a rotated-out key first
	}
	req.Header.Set(headerID, d.id)
	req.Header.Set(headerTimestamp, ts)
	req.Header.Set(headerSignature, sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func eventBody(order int) string {
	return fmt.Sprintf(`{"type":"payment.succeeded","order":%d,"amount":1999}`, order)
}

func runScenario(t *testing.T, store string, names tables) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a, err := open(ctx, store, names, testSecrets, hooks{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	srv := httptest.NewServer(a.handler)
	defer srv.Close()
	effects := func(want int, when string) {
		t.Helper()
		n, err := a.effects(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("%s: %d effect rows, want %d", when, n, want)
		}
	}
	expect := func(d delivery, want int, when string) {
		t.Helper()
		code, err := deliver(ctx, srv.URL, d)
		if err != nil || code != want {
			t.Fatalf("%s: status %d, %v; want %d", when, code, err, want)
		}
	}

	// A forged delivery is refused before anything is stored: the genuine
	// one with the same id (another body) is then processed, not refused
	// as a reuse of the id.
	expect(delivery{id: "evt_A", body: eventBody(666), sig: sign([]byte("wrong"), "evt_A", "0", nil)}, http.StatusUnauthorized, "forged")
	expect(delivery{id: "evt_A", body: eventBody(1), sig: "v1," + strings.Repeat("A", 44)}, http.StatusUnauthorized, "bad signature")
	effects(0, "after forged deliveries")

	// The same event 20 times at once: one effect, 20 acknowledgements.
	const n = 20
	codes := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes[i], errs[i] = deliver(ctx, srv.URL, delivery{id: "evt_A", body: eventBody(1)}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || codes[i] != http.StatusNoContent {
			t.Fatalf("delivery %d: %d, %v; want 204", i, codes[i], errs[i])
		}
	}
	effects(1, "after 20 concurrent deliveries")
	expect(delivery{id: "evt_A", body: eventBody(2)}, http.StatusUnprocessableEntity, "same id, another payload")

	// A crash after the effect, before the commit: neither the effect nor
	// the key survive, and the next delivery runs the effect.
	crash(t, ctx, store, names, "before-commit", delivery{id: "evt_B", body: eventBody(2)})
	effects(1, "after a crash before the commit")
	for i := range n {
		wg.Go(func() { codes[i], errs[i] = deliver(ctx, srv.URL, delivery{id: "evt_B", body: eventBody(2)}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || codes[i] != http.StatusNoContent {
			t.Fatalf("redelivery %d: %d, %v; want 204", i, codes[i], errs[i])
		}
	}
	effects(2, "after redeliveries of the crashed event")

	// A crash after the commit, before the 2xx: the provider saw no
	// answer and delivers again; the effect is not repeated.
	crash(t, ctx, store, names, "after-commit", delivery{id: "evt_C", body: eventBody(3)})
	effects(3, "after a crash after the commit")
	expect(delivery{id: "evt_C", body: eventBody(3)}, http.StatusNoContent, "redelivery after the commit")
	effects(3, "after the redelivery of a committed event")
}

// crash runs the receiver in a child process (this test binary), sends it
// d, waits until it reaches the crash point and kills it (SIGKILL).
func crash(t *testing.T, ctx context.Context, store string, names tables, point string, d delivery) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "WEBHOOK_CHILD="+point, "WEBHOOK_STORE="+store,
		"WEBHOOK_ORDERS="+names.Orders, "WEBHOOK_KEYS="+names.Keys)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(result <-chan error) string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child ended early\n%s", stderr.String())
			}
			return l
		case err := <-result:
			t.Fatalf("the delivery ended before the crash point %s: %v", point, err)
		case <-ctx.Done():
			t.Fatalf("child: %v\n%s", ctx.Err(), stderr.String())
		}
		return ""
	}
	addr, ok := strings.CutPrefix(next(nil), "LISTEN ")
	if !ok {
		t.Fatalf("child did not announce its address\n%s", stderr.String())
	}
	result := make(chan error, 1)
	go func() {
		code, err := deliver(ctx, "http://"+addr, d)
		if err == nil {
			err = fmt.Errorf("got an answer, %d, from a process that crashed", code)
		}
		result <- err
	}()
	if got := next(result); got != "CRASH "+point {
		t.Fatalf("child said %q, want CRASH %s", got, point)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	if err := <-result; err == nil || strings.Contains(err.Error(), "got an answer") {
		t.Fatalf("the provider's delivery to the crashed receiver: %v", err)
	}
}

// TestMain runs the receiver process that crash kills when WEBHOOK_CHILD
// names a crash point, and the tests otherwise (saying first which server
// backends will not run, see testenv.Main).
func TestMain(m *testing.M) {
	if point := os.Getenv("WEBHOOK_CHILD"); point != "" {
		if err := receiverChild(point); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	testenv.Main(m, testenv.Postgres)
}

// receiverChild serves until it reaches the crash point, then blocks until
// it is killed.
func receiverChild(point string) error {
	stop := func() {
		fmt.Println("CRASH " + point)
		select {} // until killed
	}
	var h hooks
	switch point {
	case "before-commit":
		h.afterEffect = stop
	case "after-commit":
		h.afterCommit = stop
	default:
		return fmt.Errorf("unknown crash point %q", point)
	}
	ctx := context.Background()
	a, err := open(ctx, os.Getenv("WEBHOOK_STORE"), tables{Orders: os.Getenv("WEBHOOK_ORDERS"), Keys: os.Getenv("WEBHOOK_KEYS")}, testSecrets, h)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println("LISTEN " + lis.Addr().String())
	return http.Serve(lis, a.handler)
}
