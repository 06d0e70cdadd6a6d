// Command checkout is a checkout service whose one request is an
// operation of several steps that survives a crash between any two of
// them: see README.md.
//
// POST /checkout with an Idempotency-Key header and {"amount": <cents>,
// "email": "..."} runs the operation "checkout":
//
//  1. Local "order": the order row, in a transaction of the store;
//  2. Foreign "charge": POST /charges at the card processor, with a key
//     derived from the request's, so that a repeat is the same charge;
//  3. Local "receipt": the receipt row with the charge id (or, if the card
//     was declined, the order marked declined and a stored 402);
//  4. Finish: the receipt e-mail in the outbox, and the 201 answer, stored
//     with the key and replayed to every retry.
//
// A retry with the key resumes after the last step committed; a Completer
// in every process finishes the runs that nobody retries.
//
//	go run ./examples/checkout -processor-stub
//	curl -i -X POST localhost:8080/checkout -H 'Idempotency-Key: order-1' \
//	  -d '{"amount": 1999, "email": "ann@example.com"}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-idempotency/idempotency/examples/checkout/internal/processor"
)

// config is the service's flags.
type config struct {
	addr          string
	store         string
	prefix        string
	processor     string
	stub          bool
	stubDecline   int64
	lease         time.Duration
	chargeTimeout time.Duration
	grace         time.Duration
	interval      time.Duration
	logf          func(format string, args ...any) // nil: no logs
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "localhost:8080", "address to listen on")
	flag.StringVar(&cfg.store, "store", "checkout.db", "the store: a SQLite file (PATH.db, sqlite:PATH), postgres://... or mysql://... (or user@tcp(host)/db)")
	flag.StringVar(&cfg.prefix, "tables", "checkout_", "prefix of the service's tables (orders, receipts, outbox, keys)")
	flag.StringVar(&cfg.processor, "processor", "", "the card processor's base URL (POST URL/charges)")
	flag.BoolVar(&cfg.stub, "processor-stub", false, "start an in-process processor stub instead of -processor")
	flag.Int64Var(&cfg.stubDecline, "stub-decline", 666, "the amount the stub declines with 402")
	flag.DurationVar(&cfg.lease, "lease", 30*time.Second, "how long a run holds its key after each step (the Operation's Lease)")
	flag.DurationVar(&cfg.chargeTimeout, "charge-timeout", 10*time.Second, "timeout of a call to the processor (keep it under -lease)")
	flag.DurationVar(&cfg.grace, "grace", time.Minute, "how long after a run died the completer takes its key over")
	flag.DurationVar(&cfg.interval, "interval", 10*time.Second, "pause between two passes of the completer")
	flag.Parse()
	cfg.logf = log.Printf
	if err := run(cfg, os.Stdout, os.Getenv(PauseEnv)); err != nil {
		log.Fatal(err)
	}
}

// run serves until SIGINT or SIGTERM. Lines for a test or a person
// watching (where it listens, where a run paused) go to out; logs to
// standard error.
func run(cfg config, out io.Writer, pauseAt string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.logf == nil {
		cfg.logf = func(string, ...any) {}
	}
	if cfg.lease <= cfg.chargeTimeout {
		return fmt.Errorf("-lease %v must be longer than -charge-timeout %v: a run must hold its key longer than its slowest call", cfg.lease, cfg.chargeTimeout)
	}
	if cfg.stub == (cfg.processor != "") {
		return errors.New("give exactly one of -processor URL and -processor-stub")
	}
	pause, err := newPauser(pauseAt, out, ctx.Done())
	if err != nil {
		return err
	}
	if cfg.stub {
		url, closeStub, err := startStub(cfg.stubDecline)
		if err != nil {
			return err
		}
		defer closeStub()
		cfg.processor = url
		cfg.logf("checkout: processor stub on %s (declines amount %d)", url, cfg.stubDecline)
	}
	a, err := open(ctx, cfg.store, newTables(cfg.prefix), cfg, pause)
	if err != nil {
		return err
	}
	defer a.close()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.complete(ctx, cfg.grace, cfg.interval, cfg.logf)
	}()
	cfg.logf("checkout: store %s; completer grace %v, interval %v; lease %v", a.name, cfg.grace, cfg.interval, cfg.lease)
	fmt.Fprintf(out, "listening http://%s\n", ln.Addr())
	select {
	case err = <-errc:
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = srv.Shutdown(shutdown)
	}
	stop()
	<-done
	return err
}

// startStub serves a processor stub on a free loopback port.
func startStub(decline int64) (url string, closeStub func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	p := processor.New()
	p.Decline(decline)
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
