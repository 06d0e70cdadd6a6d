package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/go-idempotency/idempotency"
)

// PauseEnv names the test hook: CHECKOUT_PAUSE_AT=POINT or POINT@N makes
// the service, the Nth time (1st by default) a run reaches POINT, print
// "paused POINT #<key hash>" on its standard output and block there, so
// that a test (or a person) can kill it at that instant with SIGKILL.
const PauseEnv = "CHECKOUT_PAUSE_AT"

// pausePoints are the points CHECKOUT_PAUSE_AT accepts, in the order a run
// reaches them.
var pausePoints = []string{
	"before:order",   // in the order step's transaction, before its insert
	"after:order",    // the order committed; the charge step starts
	"charge:send",    // the processor's request built, not sent
	"before:receipt", // charged; in the receipt step's transaction
	"after:receipt",  // the receipt committed; in Finish's transaction
	"after:finish",   // the answer committed, not yet sent to the client
}

// pauser is the hook: nil pauses nowhere.
type pauser struct {
	point string
	nth   int
	out   io.Writer
	stop  <-chan struct{} // closed at shutdown: a paused run then fails

	mu   sync.Mutex
	hits int
}

// errPaused is the error of a paused run released at shutdown.
var errPaused = errors.New("paused by " + PauseEnv)

// newPauser parses the value of PauseEnv; "" gives nil.
func newPauser(v string, out io.Writer, stop <-chan struct{}) (*pauser, error) {
	if v == "" {
		return nil, nil
	}
	point, n, hasN := strings.Cut(v, "@")
	nth := 1
	if hasN {
		var err error
		if nth, err = strconv.Atoi(n); err != nil || nth < 1 {
			return nil, fmt.Errorf("%s=%q: want POINT or POINT@N with N >= 1", PauseEnv, v)
		}
	}
	for _, p := range pausePoints {
		if p == point {
			return &pauser{point: point, nth: nth, out: out, stop: stop}, nil
		}
	}
	return nil, fmt.Errorf("%s=%q: unknown point; want one of %s", PauseEnv, v, strings.Join(pausePoints, ", "))
}

// at pauses the run of key if point is the hook's and this is its Nth hit.
// It blocks until shutdown, whatever the caller's context (the run must
// stay exactly there until the process is killed), then returns an error.
func (p *pauser) at(point string, key idempotency.Key) error {
	if p == nil || point != p.point {
		return nil
	}
	p.mu.Lock()
	p.hits++
	hit := p.hits == p.nth
	if hit {
		// Printed under the lock, whole, so that the reader sees one line.
		fmt.Fprintf(p.out, "paused %s %v\n", point, key)
	}
	p.mu.Unlock()
	if !hit {
		return nil
	}
	<-p.stop
	return errPaused
}
